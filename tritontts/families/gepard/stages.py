"""The Gepard-1.0 stages (each a tritontts.serving.stage class named by its config.pbtxt):

  gepard_prompt  GepardPromptStage  text -> the talker's prompt ids (speaker slots, the text
                                    repeated when short, start_of_speech)
  gepard_talker  GepardTalkerStage  vLLM: the Qwen3.5 backbone; the 32 FSQ heads and the stop
                                    head in every step; one response per chunk of frames
                                    (10, then 86) with left context
  gepard_codec   GepardCodecStage   a chunk's codes -> 22.05 kHz audio (NanoCodec), stateless,
                                    windows of equal length decoded as one batch

The checkpoint path comes from the launcher (`--checkpoint gepard=DIR`, passed to the stages
as TRITONTTS_GEPARD_CHECKPOINT); tests hand a checkpoint in directly.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import numpy as np
import torch

from ...weights.checkpoint import CheckpointError
from ...protocol import STREAM_ID, InvalidRequest
from ...serving.stage import (
    PREPARES_REQUESTS,
    Inputs, Stage, StageContext, begin_request, default_voice_only)
from ...serving.window_decoder import WindowDecoderStage
from ...engine.vllm_talker import FrameChunkTalkerStage
from .checkpoint import GepardCheckpoint
from .family import FAMILY
from .request import DEFAULT_MAX_NEW_TOKENS, parse_gepard_params


def load_served_codec(checkpoint: GepardCheckpoint, device: str | torch.device = "cpu"):
    """The checkpoint's NanoCodec decoder, checked against the sidecar: the talker's 32 codes
    must be the codec's per-dimension FSQ codes at its rate."""
    from .codec import NanoCodecDecoder

    codec = NanoCodecDecoder.from_nemo(checkpoint.codec_file, device)
    c, k = checkpoint.config, codec.config
    if tuple(k.levels) * k.num_groups != c.head_levels or k.sample_rate != c.sample_rate:
        raise CheckpointError(f"{checkpoint.codec_file}: the codec's FSQ ({k.num_groups} x {list(k.levels)}) at "
                              f"{k.sample_rate} Hz does not take gepard_config.json's codes "
                              f"({c.codec_groups} x {list(c.fsq_levels)} at {c.sample_rate} Hz)")
    return codec


class GepardPromptStage(Stage):
    one_by_one = PREPARES_REQUESTS

    def __init__(self, context: StageContext, checkpoint: GepardCheckpoint | None = None):
        from .prompt import GepardPromptBuilder

        super().__init__(context)
        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.build = GepardPromptBuilder(self.checkpoint.root, self.checkpoint.config)

    def run(self, inputs: Inputs) -> dict[str, Any]:
        start = begin_request(inputs, parse_gepard_params)
        default_voice_only(start.voice, "gepard speaks in its default voice only "
                           "(use voice 'default')")
        text_ids = self.build.text_ids(start.text)
        if not text_ids:
            raise InvalidRequest("input has nothing to speak")
        from .prompt import prompt_ids

        return {"ids": np.asarray(prompt_ids(text_ids, self.checkpoint.config), np.int64),
                "max_frames": start.params.max_new_tokens or DEFAULT_MAX_NEW_TOKENS, "seed": start.seed,
                STREAM_ID: start.stream_id}


class GepardTalkerStage(FrameChunkTalkerStage):
    """Frames from the vLLM talker, sent as chunks of the codec's 32 codes after up to
    left_context_frames earlier ones; a stop frame (the stop head fired) ends the stream and
    is not audio."""

    def __init__(self, context: StageContext, checkpoint: GepardCheckpoint | None = None):
        from .vllm_model import prepare_vllm_talker, register

        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.talker_dir = prepare_vllm_talker(self.checkpoint)
        register()
        from .codec import read_nemo_config

        # The codec's receptive field (25 frames at released sizes): chunks decode exactly.
        super().__init__(context, read_nemo_config(self.checkpoint.codec_file).context_frames)

    def model_path(self) -> str:
        return str(self.talker_dir)

    def is_end(self, frame) -> bool:
        from .vllm_model import STOP

        return bool(frame[STOP])

    def window_codes(self, frames):
        from .vllm_model import STOP

        return frames[:, :STOP].numpy().astype(np.int32)

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        from .vllm_model import GepardStream

        stream_id, seed = int(inputs.scalar(STREAM_ID)), int(inputs.scalar("seed"))
        ids = torch.from_numpy(np.array(inputs.flat("ids"), np.int64))
        max_frames = self.frame_budget(ids.shape[0], int(inputs.scalar("max_frames")))
        stream = GepardStream(ids, torch.Generator().manual_seed(seed))
        async for chunk in self.stream_frames(ids.tolist(), stream, f"{stream_id}", max_frames,
                                              self.checkpoint.config.end_of_speech, inputs.cancelled):
            yield chunk


class GepardCodecStage(WindowDecoderStage):
    """A chunk's codes -> its 22.05 kHz audio, stateless: NanoCodec's decoder is causal, so
    with the left context the talker sends (at least its receptive field) a chunk decodes
    exactly as the whole utterance would."""

    window = "codes"

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: GepardCheckpoint | None = None):
        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        self.codec = load_served_codec(checkpoint, self.device)
        self.samples_per_frame = self.codec.config.samples_per_frame
        self.sample_rate = self.codec.config.sample_rate
        self.levels = np.asarray(self.codec.config.code_levels)

    def check_window(self, window: np.ndarray) -> None:
        if window.ndim != 2 or window.shape[1] != self.levels.shape[0]:
            raise InvalidRequest(f"codes must be [frames, {self.levels.shape[0]}], got {tuple(window.shape)}")
        if window.size and (bool((window < 0).any()) or bool((window >= self.levels).any())):
            raise InvalidRequest("a code is outside its FSQ dimension's levels")

    def decode_windows(self, windows: np.ndarray) -> np.ndarray:
        codes = torch.from_numpy(windows.astype(np.int64)).transpose(1, 2).to(self.device)
        return self.codec.decode_codes(codes).float().cpu().numpy()
