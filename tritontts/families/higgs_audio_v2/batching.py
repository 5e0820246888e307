"""higgs-audio v2's batched stage at its shapes (tritontts.benchmark.batching): a streaming
chunk (25 frames of the 25 Hz codec, the talker's `chunks.frames`) with the codec's context
frames on each side, decoded whole."""
from __future__ import annotations

import numpy as np

from ...family import BatchCase
from ...serving.stage import Inputs
from .stages import HiggsAudioV2DecoderStage, codec_context_frames

FRAME_HZ, FRAMES = 25, 25


def batch_cases(checkpoint) -> list[BatchCase]:
    context = codec_context_frames(checkpoint)

    def request(k: int) -> Inputs:
        rng = np.random.default_rng(k)
        return Inputs(codes=rng.integers(0, 1024, (FRAMES + 2 * context, 8)).astype(np.int32),
                      left_context=np.array([context], np.int32), right_context=np.array([context], np.int32))

    return [BatchCase("higgs_audio_v2_decoder", lambda c: HiggsAudioV2DecoderStage(c, checkpoint), request,
                      FRAMES / FRAME_HZ, f"a {FRAMES}-frame chunk with {context} frames of context each side")]
