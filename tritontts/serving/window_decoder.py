"""The stateless chunk decoder every causal codec or VAE stage shares: exact windows with left
context, batched by length."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..protocol import AUDIO, SAMPLE_RATE, InvalidRequest
from .stage import GroupedStage, Inputs


class WindowDecoderStage(GroupedStage):
    """A stateless chunk decoder (a causal codec or VAE): each request is a window of frames
    (`window` input, frames first) whose first `left_context` frames only give context, so
    the window's newer frames decode exactly as in the whole utterance. Windows of equal
    length, from any streams, are decoded as one batch; each keeps only its new samples.
    A subclass sets `window`, `samples_per_frame` and `sample_rate`, checks a window in
    `check_window` and decodes a stack of them in `decode_windows`."""

    window: str
    samples_per_frame: int
    sample_rate: int

    def check_window(self, window: np.ndarray) -> None:
        """Raise InvalidRequest for a window this decoder cannot take."""

    def decode_windows(self, windows: np.ndarray) -> np.ndarray:
        """[B, frames, ...] -> audio [B, frames * samples_per_frame]."""
        raise NotImplementedError

    def batch_key(self, inputs: Inputs) -> int:
        """The window's length (checked)."""
        window, context = inputs[self.window], int(inputs.scalar("left_context"))
        self.check_window(window)
        if not 0 <= context <= window.shape[0]:
            raise InvalidRequest(f"left_context {context} is not within the window's {window.shape[0]} frames")
        return window.shape[0]

    def run_group(self, members: list[Inputs]) -> list[dict[str, Any]]:
        audio = self.decode_windows(np.stack([np.asarray(inputs[self.window]) for inputs in members]))
        return [{AUDIO: audio[row, int(inputs.scalar("left_context")) * self.samples_per_frame:],
                 SAMPLE_RATE: self.sample_rate} for row, inputs in enumerate(members)]
