"""The Fish Speech S2 Pro stages (each a tritontts.stage class named by its config.pbtxt):

  fish_s2_pro_prompt  FishS2ProPromptStage  text (+ reference) -> upstream's chat prompt
                                            [1 + 10, T]; a reference recording -> its codes
                                            (the codec's encoder at 44.1 kHz, cached by
                                            content); encodes uploaded voices
  fish_s2_pro_talker  FishS2ProTalkerStage  vLLM: the slow AR, the main-token draw and the
                                            fast AR in every step; one response per chunk of
                                            frames (4, then 25) with left context
  fish_s2_pro_codec   FishS2ProCodecStage   a chunk's codes -> 44.1 kHz audio, stateless;
                                            windows of equal length and start batched

The checkpoint path comes from the launcher (`--checkpoint fish_s2_pro=DIR`, passed to the
stages as TRITONTTS_FISH_S2_PRO_CHECKPOINT); tests hand a checkpoint in directly.
"""
from __future__ import annotations

import hashlib
from typing import Any, AsyncIterator

import numpy as np
import torch

from .. import sampling
from ..audio import reference_recording
from ..lru import LRU
from ..sampling import SAMPLING
from ..stage import (PARAMS, STREAM_ID, Inputs, InvalidRequest, Stage, StageContext, WindowDecoderStage,
                     begin_request, parse_params)
from ..vllm_talker import FrameChunkTalkerStage
from ..voice import checkpoint_fingerprint, pack_voice, unpack_voice
from .checkpoint import CODEC_FILE, CONFIG_FILE, FishCheckpoint, open_checkpoint
from .family import FAMILY
from .prompt import FishPromptBuilder, PromptError, Reference
from .request import DEFAULT_MAX_NEW_TOKENS, FishS2ProParams, parse_fish_s2_pro_params

MIN_REF_SECONDS, MAX_REF_SECONDS = 1.0, 30.0
# What a stored voice's codes depend on: the codec (and its sizes), the codebook layout.
VOICE_FILES = (CODEC_FILE, CONFIG_FILE)


def served_checkpoint(context: StageContext) -> FishCheckpoint:
    return open_checkpoint(context.checkpoint(FAMILY))


def load_served_codec(checkpoint: FishCheckpoint, device: str | torch.device = "cpu"):
    from .codec import load_codec, load_codec_file

    path = checkpoint.path(CODEC_FILE)
    return load_codec(load_codec_file(path), checkpoint.codec_config(), str(path), device)


class FishS2ProPromptStage(Stage):
    """The talker's prompt for one request (tritontts.fish_s2_pro.prompt)."""

    def __init__(self, context: StageContext, checkpoint: FishCheckpoint | None = None):
        super().__init__(context)
        torch.set_num_threads(context.int_parameter("torch_threads", 1))
        self.checkpoint = checkpoint or served_checkpoint(context)
        self.build = FishPromptBuilder(self.checkpoint.root, self.checkpoint.config)
        self.codec = load_served_codec(self.checkpoint)
        self.references = LRU(64)
        self.fingerprint = checkpoint_fingerprint(self.checkpoint.root, VOICE_FILES)
        self.voice_spec = {"codes": (np.int64, (self.checkpoint.config.num_codebooks, None))}

    def run(self, inputs: Inputs) -> dict[str, Any]:
        start = begin_request(inputs, parse_fish_s2_pro_params)
        if start.voice not in ("", "default"):
            raise InvalidRequest(f"unknown voice {start.voice!r}: fish_s2_pro has no preset voices; use "
                                 "voice 'default' (its own voice, or ref_audio's), or a voice "
                                 "uploaded with POST /v1/audio/voices")
        if not start.text.strip():
            raise InvalidRequest("input has nothing to speak")
        try:
            prompt = self.build(start.text, self.reference(start.params))
        except PromptError as exc:
            raise InvalidRequest(str(exc)) from None
        return {"prompt": prompt.numpy(), "max_frames": start.params.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                "seed": start.seed, SAMPLING: sampling.encode(start.params.sampling), STREAM_ID: start.stream_id}

    def reference(self, params: FishS2ProParams) -> Reference | None:
        if params.voice_features is not None:
            arrays, meta = unpack_voice(params.voice_features, FAMILY.name, self.fingerprint, self.voice_spec)
            return Reference(meta.get("ref_text", ""), torch.from_numpy(arrays["codes"]))
        if params.ref_audio is None:
            return None
        return Reference(params.ref_text or "", self.codes(params.ref_audio))

    def codes(self, ref_audio: bytes) -> torch.Tensor:
        """The recording's codes [10, frames] from the codec's encoder, cached by content."""
        def encode() -> torch.Tensor:
            audio = reference_recording(ref_audio, self.codec.config.sample_rate, MIN_REF_SECONDS, MAX_REF_SECONDS)
            return self.codec.encode(torch.from_numpy(audio)[None, None])[0]

        return self.references.get(hashlib.sha256(ref_audio).hexdigest(), encode)

    def encode_voice(self, inputs: Inputs) -> bytes:
        """A voice for storing: the recording's codes, with its transcript."""
        params = parse_fish_s2_pro_params(parse_params(inputs.scalar(PARAMS, "")))
        if params.ref_audio is None:
            raise InvalidRequest("a voice is stored from ref_audio and ref_text")
        return pack_voice(FAMILY.name, self.fingerprint, {"codes": self.codes(params.ref_audio).numpy()},
                          ref_text=params.ref_text or "")


