"""The sinusoidal position table of Whisper-style audio encoders (Qwen2.5-Omni's audio tower,
Qwen3-ASR's encoder): not among a checkpoint's weights, built from its sizes."""
from __future__ import annotations

import math

import torch


def sinusoid_table(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """[length, channels]: sin in the first half, cos in the second, timescales geometric from
    1 to max_timescale. Built in float32 on purpose: that is how Qwen's code builds the table
    the models were trained with, and at position ~100 a float64 table differs by ~1e-5."""
    half = channels // 2
    step = math.log(max_timescale) / (half - 1)
    inv_timescales = torch.exp(-step * torch.arange(half, dtype=torch.float32))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_timescales[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)
