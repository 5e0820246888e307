"""The GLM-TTS stages (each a tritontts.serving.stage class named by its config.pbtxt):

  glm_tts_prompt   GLMTTSPromptStage   text + reference -> segment ids, voice prompt
  glm_tts_talker   GLMTTSTalkerStage   stock vLLM Llama, speech tokens in growing chunks
  glm_tts_flow     GLMTTSFlowStage     tokens so far -> their mel (block-causal, trajectory
                                       carried from the stream's previous chunk)
  glm_tts_vocoder  GLMTTSVocoderStage  mel -> audio, cross-faded onto what was sent

Upstream streams by re-running flow and vocoder on everything so far and cross-fading (see
tritontts.families.glm_tts.talker): the flow keeps each stream's ODE trajectory and the vocoder its
send position and fade tail, so both are stateful per stream, keyed by stream_id and
reset at each segment's first chunk. Each runs as one instance whose scheduler hands a
stream's chunks over one at a time, in order (tritontts.serving.scheduling).

The checkpoint path comes from the launcher (`--checkpoint glm_tts=DIR`, passed to the
stages as TRITONTTS_GLM_TTS_CHECKPOINT); tests hand a checkpoint in directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import numpy as np
import torch

from ... import sampling
from ...serving.lru import LRU
from ...nn.ras import ras_extra_args
from ...sampling import SAMPLING
from ...protocol import (
    AUDIO, IS_FINAL, PARAMS, SAMPLE_RATE, STREAM_ID, InvalidRequest, at_least_one_row,
    decode_params)
from ...serving.stage import PREPARES_REQUESTS, Inputs, Stage, StageContext, begin_request, default_voice_only
from ...text import normalize, split_sentences
from ...engine.vllm_talker import TOKEN_BUDGET, TokenBudget, VllmTalkerStage
from .checkpoint import GLMTTSCheckpoint
from .family import FAMILY
from .flow import FlowCache, build_flow, frame_noise
from .prompt import PromptExtractor
from .request import parse_glm_tts_params
from .talker import (BLOCK_SIZES, RAS_DEFAULTS, Chunker, History, segment_prompt, token_bounds)
from .tokenizer import AUDIO_TOKENS, GLMTextTokenizer

SEGMENT_CHARS = 60            # upstream's split_by_len: segments of 30-60 characters
FADE_SECONDS = 0.1            # upstream's cross-fade between chunks
STREAMS = 1024                # per-stream state kept at most (a stream that never ends is dropped)


def load_flow(checkpoint: GLMTTSCheckpoint):
    return build_flow(checkpoint.flow_config, checkpoint.flow_state(), checkpoint.path("flow/flow.pt"))


def load_vocoder(checkpoint: GLMTTSCheckpoint):
    from .vocoder import load_hift, load_vocos2d

    if checkpoint.vocoder == "hift":
        return load_hift(checkpoint.path("hift/hift.pt"))
    return load_vocos2d(checkpoint.path("vocos2d/generator_jit.ckpt"))


def text_segments(text: str) -> list[str]:
    """Sentences of the normalised input, joined while a segment stays within 60 chars."""
    segments: list[str] = []
    for sentence in split_sentences(normalize(text)):
        if segments and len(segments[-1]) + 1 + len(sentence) <= SEGMENT_CHARS:
            segments[-1] = f"{segments[-1]} {sentence}"
        else:
            segments.append(sentence)
    return segments


class GLMTTSPromptStage(Stage):
    """Text ids per segment, and the reference's transcript ids, speech tokens, speaker
    embedding and prompt mel (cached by content)."""

    one_by_one = PREPARES_REQUESTS

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: GLMTTSCheckpoint | None = None):
        super().__init__(context)
        self.extractor = PromptExtractor(checkpoint or context.open_checkpoint(FAMILY))

    def run(self, inputs: Inputs) -> dict[str, Any]:
        start = begin_request(inputs, parse_glm_tts_params)
        default_voice_only(start.voice, "glm_tts clones the voice of "
                           "ref_audio; use voice 'default' with ref_audio and ref_text, "
                           "or a voice uploaded with POST /v1/audio/voices")
        params = start.params
        if params.voice_features is not None:
            prompt = self.extractor.unpack(params.voice_features)
        else:
            prompt = self.extractor.extract(params.ref_audio, params.ref_text)
        segments = [ids for ids in (self.extractor.tokenizer.encode(s) for s in text_segments(start.text)) if ids]
        if not segments:
            raise InvalidRequest("input has nothing to speak (no letters or digits)")
        return {"text_ids": [i for seg in segments for i in seg],
                "segment_lengths": [len(seg) for seg in segments],
                "prompt_text_ids": prompt.text_ids,
                "prompt_tokens": prompt.speech_tokens, "prompt_mel": prompt.mel,
                "embedding": prompt.embedding, "seed": start.seed,
                SAMPLING: sampling.encode(params.sampling), STREAM_ID: start.stream_id,
                # non_streaming_mode: 1 whole utterances, 0 streamed, -1 the talker's default
                "whole": -1 if params.whole is None else int(params.whole),
                TOKEN_BUDGET: params.max_new_tokens or 0}      # 0: each segment's own cap

    def voice_fingerprint(self) -> str:
        return self.extractor.fingerprint

    def encode_voice(self, inputs: Inputs) -> bytes:
        params = parse_glm_tts_params(decode_params(inputs.scalar(PARAMS, "")))
        if params.ref_audio is None:
            raise InvalidRequest("a voice is stored from ref_audio and ref_text")
        return self.extractor.pack(self.extractor.extract(params.ref_audio, params.ref_text),
                                   params.ref_text)


class GLMTTSTalkerStage(VllmTalkerStage):
    """Speech tokens from the Llama talker on stock vLLM, one response per chunk. Segments
    are generated one after another, each seeing the earlier ones (History); chunk indices
    run on across segments and only the very last chunk is final."""

    def __init__(self, context: StageContext, checkpoint: GLMTTSCheckpoint | None = None):
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.checkpoint = checkpoint
        self.ids = GLMTextTokenizer(checkpoint.tokenizer_dir).ids
        super().__init__(context)

    def model_path(self) -> str:
        return str(self.checkpoint.llm_dir)

    def engine_extras(self) -> dict[str, Any]:
        """RAS, token ids in and out (dtype "auto": tritontts.engine.engine_dtype)."""
        from ...engine.vllm_ras import RAS_LOGITS_PROCESSOR

        return {"skip_tokenizer_init": True, "logits_processors": [RAS_LOGITS_PROCESSOR]}

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        stream_id = int(inputs.scalar(STREAM_ID))
        texts = [t.tolist() for t in np.split(inputs.flat("text_ids"),
                                              np.cumsum(inputs.flat("segment_lengths"))[:-1])]
        prompt_text = inputs.flat("prompt_text_ids").tolist()
        prompt_speech = inputs.flat("prompt_tokens").tolist()
        seed = int(inputs.scalar("seed"))
        ras = sampling.apply(RAS_DEFAULTS, sampling.decode(inputs.scalar(SAMPLING, "")))
        asked = int(inputs.scalar("whole", -1))
        whole = bool(self.settings.get("non_streaming_mode", False)) if asked < 0 else bool(asked)
        budget = TokenBudget.of(inputs)
        history = History()
        for k, text in enumerate(texts):
            history.prune(prompt_text, prompt_speech, text)
            prompt_ids = segment_prompt(prompt_text, prompt_speech, text, history,
                                        self.ids.boa, self.ids.ats)
            tokens: list[int] = []
            async for tokens, chunk in self.talk(f"{stream_id}-{k}", prompt_ids, len(text),
                                                 seed, ras, inputs.cancelled, budget):
                if whole and not chunk.last:
                    continue        # a whole utterance: the segment's tokens in one chunk, at its end
                spent = budget.spent_by(len(tokens))
                yield {"speech_tokens": np.asarray(tokens[:chunk.tokens], np.int32),
                       "segment": k, "chunk_in_segment": 0 if whole else chunk.index,
                       "look_ahead": 0 if whole else chunk.look_ahead, "segment_end": chunk.last,
                       "whole": whole, IS_FINAL: chunk.last and (k == len(texts) - 1 or spent)}
            if budget.spend(len(tokens)):
                return              # max_new_tokens spent: the audio ends with this segment
            history.add(text, tokens)

    async def talk(self, request_id: str, prompt_ids: list[int], text_tokens: int, seed: int,
                   ras: dict, cancelled=lambda: False, budget: TokenBudget | None = None):
        """One segment: (speech tokens so far, Chunk) per chunk, the last one included,
        within what is left of the request's max_new_tokens. Upstream reseeds before every
        segment; a vLLM request's seed does the same."""
        from vllm import SamplingParams

        min_tokens, max_tokens = (budget or TokenBudget(None)).bounds(*token_bounds(text_tokens))
        room = self.max_model_len - len(prompt_ids)
        if room <= min_tokens:
            raise InvalidRequest(f"the reference and text need {len(prompt_ids)} of the talker's "
                                 f"{self.max_model_len} positions: use a shorter ref_audio")
        eoa = self.ids.eoa
        params = SamplingParams(
            temperature=1.0, top_p=1.0, top_k=0, seed=seed, detokenize=False,
            min_tokens=min_tokens, max_tokens=min(max_tokens, room), stop_token_ids=[eoa],
            extra_args=ras_extra_args(self.ids.ats, AUDIO_TOKENS, ras, extra_ids=[eoa],
                                      min_tokens=min_tokens, stop_ids=[eoa]))
        chunker = Chunker()
        tokens: list[int] = []
        seen = 0
        async for ids in self.generate(prompt_ids, params, request_id, cancelled):
            tokens.extend(self.ids.speech(t) for t in ids[seen:] if t != eoa)
            seen = len(ids)
            while (chunk := chunker.poll(len(tokens))) is not None:
                yield tokens, chunk
        yield tokens, chunker.finish(len(tokens))


