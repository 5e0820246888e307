"""What models in the original LLaMA checkpoint format share (Mistral's consolidated
safetensors: Voxtral TTS; Fish Speech's text model and fast decoder): the pre-norm residual
block under that format's names (attention, feed_forward.w1/w2/w3, attention_norm, ffn_norm),
RoPE on interleaved pairs (x0, x1), (x2, x3), ..., and the row reordering that gives the same
attention under kernels that rotate halves (vLLM's, transformers')."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """x + attention(norm x), then + feed_forward(norm x); the attention is the model's own
    (its extra arguments, such as positions and a cache, are passed through)."""

    def __init__(self, attention: nn.Module, dim: int, hidden_dim: int, eps: float) -> None:
        super().__init__()
        self.attention = attention
        self.feed_forward = FeedForward(dim, hidden_dim)
        self.attention_norm = nn.RMSNorm(dim, eps=eps)
        self.ffn_norm = nn.RMSNorm(dim, eps=eps)

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        x = x + self.attention(self.attention_norm(x), *args, **kwargs)
        return x + self.feed_forward(self.ffn_norm(x))


def interleaved_rope(x: Tensor, positions: Tensor, theta: float, table_dtype: torch.dtype | None = None) -> Tensor:
    """x [..., T, heads, head_dim] rotated pairwise (2i, 2i + 1) by position x theta^(-2i/d);
    positions [T]. `table_dtype` rounds the cos / sin tables through that dtype first (Fish
    Speech stores them in bfloat16, and its model was trained so)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv_freq                   # [T, d/2]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]          # [T, 1, d/2]
    if table_dtype is not None:
        cos, sin = cos.to(table_dtype).float(), sin.to(table_dtype).float()
    pairs = x.float().unflatten(-1, (d // 2, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


def rotate_half_rows(weight: Tensor, heads: int) -> Tensor:
    """Rows of a query / key projection (or a per-head norm's weight, heads=1) reordered per
    head from interleaved pairs to halves ((x0, x2, ...), then (x1, x3, ...)): the same
    attention under RoPE that rotates halves."""
    if weight.ndim == 1:
        return rotate_half_rows(weight[:, None], heads)[:, 0]
    out_dim, dim = weight.shape
    head_dim = out_dim // heads
    return weight.view(heads, head_dim // 2, 2, dim).transpose(1, 2).reshape(out_dim, dim)
