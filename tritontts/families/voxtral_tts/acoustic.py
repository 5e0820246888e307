"""Voxtral TTS's per-frame acoustic transformer (ours): the backbone's last hidden state ->
one frame of 37 codes (1 semantic + 36 acoustic), the talker's sub-model inside each step.

  semantic   greedy argmax of semantic_codebook_output over the backbone hidden state itself
             (EMPTY and the padding rows masked); END_AUDIO (1) ends the utterance
  acoustic   flow matching over 36 values: from noise x0 [36], n_decoding_steps Euler steps
             on a uniform grid over [0, 1]; the velocity is a 3-token bidirectional
             transformer over [input_projection(x_t), time_projection(time embedding(t)),
             llm_projection(hidden)] read at token 0 through acoustic_codebook_output; CFG
             v = a * v(hidden) + (1 - a) * v(zero hidden), a = 1.2; then x clamped to [-1, 1]
             and rounded to one of 21 levels; an END frame's acoustic codes are EMPTY
  offsets    every code leaves shifted by the 2 special codes (EMPTY 0, END 1), as the
             talker feeds them back and the codec stage subtracts them again

Parameter names are the checkpoint's under `acoustic_transformer.`; the noise is an argument
(a request's own generator draws it), so a seed reproduces a frame on any device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import ConfigFields
from ...nn.llama_format import Block

EMPTY_AUDIO, END_AUDIO = 0, 1
SPECIAL_CODES = 2
PREFIX = "acoustic_transformer."


def _round_up(n: int, multiple: int) -> int:
    return multiple * ((n + multiple - 1) // multiple)


@dataclass(frozen=True)
class AcousticConfig:
    """params.json's multimodal.audio_model_args (codebook sizes and
    acoustic_transformer_args)."""
    input_dim: int                 # the backbone's hidden size
    dim: int
    n_layers: int
    head_dim: int
    hidden_dim: int
    n_heads: int
    n_kv_heads: int
    use_biases: bool = False
    norm_eps: float = 1e-5
    n_decoding_steps: int = 7
    semantic_codebook_size: int = 8192
    acoustic_codebook_size: int = 21
    n_acoustic_codebook: int = 36

    @property
    def semantic_rows(self) -> int:
        """semantic_codebook_output's rows: codes + specials, padded to a multiple of 128."""
        return _round_up(self.semantic_codebook_size + SPECIAL_CODES, 128)

    @property
    def codebook_sizes(self) -> list[int]:
        """Each of the 37 codebooks with the special codes: the talker's embedding table."""
        return [self.semantic_codebook_size + SPECIAL_CODES] + \
               [self.acoustic_codebook_size + SPECIAL_CODES] * self.n_acoustic_codebook

    @property
    def embedding_rows(self) -> int:
        """Rows of the talker's one codebook-embedding table: all codebooks, padded to 128."""
        return _round_up(sum(self.codebook_sizes), 128)

    @classmethod
    def from_dict(cls, data: dict[str, Any], fields: ConfigFields) -> "AcousticConfig":
        sizes = data.get("codebook_sizes")
        if sizes is not None:       # "8192,21,21,...": the other spelling upstream accepts
            values = [int(v) for v in str(sizes).split(",")]
            if len(set(values[1:])) != 1:
                fields.fail("codebook_sizes", "must give one size for all acoustic codebooks")
            semantic, acoustic, n = values[0], values[1], len(values) - 1
        else:
            semantic = fields.int("semantic_codebook_size", 8192, low=1)
            acoustic = fields.int("acoustic_codebook_size", 21, low=2)
            n = fields.int("n_acoustic_codebook", 36, low=1)
        t = fields.object("acoustic_transformer_args")
        config = cls(
            input_dim=t.int("input_dim", low=1), dim=t.int("dim", low=1), n_layers=t.int("n_layers", 3, low=1),
            head_dim=t.int("head_dim", low=1), hidden_dim=t.int("hidden_dim", low=1),
            n_heads=t.int("n_heads", low=1), n_kv_heads=t.int("n_kv_heads", low=1),
            use_biases=t.bool("use_biases", False), norm_eps=t.float("norm_eps", 1e-5),
            n_decoding_steps=t.int("n_decoding_steps", 7, low=1),
            semantic_codebook_size=semantic, acoustic_codebook_size=acoustic, n_acoustic_codebook=n)
        if config.dim != config.input_dim:
            # The semantic head reads the backbone's hidden state with the acoustic width.
            t.fail("dim", f"must equal input_dim ({config.input_dim}): the semantic head reads the "
                          "backbone's hidden state")
        if config.n_heads % config.n_kv_heads:
            t.fail("n_kv_heads", f"must divide n_heads ({config.n_heads})")
        return config


