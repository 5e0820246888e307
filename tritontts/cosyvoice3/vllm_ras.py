"""Upstream's repetition-aware sampling (RAS) as a vLLM (v1) logits processor.

A module-level class, named to vLLM as RAS_LOGITS_PROCESSOR, so the engine core process
can import it. Requests opt in through SamplingParams.extra_args (talker.ras_extra_args).
"""
from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from .talker import RAS_ARG, SPEECH_VOCAB, ras_distribution

RAS_LOGITS_PROCESSOR = f"{__name__}:RasLogitsProcessor"


class RasLogitsProcessor(LogitsProcessor):
    """Replaces a row's logits by log of the RAS distribution over the speech rows; vLLM then
    samples it plainly (temperature 1, no top-k/top-p), with the request's seed."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.rows: dict[int, tuple[dict, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None):
        process_dict_updates(
            self.rows, batch_update,
            lambda params, _prompt, output: ((params.extra_args or {})[RAS_ARG], output)
            if RAS_ARG in (params.extra_args or {}) else None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (args, output_ids) in self.rows.items():
            offset = args["speech_offset"]
            speech = logits[row, offset:offset + SPEECH_VOCAB]
            recent = [t - offset for t in output_ids[-args["win_size"]:]]
            dist = ras_distribution(speech, recent, args["top_p"], args["top_k"],
                                    args["win_size"], args["tau_r"])
            logits[row] = float("-inf")
            logits[row, offset:offset + SPEECH_VOCAB] = dist.clamp_min(0).log().to(logits.dtype)
        return logits
