"""The MiniCPM4 decoder-layer stack: muP-scaled residuals, LongRoPE, GQA. VoxCPM2's local
modules (LocEnc, LocDiT) run it without a KV cache over a handful of tokens, both ways; the
talker's two language models (tritontts.families.voxcpm2.talker) run it causally, here over the whole
sequence (the plain-PyTorch talker) or, with vLLM's paged attention swapped in for the
attention core, inside the served engine (tritontts.families.voxcpm2.vllm_model).

Module and parameter names follow upstream's (voxcpm.modules.minicpm4.model.MiniCPMModel with
vocab_size 0: `layers.N.self_attn.q_proj`, ..., `norm.weight`), so the sub-trees of the
released model.safetensors load strictly. The rotary tables are not parameters upstream
either (non-persistent buffers), so they are computed here for the lengths actually used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The same fp32-statistic RMSNorm and SwiGLU MLP as Qwen3's (their weight names too).
from ...nn.qwen3 import MLP, RMSNorm


@dataclass(frozen=True)
class MiniCPM4Config:
    """What a cache-less MiniCPM4 stack needs from upstream's MiniCPM4Config."""
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    rms_norm_eps: float = 1e-5
    use_mup: bool = True
    scale_depth: float = 1.4
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    original_max_position_embeddings: int = 32768
    long_factor: tuple[float, ...] = field(default=())
    short_factor: tuple[float, ...] = field(default=())
    kv_channels: int | None = None
    no_rope: bool = False

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_lm_config(cls, lm: dict[str, Any], **overrides: Any) -> "MiniCPM4Config":
        """From a checkpoint's `lm_config` dict, with `overrides` (field name -> value)."""
        rope = lm.get("rope_scaling") or {}
        values = {
            "hidden_size": lm["hidden_size"],
            "intermediate_size": lm["intermediate_size"],
            "num_attention_heads": lm["num_attention_heads"],
            "num_key_value_heads": lm["num_key_value_heads"],
            "num_hidden_layers": lm["num_hidden_layers"],
            "rms_norm_eps": lm["rms_norm_eps"],
            "use_mup": lm.get("use_mup", True),
            "scale_depth": lm["scale_depth"],
            "rope_theta": lm["rope_theta"],
            "max_position_embeddings": lm["max_position_embeddings"],
            "original_max_position_embeddings": rope.get(
                "original_max_position_embeddings", lm["max_position_embeddings"]),
            "long_factor": tuple(rope.get("long_factor", ())),
            "short_factor": tuple(rope.get("short_factor", ())),
            "kv_channels": lm.get("kv_channels"),
            "no_rope": lm.get("no_rope", False),
        }
        values.update(overrides)
        return cls(**values)

    @classmethod
    def for_local_module(cls, lm: dict[str, Any], module: dict[str, Any]) -> "MiniCPM4Config":
        """The config of LocEnc (`encoder_config`) or LocDiT (`dit_config`): upstream copies
        `lm_config` and replaces only width, depth, head count and head size, so the KV head
        count, norm eps, muP and RoPE settings are the backbone's."""
        return cls.from_lm_config(
            lm,
            hidden_size=module.get("hidden_dim", 1024),
            intermediate_size=module.get("ffn_dim", 4096),
            num_attention_heads=module.get("num_heads", 16),
            num_hidden_layers=module.get("num_layers", 4),
            kv_channels=module.get("kv_channels"),
        )


def long_rope_table(config: MiniCPM4Config, length: int, device: torch.device | str
                    ) -> tuple[Tensor, Tensor]:
    """fp32 cos, sin [length, head_dim] of MiniCPM's LongRoPE for positions 0..length-1.

    Upstream builds its table once for max_position_embeddings positions, so which factor
    list applies depends on that configured maximum, not on the sequence at hand: the long
    factors whenever max_position_embeddings exceeds the original one. The attention
    temperature sqrt(1 + log(scale) / log(original)) multiplies cos and sin alike."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim))
    orig = config.original_max_position_embeddings
    use_long = config.max_position_embeddings > orig
    factors = config.long_factor if use_long else config.short_factor
    ext = (torch.tensor(factors, dtype=torch.float32, device=device) if factors
           else torch.ones(dim // 2, device=device))
    positions = torch.arange(length, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, 1.0 / ext) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = config.max_position_embeddings / orig
    attn_factor = math.sqrt(1 + math.log(scale) / math.log(orig))
    return emb.cos() * attn_factor, emb.sin() * attn_factor


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # Rotation in fp32 (upstream's choice), halves layout (x1, x2) -> (-x2, x1).
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: MiniCPM4Config) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, causal: bool = False) -> Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = _rotate(q, *rope), _rotate(k, *rope)
        if self.kv_heads != self.heads:
            # Query head i reads KV head i // group (what SDPA's enable_gqa does).
            group = self.heads // self.kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        # Local modules attend over the whole patch both ways; the talker's LMs causally.
        out = F.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                             is_causal=causal)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, config: MiniCPM4Config, attention: nn.Module | None = None) -> None:
        super().__init__()
        # `attention` replaces the plain one (the same q/k/v/o weights, another core).
        self.self_attn = attention if attention is not None else Attention(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # muP: each branch is damped by scale_depth / sqrt(depth) before the residual add.
        self.branch_scale = (config.scale_depth / math.sqrt(config.num_hidden_layers)
                             if config.use_mup else 1.0)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, **attention: Any) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, **attention) * self.branch_scale
        return x + self.mlp(self.post_attention_layernorm(x)) * self.branch_scale


class MiniCPM4Stack(nn.Module):
    """Decoder layers + final norm over given embeddings at positions 0..n-1: full attention,
    or causal. `attention(layer index)` makes each layer's attention module when it is not
    the plain one."""

    def __init__(self, config: MiniCPM4Config,
                 attention: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config, attention(i) if attention else None)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # A position's angles do not depend on the table's length, so one table per device,
        # as long as the longest sequence seen, replaces upstream's max_position_embeddings
        # rows (the local sequences are a handful of tokens).
        self._rope: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def _rope_for(self, length: int, device: torch.device) -> tuple[Tensor, Tensor] | None:
        if self.config.no_rope:
            return None
        table = self._rope.get(device)
        if table is None or table[0].shape[0] < length:
            table = self._rope[device] = long_rope_table(self.config, length, device)
        return table[0][:length], table[1][:length]

    def forward(self, x: Tensor, causal: bool = False) -> Tensor:
        rope = self._rope_for(x.size(1), x.device)
        for layer in self.layers:
            x = layer(x, rope, causal=causal)
        return self.norm(x)
