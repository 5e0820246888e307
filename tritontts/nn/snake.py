"""The Snake activation of DAC-style audio codecs (the higgs audio codec, Fish Speech's):
x + sin^2(alpha x) / alpha, alpha learned per channel."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha per channel (DAC's Snake1d)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        # The 1e-9 guard and reciprocal-then-multiply order are DAC's, to match it closely.
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)
