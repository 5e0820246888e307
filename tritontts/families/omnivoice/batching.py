"""OmniVoice's batched stage at its shapes (tritontts.benchmark.batching): a segment (a
sentence, ~4 s: 100 frames of the 25 Hz codec) decoded whole."""
from __future__ import annotations

import numpy as np

from ...family import BatchCase
from ...serving.stage import Inputs
from .stages import OmniVoiceDecoderStage

FRAME_HZ, FRAMES = 25, 100


def batch_cases(checkpoint) -> list[BatchCase]:
    def request(k: int) -> Inputs:
        rng = np.random.default_rng(k)
        return Inputs(codes=rng.integers(0, 1024, (FRAMES, 8)).astype(np.int32),
                      ref_rms=np.array([0.05], np.float32), speed=np.array([1.0], np.float32))

    return [BatchCase("omnivoice_decoder", lambda context: OmniVoiceDecoderStage(context, checkpoint), request,
                      FRAMES / FRAME_HZ, f"a {FRAMES}-frame segment")]
