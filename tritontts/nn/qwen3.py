"""The Qwen3 decoder in plain PyTorch, shared by the families built on it (Qwen3-TTS's
talker and code predictor, OmniVoice's bidirectional generator): QK-norm attention with
grouped-query heads, SwiGLU MLP, RMSNorm computed in float32, 1-D RoPE in the half-split
layout. Parameter names are Hugging Face's Qwen3Model names (layers.N.self_attn.q_proj, ...),
so checkpoints load strictly under their own prefix.

Attention is causal by default (a talker with a KV cache); OmniVoice passes its own mask
(bidirectional within each packed sequence) and positions.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .qwen3_shape import Qwen3Shape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Normalized in float32 (or wider: float64 tests) whatever the model dtype, as the
        # references do.
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype
                 ) -> tuple[Tensor, Tensor]:
    """cos, sin [..., T, head_dim] for positions [..., T] (frequencies and angles in float32)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64,
                                            device=positions.device).float() / head_dim)
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class KVCache:
    """Keys and values per layer, [B, kv_heads, T, head_dim]; every row has the same length."""

    def __init__(self, num_layers: int):
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        # Qwen3's QK-norm: RMSNorm over each head's vector, before RoPE.
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, layer: int,
                mask: Tensor | None = None) -> Tensor:
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            k, v = cache.extend(layer, k, v)
        # Grouped-query attention: query head h reads key/value head h // (heads / kv_heads).
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        if mask is None and t > 1:
            # Causal over the cached past and the new positions (a lone new position sees all).
            past = k.shape[2] - t
            mask = (torch.arange(past + t, device=x.device)[None]
                    <= past + torch.arange(t, device=x.device)[:, None])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Shape):
        super().__init__()
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim, cfg.rms_norm_eps, cfg.attention_bias)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, layer: int,
                mask: Tensor | None = None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Stack(nn.Module):
    """Decoder layers and the final norm, over input embeddings: hidden states [B, T, H]
    (after the norm) for positions cache.length, cache.length + 1, ..."""

    def __init__(self, cfg: Qwen3Shape):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head_dim, self.rope_theta = cfg.head_dim, cfg.rope_theta

    def forward(self, x: Tensor, cache: KVCache | None = None, mask: Tensor | None = None,
                positions: Tensor | None = None) -> Tensor:
        """`mask` (bool, broadcast to [B, heads, T, T]: True = may attend) replaces the causal
        mask; `positions` ([T] or [B, T]) replace cache.length, cache.length + 1, ..."""
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + x.shape[1], device=x.device)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        if cos.dim() == 3:          # per-row positions: broadcast over the heads
            cos, sin = cos[:, None], sin[:, None]
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, index, mask)
        return self.norm(x)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers))
