"""CosyVoice3's batched stages at streaming shapes (tritontts.benchmark.batching): a
stream's third chunk as the talker's hop schedule (15, 30, 60 tokens) makes it, after a
3 s reference (75 prompt tokens). Random prompt features: the compute is the same."""
from __future__ import annotations

import numpy as np

from ...family import BatchCase
from ...serving.stage import Inputs
from .stages import TOKEN_MEL_RATIO, CosyVoice3FlowStage, CosyVoice3HiftStage

TOKEN_HZ = 25
PROMPT_TOKENS, SO_FAR, NEW, LOOKAHEAD = 75, 45, 30, 3


def batch_cases(checkpoint) -> list[BatchCase]:
    mels = 80                                            # the flow's and HiFT's mel bins

    def flow_request(k: int) -> Inputs:
        rng = np.random.default_rng(k)
        return Inputs(speech_tokens=rng.integers(0, 6561, SO_FAR + LOOKAHEAD).astype(np.int32),
                      prompt_tokens=rng.integers(0, 6561, PROMPT_TOKENS).astype(np.int32),
                      prompt_mel=rng.standard_normal((TOKEN_MEL_RATIO * PROMPT_TOKENS, mels)).astype(np.float32),
                      embedding=rng.standard_normal(192).astype(np.float32), segment_end=np.array([False]))

    def hift_request(k: int) -> Inputs:
        rng = np.random.default_rng(k)
        return Inputs(mel=rng.standard_normal((TOKEN_MEL_RATIO * SO_FAR, mels)).astype(np.float32) - 5.0,
                      token_offset=np.array([SO_FAR - NEW]), segment_end=np.array([False]))

    return [
        BatchCase("cosyvoice3_flow", lambda context: CosyVoice3FlowStage(context, checkpoint), flow_request,
                  NEW / TOKEN_HZ, f"{SO_FAR}+{LOOKAHEAD} tokens so far, {PROMPT_TOKENS} prompt tokens"),
        BatchCase("cosyvoice3_hift", lambda context: CosyVoice3HiftStage(context, checkpoint), hift_request,
                  NEW / TOKEN_HZ, f"mel of {SO_FAR} tokens, {NEW} new"),
    ]
