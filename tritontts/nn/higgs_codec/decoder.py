"""The decoder (ours): RVQ lookup, fc2, and DAC's decoder with Snake activations."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..snake import Snake
from .config import HiggsCodecConfig


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.snake1 = Snake(channels)
        self.conv1 = nn.Conv1d(channels, channels, 7, dilation=dilation, padding=3 * dilation)
        self.snake2 = Snake(channels)
        self.conv2 = nn.Conv1d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        # Both convs keep the length, so DAC's crop of the skip path never applies.
        return x + self.conv2(self.snake2(self.conv1(self.snake1(x))))


class DecoderBlock(nn.Module):
    """Halves the channels and upsamples by `stride`."""

    def __init__(self, in_channels: int, stride: int) -> None:
        super().__init__()
        out_channels = in_channels // 2
        self.snake1 = Snake(in_channels)
        # (T-1)s - 2ceil(s/2) + 2s + s%2 = T*s exactly: higgs adds output_padding s % 2,
        # which DAC lacks, so odd strides (the released 5 and 3) do not lose a sample.
        self.conv_t1 = nn.ConvTranspose1d(in_channels, out_channels, 2 * stride, stride=stride,
                                          padding=math.ceil(stride / 2),
                                          output_padding=stride % 2)
        self.res_unit1 = ResidualUnit(out_channels, 1)
        self.res_unit2 = ResidualUnit(out_channels, 3)
        self.res_unit3 = ResidualUnit(out_channels, 9)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_t1(self.snake1(x))
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class AcousticDecoder(nn.Module):
    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        width = cfg.decoder_hidden_size
        self.conv1 = nn.Conv1d(cfg.acoustic_hidden_size, width, 7, padding=3)
        self.block = nn.ModuleList(DecoderBlock(width // 2 ** i, r)
                                   for i, r in enumerate(cfg.upsampling_ratios))
        out = width // 2 ** len(cfg.upsampling_ratios)
        self.snake1 = Snake(out)
        self.conv2 = nn.Conv1d(out, 1, 7, padding=3)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))      # no tanh: higgs removed DAC's


class _Codebook(nn.Module):
    def __init__(self, entries: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.zeros(entries, dim))


class _CodebookDecoder(nn.Module):
    """One RVQ level's decode half: vector lookup, then project_out to the hidden width."""

    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.codebook = _Codebook(cfg.codebook_size, cfg.codebook_dim)
        self.project_out = nn.Linear(cfg.codebook_dim, cfg.hidden_size)

    def forward(self, codes: Tensor) -> Tensor:          # [B, T] -> [B, T, hidden]
        return self.project_out(F.embedding(codes, self.codebook.embed))


class _ResidualQuantizer(nn.Module):
    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(_CodebookDecoder(cfg) for _ in range(cfg.num_quantizers))

    def forward(self, codes: Tensor) -> Tensor:          # [B, Q, T] -> [B, T, hidden]
        total = self.quantizers[0](codes[:, 0])
        for q, level in enumerate(self.quantizers[1:], start=1):
            total = total + level(codes[:, q])
        return total


class HiggsCodecDecoder(nn.Module):
    """codes [B, num_quantizers, T] (int64, each in [0, codebook_size)) -> audio
    [B, T * samples_per_frame] float at cfg.sample_rate. State-dict keys are the
    checkpoint's own (prefixes quantizer., fc2., acoustic_decoder. kept)."""

    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = _ResidualQuantizer(cfg)
        self.fc2 = nn.Linear(cfg.hidden_size, cfg.acoustic_hidden_size)
        self.acoustic_decoder = AcousticDecoder(cfg)

    def forward(self, codes: Tensor) -> Tensor:
        latent = self.fc2(self.quantizer(codes)).transpose(1, 2)      # [B, acoustic, T]
        return self.acoustic_decoder(latent).squeeze(1)