@dataclass
class _VocoderStream:
    sent: int = 0                                        # samples sent in this segment
    tail: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))


class GLMTTSFlowStage(Stage):
    """Speech tokens so far -> the mel of all of them, block-causal, with the stream's
    trajectory from its previous chunk (upstream token2wav_stream)."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: GLMTTSCheckpoint | None = None):
        super().__init__(context)
        self.device = torch.device(context.device)
        self.flow = load_flow(checkpoint or context.open_checkpoint(FAMILY)).to(self.device)
        self.caches = LRU(STREAMS)

    def run(self, inputs: Inputs) -> dict[str, Any]:
        stream = int(inputs.scalar(STREAM_ID))
        if int(inputs.scalar("chunk_in_segment")) == 0:
            self.caches.pop(stream)
        last = bool(inputs.scalar("segment_end"))
        mel, cache = self.mel(inputs.flat("speech_tokens"), inputs.flat("prompt_tokens"),
                              inputs["prompt_mel"], inputs.flat("embedding"),
                              int(inputs.scalar("seed")) + int(inputs.scalar("segment")),
                              self.caches.get(stream), 0 if last else int(inputs.scalar("look_ahead")),
                              last, bool(inputs.scalar("whole", False)))
        if last:
            self.caches.pop(stream)
        else:
            self.caches.put(stream, cache)
        return {"mel": at_least_one_row(mel), "frames": mel.shape[0]}

    @torch.inference_mode()
    def mel(self, tokens: np.ndarray, prompt_tokens: np.ndarray, prompt_mel: np.ndarray,
            embedding: np.ndarray, seed: int, cache: FlowCache | None, look_ahead: int,
            last: bool = False, whole: bool = False) -> tuple[np.ndarray, FlowCache | None]:
        """[frames, 80] for all tokens so far, and the trajectory the next chunk reuses: the
        prompt's frames and this chunk's, less the look-ahead's, plus one (upstream's
        override length). `whole`: the segment's tokens at once, full attention (upstream's
        non-streaming synthesis)."""
        flow = self.flow
        frames = flow.frames_for(prompt_tokens.size + tokens.size)
        prompt_frames = min(prompt_mel.shape[0], frames)
        keep = 0 if last else min(frames, prompt_frames + max(
            0, flow.frames_for(tokens.size) - flow.frames_for(look_ahead)) + 1)

        def tensor(array, dtype):
            return torch.from_numpy(np.ascontiguousarray(array, dtype))[None].to(self.device)

        mel, next_cache = flow.inference(
            tensor(tokens, np.int64), tensor(prompt_tokens, np.int64), tensor(prompt_mel, np.float32),
            tensor(embedding, np.float32), frame_noise(seed, frames).to(self.device),
            None if whole else [int(prompt_tokens.size), *BLOCK_SIZES], cache, keep)
        return mel[0].float().cpu().numpy(), next_cache


class GLMTTSVocoderStage(Stage):
    """Mel of all tokens so far -> the audio not sent yet: the vocoder re-runs on the whole
    mel, the part sent before is skipped, the first 0.1 s cross-fades from the previous
    chunk's tail, and the look-ahead's audio plus that fade is held back for the next chunk."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: GLMTTSCheckpoint | None = None):
        super().__init__(context)
        self.vocoder = load_vocoder(checkpoint or context.open_checkpoint(FAMILY))
        self.sample_rate = int(self.vocoder.sample_rate)
        self.streams = LRU(STREAMS)

    def run(self, inputs: Inputs) -> dict[str, Any]:
        stream = int(inputs.scalar(STREAM_ID))
        if int(inputs.scalar("chunk_in_segment")) == 0:
            self.streams.pop(stream)
        mel = inputs["mel"][:int(inputs.scalar("frames"))]
        state = self.streams.get(stream) or _VocoderStream()
        last = bool(inputs.scalar("segment_end"))
        audio = self.stitch(state, self.audio(mel), int(inputs.scalar("look_ahead")), last)
        if last:
            self.streams.pop(stream)
        else:
            self.streams.put(stream, state)
        return {AUDIO: audio, SAMPLE_RATE: self.sample_rate}

    @torch.inference_mode()
    def audio(self, mel: np.ndarray) -> np.ndarray:
        if mel.shape[0] == 0:
            return np.zeros(0, np.float32)
        batch = torch.from_numpy(np.ascontiguousarray(mel, np.float32)).T[None]
        return self.vocoder(batch)[0].float().cpu().numpy()

    def stitch(self, state: _VocoderStream, audio: np.ndarray, look_ahead: int,
               last: bool) -> np.ndarray:
        """What this chunk sends, updating `state` (upstream's wav pointer and fade tail)."""
        current = audio[min(state.sent, audio.size):].copy()
        blend = min(state.tail.size, current.size)
        if blend:
            fade_in = np.linspace(0.0, 1.0, blend, dtype=np.float32)
            current[:blend] = state.tail[:blend] * (1.0 - fade_in) + current[:blend] * fade_in
        if last:
            return current
        held_ahead = look_ahead * 2 * (self.sample_rate // 50)      # 2 mel frames per token
        overlap = held_ahead + int(FADE_SECONDS * self.sample_rate)
        if current.size <= overlap:
            state.tail = current
            return np.zeros(0, np.float32)
        state.tail = current[current.size - overlap:current.size - held_ahead].copy()
        state.sent += current.size - overlap
        return current[:current.size - overlap]
