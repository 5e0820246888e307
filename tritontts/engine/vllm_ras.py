"""Repetition-aware sampling (tritontts.nn.ras) as a vLLM (v1) logits processor.

A module-level class, named to vLLM as RAS_LOGITS_PROCESSOR, so vLLM can import it by
name. Requests opt in through SamplingParams.extra_args (tritontts.nn.ras.ras_extra_args).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from ..nn.ras import RAS_ARG, ras_distribution

RAS_LOGITS_PROCESSOR = f"{__name__}:RasLogitsProcessor"


@dataclass
class _Row:
    args: dict
    output_ids: list[int]          # vLLM's live list of the request's generated ids
    candidates: torch.Tensor       # vocabulary rows RAS samples from
    position: dict[int, int]       # extra id -> its index among the candidates
    stops: list[int]               # candidate indices masked until min_tokens are out


def _row(params, _prompt, output_ids) -> _Row | None:
    args = (params.extra_args or {}).get(RAS_ARG)
    if args is None:
        return None
    offset, size, extra = args["offset"], args["size"], args["extra_ids"]
    candidates = torch.cat([torch.arange(offset, offset + size), torch.tensor(extra, dtype=torch.long)])
    position = {t: size + i for i, t in enumerate(extra)}
    stops = [t - offset if offset <= t < offset + size else position[t] for t in args["stop_ids"]]
    return _Row(args, output_ids, candidates, position, stops)


class RasLogitsProcessor(LogitsProcessor):
    """Replaces a row's logits by log of the RAS distribution over its candidate rows; vLLM
    then samples it plainly (temperature 1, no top-k/top-p), with the request's seed."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.rows: dict[int, _Row] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None):
        process_dict_updates(self.rows, batch_update, _row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, row in self.rows.items():
            args = row.args
            candidates = row.candidates.to(logits.device)
            scores = logits[index, candidates].clone()
            if len(row.output_ids) < args["min_tokens"] and row.stops:
                scores[row.stops] = float("-inf")
            offset, size = args["offset"], args["size"]
            recent = [t - offset if offset <= t < offset + size else row.position.get(t, -1)
                      for t in row.output_ids[-args["win_size"]:]]
            dist = ras_distribution(scores, [r for r in recent if r >= 0], args["top_p"],
                                    args["top_k"], args["win_size"], args["tau_r"],
                                    args.get("ban_repeated", True))
            logits[index] = float("-inf")
            logits[index, candidates] = dist.clamp_min(0).log().to(logits.dtype)
        return logits
