"""The higgs-audio v2 stages (each a tritontts.serving.stage class named by its config.pbtxt):

  higgs_audio_v2_prompt   HiggsAudioV2PromptStage   text, params -> the talker's prompt ids
                                                    and, when cloning, the reference's codes
                                                    in the delay pattern (encoded, cached)
  higgs_audio_v2_talker   HiggsAudioV2TalkerStage   vLLM (DualFFN Llama, the 8 codebooks
                                                    sampled in each step); undoes the delay
                                                    and sends chunks of audio frames with
                                                    the context the codec needs
  higgs_audio_v2_decoder  HiggsAudioV2DecoderStage  a chunk's codes (with context on both
                                                    sides) -> its 24 kHz audio; Triton's
                                                    batches decoded together

The codec's decoder is non-causal: a frame's audio depends on `context_frames` frames on
each side, so a chunk is sent once that many frames after it exist (or the stream ended),
and the decoder keeps only the chunk's own samples: streamed audio equals the whole
utterance decoded at once.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Any, AsyncIterator

import numpy as np
import torch

from ... import sampling
from ...audio import reference_recording
from ...serving.lru import LRU
from ...sampling import SAMPLING
from ...protocol import (
    AUDIO, at_least_one_row, IS_FINAL, PARAMS, SAMPLE_RATE, STREAM_ID, InvalidRequest,
    decode_params)
from ...serving.stage import (
    PREPARES_REQUESTS, GroupedStage, Inputs, Stage, StageContext, begin_request, default_voice_only)
from ...engine.vllm_talker import VllmTalkerStage, chunk_sizes
from ...voice import checkpoint_fingerprint, pack_voice, unpack_voice
from .checkpoint import HiggsAudioV2Checkpoint
from .family import FAMILY
from .prompt import TextTokenizer, build_prompt, reference_steps
from .request import HiggsAudioV2Params, check_text, parse_higgs_audio_v2_params

SAMPLE_RATE_HZ = 24000
MIN_REF_SECONDS, MAX_REF_SECONDS = 1.0, 30.0


def export_graphs(checkpoint: HiggsAudioV2Checkpoint) -> list:
    """The network the decoder stage may run on onnxruntime / TensorRT."""
    from ...nn.higgs_codec import decoder_graph, load_codec_decoder

    return [decoder_graph(load_codec_decoder(checkpoint.codec_dir))]


def codec_context_frames(checkpoint: HiggsAudioV2Checkpoint) -> int:
    from ...weights.checkpoint import read_json
    from ...nn.higgs_codec import HiggsCodecConfig, context_frames

    return context_frames(HiggsCodecConfig.from_dict(read_json(checkpoint.codec_dir / "config.json")))


class HiggsAudioV2PromptStage(Stage):
    one_by_one = PREPARES_REQUESTS

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: HiggsAudioV2Checkpoint | None = None):
        super().__init__(context)
        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.tokenizer = TextTokenizer(self.checkpoint)
        self._encoder = None
        self._lock = threading.Lock()
        self.references = LRU(64)      # reference codes by content
        root = self.checkpoint.root
        # What a stored voice's codes depend on: the codec (and nothing of the talker).
        self.fingerprint = checkpoint_fingerprint(root, ["audio_tokenizer"])
        self.voice_spec = {"codes": (np.int64, (self.checkpoint.config.num_codebooks, None))}

    @property
    def encoder(self):
        """The codec's encoder, loaded on the first cloning request (it carries a HuBERT)."""
        with self._lock:
            if self._encoder is None:
                from ...nn.higgs_codec import HiggsCodecEncoder

                self._encoder = HiggsCodecEncoder(self.checkpoint.codec_dir)
            return self._encoder

    def run(self, inputs: Inputs) -> dict[str, Any]:
        start = begin_request(inputs, parse_higgs_audio_v2_params)
        default_voice_only(start.voice, ("upstream's profile: text-only speaker descriptions are not "
                                         "served (nor by vLLM-Omni); " if start.voice.startswith("profile:") else "")
                           + "higgs-audio v2 has no preset speakers; use voice 'default', send "
                           "ref_audio + ref_text, or upload a voice (POST /v1/audio/voices)")
        ids, steps = self.prompt(start.text, start.params)
        return {
            "prompt_ids": np.asarray(ids, np.int32),
            "ref_steps": at_least_one_row(steps.astype(np.int32)),
            "ref_step_count": steps.shape[0],
            "max_frames": start.params.max_new_tokens or 0,
            "first_chunk_frames": start.params.initial_codec_chunk_frames or 0,
            "seed": start.seed,
            SAMPLING: sampling.encode(start.params.sampling),
            STREAM_ID: start.stream_id,
        }

    def prompt(self, text: str, params: HiggsAudioV2Params) -> tuple[list[int], np.ndarray]:
        """(prompt ids, the reference's steps [A, K] at its placeholders; A = 0 without one)."""
        check_text(text)
        cfg = self.checkpoint.config
        codes, ref_text = self.reference(params)
        if codes is None:
            return build_prompt(self.tokenizer, text, cfg.num_codebooks), np.zeros((0, cfg.num_codebooks), np.int64)
        steps = reference_steps(codes.T, cfg.audio_stream_bos_id, cfg.audio_stream_eos_id)
        return build_prompt(self.tokenizer, text, cfg.num_codebooks, ref_text, steps.shape[0]), steps

    def reference(self, params: HiggsAudioV2Params) -> tuple[np.ndarray | None, str | None]:
        """(codes [K, R], transcript) of the voice to clone, or (None, None)."""
        if params.voice_features is not None:
            arrays, meta = unpack_voice(params.voice_features, FAMILY.name, self.fingerprint, self.voice_spec)
            return arrays["codes"], meta.get("ref_text") or ""
        if params.ref_audio is None:
            return None, None
        audio = reference_recording(params.ref_audio, SAMPLE_RATE_HZ, MIN_REF_SECONDS, MAX_REF_SECONDS)
        key = hashlib.sha256(audio.tobytes()).hexdigest()
        codes = self.references.get(key, lambda: self.encoder.encode(audio.astype(np.float32)))
        return codes, params.ref_text

    def voice_fingerprint(self) -> str:
        return self.fingerprint

    def encode_voice(self, inputs: Inputs) -> bytes:
        """An uploaded voice for storing: the reference's codes and transcript."""
        params = parse_higgs_audio_v2_params(decode_params(inputs.scalar(PARAMS, "")))
        if params.ref_audio is None:
            raise InvalidRequest("a higgs-audio v2 voice is stored from ref_audio with ref_text")
        codes, ref_text = self.reference(params)
        return pack_voice(FAMILY.name, self.fingerprint, {"codes": codes.astype(np.int64)}, ref_text=ref_text)