class Attention(nn.Module):
    """Full attention over the 3 tokens, no position encoding (bias on wq, wv, wo only when
    use_biases, as upstream)."""

    def __init__(self, c: AcousticConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=c.use_biases)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=c.use_biases)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=c.use_biases)

    def forward(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        q = self.wq(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, n, -1))


class TimeEmbedding(nn.Module):
    """Sinusoids of t, cos half first (inv_freq is a stored buffer upstream; recomputed)."""

    def __init__(self, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        half = dim // 2
        self.register_buffer("inv_freq", torch.exp(-math.log(theta) * torch.arange(half).float() / half),
                             persistent=False)

    def forward(self, t: Tensor) -> Tensor:
        angles = t[:, None] * self.inv_freq.to(t.dtype)
        return torch.cat((angles.cos(), angles.sin()), dim=-1)


class AcousticTransformer(nn.Module):
    def __init__(self, c: AcousticConfig) -> None:
        super().__init__()
        self.config = c
        self.time_embedding = TimeEmbedding(c.dim)
        self.input_projection = nn.Linear(c.n_acoustic_codebook, c.dim, bias=False)
        self.time_projection = nn.Linear(c.dim, c.dim, bias=False)
        self.llm_projection = nn.Linear(c.input_dim, c.dim, bias=False)
        self.semantic_codebook_output = nn.Linear(c.dim, c.semantic_rows, bias=c.use_biases)
        self.acoustic_codebook_output = nn.Linear(c.dim, c.n_acoustic_codebook, bias=False)
        self.layers = nn.ModuleDict({str(i): Block(Attention(c), c.dim, c.hidden_dim, c.norm_eps)
                                     for i in range(c.n_layers)})
        self.norm = nn.RMSNorm(c.dim, eps=c.norm_eps)

    def semantic(self, hidden: Tensor) -> Tensor:
        """[B, input_dim] -> the semantic code [B] (shifted: END_AUDIO or 2 + index)."""
        logits = self.semantic_codebook_output(hidden).float()
        logits[:, EMPTY_AUDIO] = float("-inf")
        logits[:, SPECIAL_CODES + self.config.semantic_codebook_size:] = float("-inf")
        return logits.argmax(dim=-1)

    def velocity(self, x: Tensor, time: Tensor, condition: Tensor) -> Tensor:
        """x [B, 36], time projection [B, D], llm projection [B, D] -> velocity [B, 36]."""
        h = torch.stack([self.input_projection(x.to(condition.dtype)), time, condition], dim=1)
        for layer in self.layers.values():
            h = layer(h)
        return self.acoustic_codebook_output(self.norm(h)[:, 0])

    def flow(self, hidden: Tensor, noise: Tensor, cfg: Tensor | float = 1.2, steps: int | None = None) -> Tensor:
        """The acoustic values in [-1, 1] before rounding: hidden [B, input_dim], noise
        [B, 36] (standard normal), cfg one value or [B]."""
        c = self.config
        b, dtype = hidden.shape[0], hidden.dtype
        grid = torch.linspace(0, 1, (steps or c.n_decoding_steps) + 1, device=hidden.device).to(dtype)
        times = self.time_projection(self.time_embedding(grid).to(dtype))
        condition = self.llm_projection(torch.cat([hidden, torch.zeros_like(hidden)]))
        alpha = torch.as_tensor(cfg, dtype=dtype, device=hidden.device).reshape(-1, 1)
        x = noise.to(dtype)
        for i in range(grid.shape[0] - 1):
            time = times[i].expand(2 * b, -1)
            v = self.velocity(torch.cat([x, x]), time, condition)
            x = x + (alpha * v[:b] + (1 - alpha) * v[b:]) * (grid[i + 1] - grid[i])
        return x.clamp(-1, 1)

    def frame(self, hidden: Tensor, noise: Tensor, cfg: Tensor | float = 1.2, steps: int | None = None) -> Tensor:
        """One frame of codes [B, 37] as the talker feeds them back (shifted by 2)."""
        semantic = self.semantic(hidden)
        levels = self.config.acoustic_codebook_size
        acoustic = ((self.flow(hidden, noise, cfg, steps) + 1) / 2 * (levels - 1)).round().long()
        acoustic[semantic == END_AUDIO] = EMPTY_AUDIO
        return torch.cat([semantic[:, None], acoustic + SPECIAL_CODES], dim=1)
