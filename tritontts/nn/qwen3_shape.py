"""What one Qwen3 decoder stack is built from, as read from a checkpoint's config: plain data,
light to import (the families' checkpoint readers, which the front imports, use it; the
network that is built from it is tritontts/nn/qwen3.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Qwen3Shape:
    """What one Qwen3 decoder stack is built from (a checkpoint's Qwen3 config, read)."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    max_position_embeddings: int