class HiggsAudioV2TalkerStage(VllmTalkerStage):
    """Steps from the vLLM talker, sent as chunks of audio frames (delay undone) with up to
    context_frames frames of context on each side for the codec."""

    shares_rows = True   # the model and this stage share the request's AudioStream

    def __init__(self, context: StageContext, checkpoint: HiggsAudioV2Checkpoint | None = None):
        from .vllm_model import prepare_vllm_talker, register

        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.talker_dir = prepare_vllm_talker(self.checkpoint)
        register()
        super().__init__(context)
        chunks = self.settings["chunks"]
        self.chunk_frames = int(chunks["frames"])
        self.first_chunk_frames = int(chunks["first_frames"])
        # Chunks grow from the first by this factor up to `frames` (a short first chunk
        # for early audio, then growing ones that keep the listener's buffer ahead).
        self.chunk_growth = chunks.get("growth")
        # The codec's reach: a chunk leaves once this many frames after it exist.
        self.context_frames = codec_context_frames(self.checkpoint)
        self.max_frames = int(self.settings.get("max_frames", 1500))

    def model_path(self) -> str:
        return str(self.talker_dir)

    def sampler(self, seed: int, overrides: dict, history: torch.Tensor):
        from .talker import AudioCodeSampler, AudioSampling

        g = self.checkpoint.generation
        s = sampling.apply({"temperature": g.temperature if g.do_sample else 0.0,
                            "top_k": g.top_k, "top_p": g.top_p}, overrides)
        settings = AudioSampling(do_sample=s["temperature"] > 0, temperature=s["temperature"] or 1.0,
                                 top_k=s["top_k"], top_p=s["top_p"], ras_win_len=g.ras_win_len,
                                 ras_win_max_num_repeat=g.ras_win_max_num_repeat)
        return AudioCodeSampler(self.checkpoint.config, settings, torch.Generator().manual_seed(seed), history)

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        from vllm import SamplingParams

        from ...engine.vllm_frames import FRAMES_ARG, register, release
        from .talker import audio_frames
        from .vllm_model import AudioStream

        cfg = self.checkpoint.config
        stream_id, seed = int(inputs.scalar(STREAM_ID)), int(inputs.scalar("seed"))
        ids = np.array(inputs["prompt_ids"], np.int64).reshape(-1)
        ref = torch.from_numpy(np.array(inputs["ref_steps"], np.int64)[:int(inputs.scalar("ref_step_count"))])
        max_frames = int(inputs.scalar("max_frames")) or self.max_frames
        # n steps hold n - K frames (the all-bos step, then K - 1 while the delay fills).
        max_steps = min(max_frames + cfg.num_codebooks, self.max_model_len - ids.shape[0])
        if max_steps <= cfg.num_codebooks + 1:
            raise InvalidRequest(f"the prompt needs {ids.shape[0]} of the talker's {self.max_model_len} "
                                 "positions: shorten the text or the reference")
        key = f"{stream_id}"
        stream = AudioStream(torch.from_numpy(ids), ref,
                             self.sampler(seed, sampling.decode(inputs.scalar(SAMPLING, "")), ref.clone()))
        register(key, stream)
        params = SamplingParams(temperature=0.0, max_tokens=max_steps, stop_token_ids=[cfg.eos_token_id],
                                detokenize=False, extra_args={FRAMES_ARG: key})
        sizes = chunk_sizes(self.chunk_frames, int(inputs.scalar("first_chunk_frames")) or self.first_chunk_frames,
                            self.chunk_growth)
        sent, size, ctx = 0, next(sizes), self.context_frames
        try:
            finished = False
            async for tokens in self.generate(ids.tolist(), params, key, inputs.cancelled):
                finished = bool(tokens) and tokens[-1] == cfg.eos_token_id
                steps = torch.stack(stream.steps) if stream.steps else torch.zeros((0, cfg.num_codebooks), dtype=torch.int64)
                ready = audio_frames(steps, cfg, finished)
                # A chunk leaves once the codec's right context for it exists.
                while ready >= sent + size + ctx and not finished:
                    yield self.chunk(steps, sent, sent + size, ready, final=False)
                    sent, size = sent + size, next(sizes)
            steps = torch.stack(stream.steps) if stream.steps else torch.zeros((0, cfg.num_codebooks), dtype=torch.int64)
            total = min(audio_frames(steps, cfg, finished=True), max_frames)
            while total - sent > size:     # what was held back for its right context
                yield self.chunk(steps, sent, sent + size, total, final=False)
                sent, size = sent + size, next(sizes)
            yield self.chunk(steps, sent, total, total, final=True)
        finally:
            release(key)

    def chunk(self, steps: torch.Tensor, start: int, end: int, available: int, final: bool) -> dict[str, Any]:
        """Frames [start, end) with up to context_frames frames on each side."""
        from ...nn.higgs_codec import chunk_window
        from .talker import frame_codes

        if end <= start:     # a stop at the first frame: one zero frame, all context (no audio)
            return {"codes": np.zeros((1, self.checkpoint.config.num_codebooks), np.int32), "left_context": 1,
                    "right_context": 0, IS_FINAL: final}
        lo, hi, left, right = chunk_window(start, end, available, self.context_frames)
        codes = frame_codes(steps, self.checkpoint.config, lo, hi).numpy().astype(np.int32)
        return {"codes": codes, "left_context": left, "right_context": right, IS_FINAL: final}


