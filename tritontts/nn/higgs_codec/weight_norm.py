"""Folding a parametrized weight norm (original0 = g, original1 = v) into plain weights,
its norm dims read from g's shape, in float32: what the codec's checkpoints need."""
from __future__ import annotations

import torch
from torch import Tensor

_NORM_PAIRS = ((".parametrizations.weight.original0", ".parametrizations.weight.original1"),
               (".weight_g", ".weight_v"))


def _norm_dims(g_shape: tuple[int, ...], v_shape: tuple[int, ...]) -> list[int]:
    """The dims weight norm takes ||v|| over: those where g has size 1 (weight_norm's
    `dim` is the one g keeps), less those where v has size 1 too, which change nothing
    (and so a single-channel conv's g, all ones in shape, still means its usual dims)."""
    if len(g_shape) != len(v_shape):
        return list(range(len(v_shape)))
    return [d for d in range(len(v_shape)) if g_shape[d] == 1 and v_shape[d] != 1]


def _fold_pair(g: Tensor, v: Tensor) -> Tensor:
    """The weight g * v / ||v||."""
    g, v = g.float(), v.float()
    dims = _norm_dims(tuple(g.shape), tuple(v.shape))
    return v * (g / torch.linalg.vector_norm(v, dim=dims, keepdim=True))


def _fold_norm_pairs(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Replace each weight-norm (g, v) pair by its weight (_fold_pair)."""
    out = dict(tensors)
    for g_suffix, v_suffix in _NORM_PAIRS:
        for g_key in [k for k in out if k.endswith(g_suffix)]:
            stem = g_key[:-len(g_suffix)]
            v_key = stem + v_suffix
            if v_key not in out:
                continue        # left unmatched: load_strict names it as unexpected
            out[stem + ".weight"] = _fold_pair(out.pop(g_key), out.pop(v_key))
    return out
