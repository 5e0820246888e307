"""The CosyVoice3 stages (each a tritontts.serving.stage class named by its config.pbtxt):

  cosyvoice3_prompt   CosyVoice3PromptStage  text + reference -> talker prompts, voice prompt
  cosyvoice3_talker   CosyVoice3TalkerStage  vLLM speech tokens, one response per hop
  cosyvoice3_flow     CosyVoice3FlowStage    tokens so far -> their mel
  cosyvoice3_hift     CosyVoice3HiftStage    mel so far -> the audio not sent yet

The checkpoint path comes from the launcher (`--checkpoint cosyvoice3=DIR`, passed to the
stages as TRITONTTS_COSYVOICE3_CHECKPOINT); tests hand a checkpoint in directly.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator

import numpy as np
import torch

from ... import sampling
from ...sampling import SAMPLING
from ...protocol import (
    AUDIO, IS_FINAL, PARAMS, SAMPLE_RATE, STREAM_ID, InvalidRequest, decode_params)
from ...serving.stage import (
    PREPARES_REQUESTS, GroupedStage, Inputs, Stage, StageContext, begin_request, default_voice_only)
from ...text import normalize, split_sentences
from ...engine.vllm_talker import TOKEN_BUDGET, TokenBudget, VllmTalkerStage
from .checkpoint import CosyVoice3Checkpoint
from .family import FAMILY
from .hops import HopSchedule, TokenChunk, TokenChunker
from .prompt import PromptExtractor, VoicePrompt
from .request import parse_cosyvoice3_params
from ...nn.ras import ras_extra_args
from .talker import SPEECH_VOCAB, TalkerVocab, ensure_talker_checkpoint, load_talker_vocab

MIN_TOKEN_TEXT_RATIO, MAX_TOKEN_TEXT_RATIO = 2, 20   # upstream's generation length bounds
SEGMENT_TEXT_TOKENS = 80      # like upstream, long input is spoken segment by segment
TOKEN_MEL_RATIO = 2
SAMPLES_PER_FRAME = 480                               # 24 kHz audio, 50 Hz mel


def load_flow(checkpoint: CosyVoice3Checkpoint):
    """The flow (token embedding, lookahead encoder, CFM with its DiT) in eval mode."""
    from .flow import build_flow, load_flow_state_dict

    flow = build_flow(checkpoint.config["flow"])
    load_flow_state_dict(flow, checkpoint.state_dict("flow.pt"))
    return flow.eval()


def load_hift(checkpoint: CosyVoice3Checkpoint):
    """The CausalHiFT vocoder in eval mode."""
    from ...nn.hift import HiFTGenerator, load_hift_state_dict

    hift = HiFTGenerator.from_config(checkpoint.config["hift"])
    load_hift_state_dict(hift, checkpoint.state_dict("hift.pt"))
    return hift.eval()


def export_graphs(checkpoint: CosyVoice3Checkpoint) -> list:
    """The networks the flow and hift stages may run on onnxruntime / TensorRT."""
    from .flow import velocity_graph
    from ...nn.hift import spectrum_graph

    return [velocity_graph(load_flow(checkpoint).decoder.estimator),
            spectrum_graph(load_hift(checkpoint))]


@dataclass(frozen=True)
class Segment:
    """One talker generation: the voice prompt plus a stretch of the input text."""
    prompt_ids: list[int]
    min_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class TalkJob:
    segments: list[Segment]
    prompt: VoicePrompt


class CosyVoice3PromptStage(Stage):
    """Text ids per segment, and the reference's speech tokens, speaker embedding and
    prompt mel (cached by content)."""

    one_by_one = PREPARES_REQUESTS

    def __init__(self, context: StageContext, checkpoint: CosyVoice3Checkpoint | None = None):
        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.extractor = PromptExtractor(checkpoint)
        text_config = json.loads((checkpoint.text_model_dir / "config.json").read_text())
        self.vocab = TalkerVocab(speech_offset=int(text_config["vocab_size"]))

    def run(self, inputs: Inputs) -> dict[str, Any]:
        start = begin_request(inputs, parse_cosyvoice3_params)
        job = self.prepare(start.text, start.voice, start.params)
        return {
            "prompt_ids": [i for seg in job.segments for i in seg.prompt_ids],
            "segment_lengths": [len(seg.prompt_ids) for seg in job.segments],
            "min_tokens": [seg.min_tokens for seg in job.segments],
            "max_tokens": [seg.max_tokens for seg in job.segments],
            TOKEN_BUDGET: start.params.max_new_tokens or 0,       # 0: each segment's own cap
            "seed": start.seed,
            SAMPLING: sampling.encode(start.params.sampling),
            "prompt_tokens": job.prompt.speech_tokens,
            "prompt_mel": job.prompt.mel,
            "embedding": job.prompt.embedding,
            STREAM_ID: start.stream_id,
        }

    def voice_fingerprint(self) -> str:
        return self.extractor.fingerprint

    def encode_voice(self, inputs: Inputs) -> bytes:
        params = parse_cosyvoice3_params(decode_params(inputs.scalar(PARAMS, "")))
        if params.ref_audio is None:
            raise InvalidRequest("a voice is stored from ref_audio and ref_text")
        return self.extractor.pack(self.extractor.extract(params.ref_audio, params.ref_text),
                                   params.ref_text)

    def prepare(self, text: str, voice: str, params) -> TalkJob:
        default_voice_only(voice, "cosyvoice3 clones the voice of "
                           "ref_audio; use voice 'default' with ref_audio and ref_text, "
                           "or a voice uploaded with POST /v1/audio/voices")
        if params.voice_features is not None:
            prompt = self.extractor.unpack(params.voice_features)
        else:
            prompt = self.extractor.extract(params.ref_audio, params.ref_text)
        segments = [Segment(self.vocab.prompt_ids(prompt.text_ids + ids, prompt.speech_tokens.tolist()),
                            MIN_TOKEN_TEXT_RATIO * len(ids), MAX_TOKEN_TEXT_RATIO * len(ids))
                    for ids in self.text_segments(text)]
        return TalkJob(segments, prompt)

    def text_segments(self, text: str) -> list[list[int]]:
        """Token ids of the input, sentences merged up to SEGMENT_TEXT_TOKENS per segment."""
        segments: list[list[int]] = []
        for sentence in split_sentences(normalize(text)):
            ids = self.extractor.tokenizer.encode(sentence if not segments else " " + sentence)
            if segments and len(segments[-1]) + len(ids) <= SEGMENT_TEXT_TOKENS:
                segments[-1] += ids
            elif ids:
                segments.append(self.extractor.tokenizer.encode(sentence))
        if not segments:
            raise InvalidRequest("input has nothing to speak (no letters or digits)")
        return segments


class CosyVoice3TalkerStage(VllmTalkerStage):
    """Speech tokens from the converted talker on vLLM; one response per hop. Segments are
    spoken one after another in the same stream, each its own generation; chunk indices run
    on across segments and only the very last chunk is final. The voice prompt (prompt
    tokens, mel, embedding) and stream_id pass through to the flow stage."""

    def __init__(self, context: StageContext, checkpoint: CosyVoice3Checkpoint | None = None):
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.talker_dir = ensure_talker_checkpoint(checkpoint)
        self.vocab: TalkerVocab = load_talker_vocab(self.talker_dir)
        self.sampling = checkpoint.config["llm"]["sampling"]
        super().__init__(context)
        # The hop lookahead is the flow's: it must see pre_lookahead_len tokens ahead.
        self.schedule = HopSchedule(**self.settings["hops"],
                                    lookahead=int(checkpoint.config["flow"]["pre_lookahead_len"]))

    def model_path(self) -> str:
        return str(self.talker_dir)

    def request_sampling(self, overrides: dict) -> dict:
        """The request's sampling: its method (the request's, else model.json's
        sampling_method, else RAS) and that method's knobs with the request's overrides."""
        from .request import RAS, STANDARD_SAMPLING, check_knobs

        method = overrides.get(sampling.METHOD) or self.settings.get("sampling_method", RAS)
        check_knobs(method, overrides)
        knobs = {k: v for k, v in overrides.items() if k != sampling.METHOD}
        defaults = self.sampling if method == RAS else STANDARD_SAMPLING
        return {**sampling.apply(defaults, knobs), sampling.METHOD: method}

    def engine_extras(self) -> dict[str, Any]:
        from ...engine.vllm_ras import RAS_LOGITS_PROCESSOR

        return {"skip_tokenizer_init": True, "logits_processors": [RAS_LOGITS_PROCESSOR]}

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        stream_id = int(inputs.scalar(STREAM_ID))
        prompts = np.split(inputs.flat("prompt_ids"), np.cumsum(inputs.flat("segment_lengths"))[:-1])
        min_tokens, max_tokens = inputs.flat("min_tokens"), inputs.flat("max_tokens")
        seed = int(inputs.scalar("seed"))
        ras = self.request_sampling(sampling.decode(inputs.scalar(SAMPLING, "")))
        prompt_tokens = inputs.flat("prompt_tokens").size
        budget = TokenBudget.of(inputs)
        for k, prompt_ids in enumerate(prompts):
            last_segment = k == len(prompts) - 1
            low, high = budget.bounds(int(min_tokens[k]), int(max_tokens[k]))
            tokens: list[int] = []
            async for tokens, chunk in self.talk(
                    f"{stream_id}-{k}", prompt_ids.tolist(), low, high,
                    (seed + k) % 2**63, prompt_tokens, inputs.cancelled, ras):
                yield {"speech_tokens": tokens[:chunk.tokens_upto],
                       "token_offset": chunk.token_offset,
                       "segment_end": chunk.segment_end,
                       IS_FINAL: chunk.segment_end and (last_segment or budget.spent_by(len(tokens)))}
            if budget.spend(len(tokens)):
                return              # max_new_tokens spent: the audio ends with this segment

    async def talk(self, request_id: str, prompt_ids: list[int], min_tokens: int, max_tokens: int,
                   seed: int, prompt_tokens: int, cancelled=lambda: False, ras: dict | None = None
                   ) -> AsyncIterator[tuple[list[int], TokenChunk]]:
        """One segment's generation: (speech tokens so far, chunk) per hop, then the last.
        `ras`: the RAS knobs (default: the checkpoint's llm.sampling)."""
        from vllm import SamplingParams

        room = self.max_model_len - len(prompt_ids)
        if room <= min_tokens:
            raise InvalidRequest(f"the reference prompt and text need {len(prompt_ids)} of the "
                                 f"talker's {self.max_model_len} positions: use a shorter ref_audio")
        ras = ras or {**self.sampling, sampling.METHOD: "ras"}
        if ras[sampling.METHOD] == "ras":
            # RAS samples in its logits processor: vLLM's own sampling is a plain draw.
            drawn = {"temperature": 1.0, "top_p": 1.0, "top_k": 0,
                     "extra_args": ras_extra_args(self.vocab.speech_offset, SPEECH_VOCAB, ras)}
        else:
            drawn = {k: ras[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty")}
        params = SamplingParams(
            seed=seed, detokenize=False, min_tokens=min_tokens, max_tokens=min(max_tokens, room),
            allowed_token_ids=self.vocab.allowed_ids, stop_token_ids=self.vocab.stop_ids, **drawn)
        chunker = TokenChunker(self.schedule, prompt_tokens)
        tokens: list[int] = []
        stop = set(self.vocab.stop_ids)
        seen = 0
        async for ids in self.generate(prompt_ids, params, request_id, cancelled):
            # Cumulative ids: convert only what is new (was O(n^2) per generation).
            tokens.extend(self.vocab.to_speech(t) for t in ids[seen:] if t not in stop)
            seen = len(ids)
            while (chunk := chunker.poll(len(tokens))) is not None:
                yield tokens, chunk
        yield tokens, chunker.finish(len(tokens))


class CosyVoice3FlowStage(GroupedStage):
    """Speech tokens so far -> the mel of all of them (frames from 0), streaming attention.
    Stateless per chunk, so Triton may batch chunks of different streams on any instance."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: CosyVoice3Checkpoint | None = None):
        from ...nn.runtime import stage_runner
        from .flow import velocity_graph

        super().__init__(context)
        self.device = torch.device(context.device)
        self.flow = load_flow(checkpoint or context.open_checkpoint(FAMILY)).to(self.device)
        dit = self.flow.decoder.estimator
        dit.velocity_runner = stage_runner(velocity_graph(dit), context)

    @staticmethod
    def batch_key(inputs: Inputs) -> tuple[int, int, tuple[int, ...], int, bool]:
        """Chunks of equal token, prompt and prompt-mel lengths (and finality), from any
        streams and voices, solve as one batch: every row starts from the same fixed noise
        and the DiT's attention is over its own row, so each equals its chunk alone."""
        return (inputs["speech_tokens"].size, inputs["prompt_tokens"].size, inputs["prompt_mel"].shape,
                inputs["embedding"].size, bool(inputs.scalar("segment_end")))

    @torch.inference_mode()
    def run_group(self, members: list[Inputs]) -> list[dict[str, Any]]:
        """[frames, 80] per chunk for its tokens (lookahead tokens give context only unless
        segment_end)."""
        if members[0]["speech_tokens"].size == 0:
            return [{"mel": np.zeros((0, 80), np.float32)} for _ in members]

        def rows(name: str, dtype, flat: bool = True) -> torch.Tensor:
            arrays = [(m.flat(name) if flat else m[name]).astype(dtype) for m in members]
            return torch.from_numpy(np.stack(arrays)).to(self.device)

        token, prompt_token = rows("speech_tokens", np.int64), rows("prompt_tokens", np.int64)
        feat = rows("prompt_mel", np.float32, flat=False)
        lengths = lambda n: torch.full((len(members),), n, device=self.device)  # noqa: E731
        mel, _ = self.flow.inference(
            token=token, token_len=lengths(token.shape[1]), prompt_token=prompt_token,
            prompt_token_len=lengths(prompt_token.shape[1]), prompt_feat=feat,
            prompt_feat_len=lengths(feat.shape[1]), embedding=rows("embedding", np.float32),
            streaming=True, finalize=bool(members[0].scalar("segment_end")))
        return [{"mel": row.T.contiguous().cpu().numpy()} for row in mel]

    def mel(self, tokens: np.ndarray, prompt_tokens: np.ndarray, prompt_mel: np.ndarray,
            embedding: np.ndarray, segment_end: bool) -> np.ndarray:
        """One stream's chunk: [frames, 80] for its tokens so far."""
        return self.run(Inputs(speech_tokens=tokens, prompt_tokens=prompt_tokens, prompt_mel=prompt_mel,
                               embedding=embedding, segment_end=np.array([segment_end])))["mel"]


class CosyVoice3HiftStage(GroupedStage):
    """Full mel so far -> the audio not yet sent, stateless per chunk: what earlier chunks
    sent follows from token_offset (upstream's streaming contract, see hift.stream_hift)."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: CosyVoice3Checkpoint | None = None):
        from ...nn.runtime import stage_runner
        from ...nn.hift import spectrum_graph

        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        self.hift = load_hift(checkpoint).to(self.device)
        self.hift.spectrum_runner = stage_runner(spectrum_graph(self.hift), context)
        self.sample_rate = int(checkpoint.config["sample_rate"])

    @staticmethod
    def batch_key(inputs: Inputs) -> tuple[int, bool]:
        """Streams' mel of equal length (and finality) vocode as one batch: the network has
        no mask, and its excitation noise is a function of the sample index, the same in
        every row, so each row equals that mel vocoded alone."""
        return inputs["mel"].shape[0], bool(inputs.scalar("segment_end"))

    def sent_before(self, token_offset: int) -> int:
        frames = TOKEN_MEL_RATIO * token_offset
        return max(0, frames - self.hift.min_partial_frames) * SAMPLES_PER_FRAME

    @torch.inference_mode()
    def run_group(self, members: list[Inputs]) -> list[dict[str, Any]]:
        from ...nn.hift import stream_hift

        frames, segment_end = self.batch_key(members[0])
        if frames == 0:
            return [{AUDIO: np.zeros(0, np.float32), SAMPLE_RATE: self.sample_rate} for _ in members]
        mel_so_far = torch.from_numpy(np.stack([np.asarray(m["mel"], np.float32) for m in members])) \
            .transpose(1, 2).to(self.device)
        audio, _ = stream_hift(self.hift, mel_so_far, 0, segment_end)
        audio = audio.cpu().numpy().astype(np.float32)
        return [{AUDIO: audio[row, self.sent_before(int(m.scalar("token_offset"))):], SAMPLE_RATE: self.sample_rate}
                for row, m in enumerate(members)]

    def new_audio(self, mel: np.ndarray, token_offset: int, segment_end: bool) -> np.ndarray:
        """The audio one stream's mel so far adds (the stage's computation for one request)."""
        return self.run(Inputs(mel=mel, token_offset=np.array([token_offset]),
                               segment_end=np.array([segment_end])))[AUDIO]
