"""Repetition-aware sampling (RAS, from the CosyVoice lineage; CosyVoice3 and GLM-TTS sample
their speech tokens with it) as one exact per-step distribution, and the request arguments
that turn it on in the vLLM logits processor (tritontts.engine.vllm_ras).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

RAS_ARG = "tritontts_ras"   # SamplingParams.extra_args key that turns RAS on for a request
KNOBS = ("top_p", "top_k", "win_size", "tau_r")


def ras_distribution(logits: torch.Tensor, recent: list[int], top_p: float, top_k: int,
                     win_size: int, tau_r: float, ban_repeated: bool = True) -> torch.Tensor:
    """Upstream's repetition-aware sampling as one distribution (probabilities).

    Upstream draws x from the nucleus (top_p, top_k; stable sort); if x occurs at least
    win_size*tau_r times among the last win_size generated tokens, it draws again from the
    full softmax. CosyVoice bans x from that draw (ban_repeated), so
        P(t) = Pn(t)*[t not repeated] + sum over repeated x != t of Pn(x) * p(t) / (1 - p(x));
    GLM-TTS's copy of ras_sampling does not (x may come back), so
        P(t) = Pn(t)*[t not repeated] + p(t) * sum over repeated x of Pn(x).
    """
    p = logits.float().softmax(-1)
    values, order = p.sort(descending=True, stable=True)
    # Upstream keeps adding tokens while the mass *before* adding is < top_p.
    before = values.cumsum(-1) - values
    keep = (before < top_p) & (torch.arange(p.numel(), device=p.device) < top_k)
    nucleus = torch.zeros_like(p)
    nucleus[order[keep]] = values[keep]
    nucleus /= nucleus.sum()
    window = recent[-win_size:]
    counts = torch.zeros_like(p)
    if window:
        counts.index_add_(0, torch.tensor(window, device=p.device), torch.ones(len(window), device=p.device))
    repeated = (counts >= win_size * tau_r) & (nucleus > 0)
    if not repeated.any():
        return nucleus
    dist = torch.where(repeated, torch.zeros_like(p), nucleus)
    if not ban_repeated:
        return dist + nucleus[repeated].sum() * p
    rep_ids = repeated.nonzero().flatten()
    for x in rep_ids.tolist():
        rest = p.clone()
        rest[x] = 0.0
        dist += nucleus[x] * rest / max(1.0 - float(p[x]), 1e-12)
    return dist


def ras_extra_args(offset: int, size: int, sampling: dict, extra_ids: Sequence[int] = (),
                   min_tokens: int = 0, stop_ids: Sequence[int] = ()) -> dict:
    """extra_args for a request. RAS runs over the candidate rows [offset, offset + size)
    plus `extra_ids` (all other rows get probability 0); `sampling` holds the knobs (top_p,
    top_k, win_size, tau_r). With min_tokens, `stop_ids` are masked out *before* the RAS
    distribution is formed while fewer tokens exist (GLM-TTS's order; vLLM's own min_tokens
    masks after, which equals upstream CosyVoice's resample-on-stop). `sampling` may also
    set ban_repeated (default True, CosyVoice's; GLM-TTS's is False: see ras_distribution)."""
    return {RAS_ARG: {"offset": int(offset), "size": int(size),
                      "extra_ids": [int(i) for i in extra_ids], "min_tokens": int(min_tokens),
                      "stop_ids": [int(i) for i in stop_ids],
                      "ban_repeated": bool(sampling.get("ban_repeated", True)),
                      **{k: sampling[k] for k in KNOBS}}}
