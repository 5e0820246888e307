"""Qwen3-TTS's batched stage at streaming shapes (tritontts.benchmark.batching): a steady
chunk of the talker's schedule (model_repository/qwen3_tts_talker/1/model.json: 25 new
frames) early in a stream (100 frames of left context; a long stream's reach 580)."""
from __future__ import annotations

import numpy as np

from ...family import BatchCase
from ...serving.stage import Inputs
from .stages import Qwen3TTSCode2WavStage

FRAME_HZ = 12.5
NEW, CONTEXT = 25, 100
CODEBOOKS = 16                       # the 12 Hz tokenizer's quantizers


def batch_cases(checkpoint) -> list[BatchCase]:
    def request(k: int) -> Inputs:
        rng = np.random.default_rng(k)
        return Inputs(codes=rng.integers(0, 1024, (CONTEXT + NEW, CODEBOOKS)).astype(np.int32),
                      left_context=np.array([CONTEXT]))

    return [BatchCase("qwen3_tts_code2wav", lambda context: Qwen3TTSCode2WavStage(context, checkpoint), request,
                      NEW / FRAME_HZ, f"{NEW} frames after {CONTEXT} of left context")]