class FishS2ProTalkerStage(FrameChunkTalkerStage):
    """Frames from the vLLM talker, sent as chunks of codes after up to left_context_frames
    earlier ones, with the window's first frame (the codec's positions are absolute); the
    <|im_end|> frame ends the stream and is not audio."""

    positioned = True

    def __init__(self, context: StageContext, checkpoint: FishCheckpoint | None = None):
        from .vllm_model import prepare_vllm_talker, register

        self.checkpoint = checkpoint or served_checkpoint(context)
        self.talker_dir = prepare_vllm_talker(self.checkpoint)
        register()
        super().__init__(context)

    def model_path(self) -> str:
        return str(self.talker_dir)

    def is_end(self, frame) -> bool:
        return int(frame[0]) == self.checkpoint.config.im_end_id

    def window_codes(self, frames):
        return frames[:, 1:].numpy().astype(np.int32)

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        from vllm import SamplingParams

        from ..vllm_frames import FRAMES_ARG, register, release
        from .dual_ar import FishSampling, FrameSampler
        from .vllm_model import FishStream

        c = self.checkpoint.config
        stream_id, seed = int(inputs.scalar(STREAM_ID)), int(inputs.scalar("seed"))
        prompt = torch.from_numpy(np.array(inputs["prompt"], np.int64))
        if prompt.ndim != 2 or prompt.shape[0] != 1 + c.num_codebooks:
            raise InvalidRequest(f"prompt must be [{1 + c.num_codebooks}, T], got {tuple(prompt.shape)}")
        max_frames = min(int(inputs.scalar("max_frames")), self.max_model_len - prompt.shape[1] - 1)
        if max_frames < 1:
            raise InvalidRequest(f"the prompt needs {prompt.shape[1]} of the talker's {self.max_model_len} "
                                 "positions: shorten the text or the reference")
        overrides = sampling.decode(inputs.scalar(SAMPLING, ""))
        defaults = FishSampling()
        sampler = FrameSampler(torch.Generator().manual_seed(seed), FishSampling(
            float(overrides.get("temperature", defaults.temperature)), float(overrides.get("top_p", defaults.top_p))))
        key = f"{stream_id}"
        stream = FishStream(prompt, sampler)
        register(key, stream)
        # One token more than the audio frames: the <|im_end|> frame that may end them.
        params = SamplingParams(temperature=0.0, max_tokens=max_frames + 1, stop_token_ids=[c.im_end_id],
                                detokenize=False, extra_args={FRAMES_ARG: key})
        try:
            async for chunk in self.frame_chunks(prompt[0].tolist(), params, key, stream.frames, max_frames,
                                                 inputs.cancelled):
                yield chunk
        finally:
            release(key)


class FishS2ProCodecStage(WindowDecoderStage):
    """A chunk's codes -> its 44.1 kHz audio, stateless. The decoder's exact receptive field
    is long (1026 frames at released size: its 8-layer transformer's 128-frame windows
    compound), so the left context the talker sends (25 frames, vLLM-Omni's) makes a chunk
    close to, not exactly, the whole utterance's audio; positions are absolute (first_frame)."""

    window = "codes"
    positioned = True

    def __init__(self, context: StageContext, checkpoint: FishCheckpoint | None = None):
        super().__init__(context)
        torch.set_num_threads(context.int_parameter("torch_threads", 1))
        checkpoint = checkpoint or served_checkpoint(context)
        self.device = torch.device(context.device)
        self.codec = load_served_codec(checkpoint, self.device)
        self.num_codebooks = checkpoint.config.num_codebooks
        self.hop = self.codec.config.hop
        self.sample_rate = self.codec.config.sample_rate

    def check_window(self, window: np.ndarray) -> None:
        if window.ndim != 2 or window.shape[1] != self.num_codebooks:
            raise InvalidRequest(f"codes must be [frames, {self.num_codebooks}], got {tuple(window.shape)}")

    @torch.no_grad()
    def decode_windows(self, windows: np.ndarray, first_frame: int = 0) -> np.ndarray:
        codes = torch.from_numpy(windows.astype(np.int64)).transpose(1, 2).to(self.device)
        return self.codec.decode(codes, first_frame)[:, 0].float().cpu().numpy()
