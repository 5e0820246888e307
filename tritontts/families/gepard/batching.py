"""Gepard's batched stage at streaming shapes (tritontts.benchmark.batching): the codec
decoding a steady chunk of the talker's schedule (model_repository/gepard_talker/1/model.json:
86 frames) after the codec's own left context (NanoCodecConfig.context_frames, 25 frames at
the released rates)."""
from __future__ import annotations

import numpy as np

from ...family import BatchCase
from ...serving.stage import Inputs
from .codec import read_nemo_config
from .stages import GepardCodecStage

NEW = 86


def batch_cases(checkpoint) -> list[BatchCase]:
    codec = read_nemo_config(checkpoint.codec_file)
    context, levels = codec.context_frames, np.asarray(codec.code_levels)

    def request(k: int) -> Inputs:
        rng = np.random.default_rng(k)
        return Inputs(codes=rng.integers(0, levels, (context + NEW, levels.size)).astype(np.int32),
                      left_context=np.array([context]))

    return [BatchCase("gepard_codec", lambda ctx: GepardCodecStage(ctx, checkpoint), request,
                      NEW / codec.frame_rate, f"{NEW} frames after {context} of left context")]
