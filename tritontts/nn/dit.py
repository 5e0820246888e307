"""Diffusion-transformer (F5-TTS lineage) building blocks shared by the flow-matching
decoders of CosyVoice3 (tritontts.families.cosyvoice3.flow) and GLM-TTS (tritontts.families.glm_tts.flow), and
the pieces of AuK's MMDiT (tritontts.families.auk.dit) whose math is the same.

Both families' DiTs are the same network around different input embeddings: AdaLN-Zero
blocks modulated by the flow time embedding (GLM-TTS appends the speaker vector to it:
`cond_dim`), rotary positions on head 0 only, tanh-GELU feed-forward. Parameter names follow
upstream so released checkpoints load with strict key matching.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class TimestepEmbedding(nn.Module):
    """Flow time t in [0, 1] -> [B, dim]: 256 sinusoids of 1000 * t, then a SiLU MLP."""

    def __init__(self, dim: int, freq_embed_dim: int = 256) -> None:
        super().__init__()
        self.freq_embed_dim = freq_embed_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_embed_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_embed_dim // 2
        step = math.log(10000) / (half - 1)
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -step)
        # Same operation order as upstream ((1000 * t) * f) so rounding matches too.
        phase = 1000 * t.unsqueeze(1) * freqs.unsqueeze(0)
        # Cast to the MLP's dtype, not t's: t stays fp32 for half-precision weights (a bf16 t
        # would put 1000 * t several radians off), and this is a no-op when the two agree.
        return self.time_mlp(torch.cat([phase.sin(), phase.cos()], dim=-1)
                             .to(self.time_mlp[0].weight.dtype))


class RotaryEmbedding(nn.Module):
    """Rotary angles for positions 0..T-1 over `dim` channels, in adjacent-pair layout
    (channels 2i and 2i+1 share frequency i). `inv_freq` is persistent because upstream's
    (x-transformers) buffer is, so flow.pt carries it."""

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    def forward(self, seq_len: int) -> torch.Tensor:
        """-> angles [T, dim]."""
        pos = torch.arange(seq_len, device=self.inv_freq.device).type_as(self.inv_freq)
        return (pos[:, None] * self.inv_freq[None, :]).repeat_interleave(2, dim=-1)


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the first angles.shape[-1] channels of x [B, T, C] pairwise; leave the rest.

    The DiT calls this on the concatenated heads, before splitting them, so only head 0 is
    rotated: that is how upstream (F5-TTS lineage) applies it and what the weights learned.
    """
    width = angles.shape[-1]
    rot, rest = x[..., :width], x[..., width:]
    pairs = rot.unflatten(-1, (width // 2, 2))
    swapped = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    rot = rot * angles.cos() + swapped * angles.sin()
    return torch.cat([rot, rest], dim=-1)


class ConvPositionEmbedding(nn.Module):
    """Relative position signal: two centred grouped convs (31 taps), Mish after each.

    With `valid` [B, T] (True = real frame; padding only at the end) padded frames are zeroed
    before and after each conv, so a padded row sees exactly the zero border it would see
    unpadded (Mish(0) = 0 keeps them zero). Without it (GLM-TTS) nothing is masked.
    """

    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16) -> None:
        super().__init__()
        self.conv1d = nn.Sequential(
            nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=kernel_size // 2), nn.Mish(),
            nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=kernel_size // 2), nn.Mish())

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        h = x.transpose(1, 2)
        if valid is None:
            return self.conv1d(h).transpose(1, 2)
        pad = ~valid[:, None, :]
        h = h.masked_fill(pad, 0.0)
        for layer in self.conv1d:
            h = layer(h)
            if isinstance(layer, nn.Conv1d):
                h = h.masked_fill(pad, 0.0)  # the bias lands on padded frames too
        return h.transpose(1, 2)


class AdaLayerNormZero(nn.Module):
    """Block modulation from the time embedding: returns the attention input
    (LayerNorm(x) * (1 + scale) + shift) and the gate/shift/scale the block uses later."""

    def __init__(self, dim: int, cond_dim: int = 0) -> None:
        super().__init__()
        self.linear = nn.Linear(dim + cond_dim, dim * 6)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shift, scale, gate, shift_ff, scale_ff, gate_ff = self.linear(F.silu(emb)).chunk(6, dim=1)
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None], gate, shift_ff, scale_ff, gate_ff


class AdaLayerNormZeroFinal(nn.Module):
    """Final modulation before the output projection (note: scale comes before shift)."""

    def __init__(self, dim: int, cond_dim: int = 0) -> None:
        super().__init__()
        self.linear = nn.Linear(dim + cond_dim, dim * 2)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.linear(F.silu(emb)).chunk(2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class FeedForward(nn.Module):
    """Linear -> tanh-GELU -> Linear. Index 1 of `ff` is the (inference no-op) dropout slot,
    kept so the second Linear is `ff.2` as in flow.pt."""

    def __init__(self, dim: int, mult: float = 4) -> None:
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
                                nn.Identity(), nn.Linear(inner, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class Attention(nn.Module):
    """Multi-head self-attention with rotary positions and a boolean attention mask."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads = heads
        self.dim_head = dim_head
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])  # `to_out.0`, as in flow.pt

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, valid: torch.Tensor,
                angles: torch.Tensor) -> torch.Tensor:
        """x [B, T, D]; attn_mask [B, 1, T, T] (True = may attend); valid [B, T]."""
        b, t, _ = x.shape
        q = apply_rotary(self.to_q(x), angles)
        k = apply_rotary(self.to_k(x), angles)
        v = self.to_v(x)
        q, k, v = (z.view(b, t, self.heads, self.dim_head).transpose(1, 2) for z in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        out = self.to_out[0](out.transpose(1, 2).reshape(b, t, self.heads * self.dim_head))
        # Padded frames carry no attention output.
        return out.masked_fill(~valid[..., None], 0.0)


class DiTBlock(nn.Module):
    """AdaLN-Zero transformer block: gated attention residual, then gated feed-forward."""

    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: float = 4,
                 cond_dim: int = 0) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim, cond_dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x: torch.Tensor, t_emb: torch.Tensor, attn_mask: torch.Tensor,
                valid: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        h, gate, shift_ff, scale_ff, gate_ff = self.attn_norm(x, t_emb)
        x = x + gate.unsqueeze(1) * self.attn(h, attn_mask, valid, angles)
        h = self.ff_norm(x) * (1 + scale_ff[:, None]) + shift_ff[:, None]
        return x + gate_ff.unsqueeze(1) * self.ff(h)