class HiggsAudioV2DecoderStage(GroupedStage):
    """A chunk's codes -> its audio, stateless: the window is decoded whole and only the
    chunk's own frames' samples kept. Chunks of the same window length in Triton's batch,
    from other streams, decode together (a stream's own chunks in successive calls:
    run_in_groups)."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: HiggsAudioV2Checkpoint | None = None):
        from ...nn.higgs_codec import decoder_graph, load_codec_decoder
        from ...nn.runtime import stage_runner

        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        self.decoder = load_codec_decoder(checkpoint.codec_dir, self.device)
        self.samples_per_frame = self.decoder.cfg.samples_per_frame
        self.runner = stage_runner(decoder_graph(self.decoder), context)

    def batch_key(self, inputs: Inputs) -> int:
        return np.asarray(inputs["codes"]).shape[0]

    @torch.no_grad()
    def run_group(self, members: list[Inputs]) -> list[dict[str, Any]]:
        codes = torch.from_numpy(np.stack([np.array(m["codes"], np.int64).T for m in members]))
        audio = self.runner(codes.to(self.device))[0].float().cpu().numpy()
        spf, results = self.samples_per_frame, []
        for row, inputs in zip(audio, members):
            left, right = int(inputs.scalar("left_context")), int(inputs.scalar("right_context"))
            # Clipped as 16-bit PCM would be (the codec can overshoot 1.0 slightly).
            results.append({AUDIO: np.clip(row[left * spf:row.shape[0] - right * spf], -1.0, 1.0),
                            SAMPLE_RATE: SAMPLE_RATE_HZ})
        return results
