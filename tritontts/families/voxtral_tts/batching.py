"""Voxtral TTS's batched stage at streaming shapes (tritontts.benchmark.batching): the codec
decoding a steady chunk of the talker's schedule (model_repository/voxtral_tts_talker/1/
model.json: 25 frames after 25 of left context)."""
from __future__ import annotations

import numpy as np

from ...family import BatchCase
from ...serving.stage import Inputs
from .stages import VoxtralTTSCodecStage

NEW, CONTEXT = 25, 25


def batch_cases(checkpoint) -> list[BatchCase]:
    codec = checkpoint.config.codec
    # Each frame: the semantic code, then the acoustic codes (0-based, as the stage takes them).
    high = np.array([codec.semantic_codebook_size] + [codec.acoustic_codebook_size] * codec.acoustic_dim)

    def request(k: int) -> Inputs:
        rng = np.random.default_rng(k)
        return Inputs(codes=rng.integers(0, high, (CONTEXT + NEW, high.size)).astype(np.int32),
                      left_context=np.array([CONTEXT]))

    return [BatchCase("voxtral_tts_codec", lambda ctx: VoxtralTTSCodecStage(ctx, checkpoint), request,
                      NEW * codec.samples_per_frame / codec.sampling_rate,
                      f"{NEW} frames after {CONTEXT} of left context")]
