"""Speaker embedding of a reference recording, for Qwen3-TTS "Base" voice cloning.

  audio (24 kHz mono float) -> speaker_log_mel: [frames, 128] -> SpeakerEncoder -> [enc_dim]

Features, as qwen-tts computes them before its speaker encoder (extract_speaker_embedding):
reflect-pad (n_fft - hop) / 2 = 384 samples each side, then a plain (center=False) STFT with
n_fft = win = 1024, hop 256 and a periodic Hann window; magnitude sqrt(re^2 + im^2 + 1e-9);
a Slaney-scale, area-normalized 128-bin mel basis over 0..12 kHz; natural log of the mel
energies clamped at 1e-5. No mean/variance normalization. len(audio) // 256 frames.

Network: ECAPA-TDNN (Desplanques et al., 2020) as the checkpoint lays it out under
`speaker_encoder.*` in the main model.safetensors, shaped by config.json
`speaker_encoder_config`:
  blocks.0                     TDNN: conv (mel_dim -> C0, k0, d0) + ReLU
  blocks.i (0 < i < n-1)       SE-Res2Net: tdnn1 (1x1), res2net_block.blocks.0..scale-2
                               (k_i, d_i), tdnn2 (1x1), se_block.conv1/conv2, + residual
  mfa                          TDNN over the concatenated SE-Res2Net outputs (k, d last)
  asp                          attentive statistics pooling: tdnn (3C -> att), conv (att -> C)
  fc                           1x1 conv, 2C -> enc_dim (the talker's hidden size)
Every convolution pads "same" by reflection, as the checkpoint was trained.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...weights.checkpoint import CheckpointError, load_strict, require_dir, require_files
from ...nn.mel import matcha_log_mel
from ...protocol import InvalidRequest

SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
N_MELS = 128
FMAX = 12000.0
PREFIX = "speaker_encoder."
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def speaker_log_mel(audio24k: np.ndarray | torch.Tensor, device: torch.device | str | None = None
                    ) -> torch.Tensor:
    """[frames, 128] float32 log-mel of mono 24 kHz audio (see the module docstring).
    Computed on `device` (default: the audio tensor's, else CPU)."""
    x = torch.as_tensor(audio24k).to(device=device, dtype=torch.float32)
    if x.ndim != 1:
        raise InvalidRequest(f"reference audio must be mono (one channel), got shape {tuple(x.shape)}")
    side = (N_FFT - HOP) // 2
    if x.numel() <= side:
        # Reflection needs more samples than it mirrors; such a clip has no speaker anyway.
        raise InvalidRequest(f"reference audio is {x.numel()} samples; at least {side + 1} "
                             f"at {SAMPLE_RATE} Hz are needed for a speaker embedding")
    return matcha_log_mel(x, SAMPLE_RATE, N_FFT, HOP, N_MELS, 0.0, FMAX)


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """config.json `speaker_encoder_config`; absent fields take the reference's defaults
    (the released configs state only enc_dim and sample_rate)."""
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = SAMPLE_RATE

    @classmethod
    def from_dict(cls, raw: Mapping, where: str) -> "SpeakerEncoderConfig":
        known = {f.name for f in fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known}
        config = cls(**values)
        problem = config._problem()
        if problem:
            raise CheckpointError(f"{where}: speaker_encoder_config {problem}")
        return config

    def _problem(self) -> str | None:
        n = len(self.enc_channels)
        if n < 3 or len(self.enc_kernel_sizes) != n or len(self.enc_dilations) != n:
            return ("needs enc_channels, enc_kernel_sizes and enc_dilations of one length >= 3, got "
                    f"{list(self.enc_channels)}, {list(self.enc_kernel_sizes)}, {list(self.enc_dilations)}")
        if self.mel_dim != N_MELS or self.sample_rate != SAMPLE_RATE:
            return (f"mel_dim {self.mel_dim} / sample_rate {self.sample_rate}: the features are "
                    f"fixed at {N_MELS} mels of {SAMPLE_RATE} Hz audio")
        if sum(self.enc_channels[1:-1]) != self.enc_channels[-1]:
            # The aggregation layer takes the concatenated SE-Res2Net outputs.
            return f"enc_channels {list(self.enc_channels)}: the last must be the sum of the middle ones"
        if any(c % self.enc_res2net_scale for c in self.enc_channels[1:-1]):
            return f"enc_channels {list(self.enc_channels)} do not split into {self.enc_res2net_scale} parts"
        return None


def _reflect_same(x: torch.Tensor, kernel: int, dilation: int) -> torch.Tensor:
    total = dilation * (kernel - 1)
    return F.pad(x, (total // 2, total - total // 2), mode="reflect") if total else x


class _Tdnn(nn.Module):
    """A convolution with "same" reflection padding, then ReLU (checkpoint: `<name>.conv.*`)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(_reflect_same(x, self.conv.kernel_size[0], self.conv.dilation[0])))


class _SqueezeExcite(nn.Module):
    """Channel gates from the time-averaged activations (conv1 -> ReLU -> conv2 -> sigmoid)."""

    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, bottleneck, 1)
        self.conv2 = nn.Conv1d(bottleneck, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class _Res2Net(nn.Module):
    """Splits the channels into `scale` groups: the first passes through, each later one is
    convolved after adding the previous group's output (a growing receptive field)."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(_Tdnn(channels // scale, channels // scale, kernel, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = list(torch.chunk(x, self.scale, dim=1))
        out, previous = [groups[0]], None
        for conv, group in zip(self.blocks, groups[1:]):
            previous = conv(group if previous is None else group + previous)
            out.append(previous)
        return torch.cat(out, dim=1)


class _SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = _Tdnn(cin, cout, 1)
        self.res2net_block = _Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = _Tdnn(cout, cout, 1)
        self.se_block = _SqueezeExcite(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_mean_std(x: torch.Tensor, weights: torch.Tensor, eps: float = 1e-12):
    """Mean and standard deviation over time under weights summing to 1 per channel; the
    variance is floored at eps before the square root (flat channels stay finite)."""
    mean = (weights * x).sum(dim=2)
    var = (weights * (x - mean[..., None]) ** 2).sum(dim=2)
    return mean, var.clamp(min=eps).sqrt()


class _AttentiveStatsPool(nn.Module):
    """Per-channel attention over time, conditioned on the utterance's global mean and std;
    returns the attention-weighted mean and std, concatenated: [B, 2C]."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = _Tdnn(3 * channels, attention_channels, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[2]
        mean, std = _weighted_mean_std(x, torch.full_like(x, 1.0 / frames))
        context = torch.cat([x, mean[..., None].expand_as(x), std[..., None].expand_as(x)], dim=1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        return torch.cat(_weighted_mean_std(x, attention), dim=1)


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: [B, frames, mel_dim] log-mel -> [B, enc_dim] speaker embedding."""

    def __init__(self, config: SpeakerEncoderConfig):
        super().__init__()
        problem = config._problem()
        if problem:
            raise ValueError(f"speaker_encoder_config {problem}")
        self.config = config
        ch, ks, ds = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
        self.blocks = nn.ModuleList([_Tdnn(config.mel_dim, ch[0], ks[0], ds[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(_SERes2NetBlock(ch[i - 1], ch[i], config.enc_res2net_scale,
                                               config.enc_se_channels, ks[i], ds[i]))
        self.mfa = _Tdnn(ch[-1], ch[-1], ks[-1], ds[-1])
        self.asp = _AttentiveStatsPool(ch[-1], config.enc_attention_channels)
        self.fc = nn.Conv1d(2 * ch[-1], config.enc_dim, 1)

    @property
    def min_frames(self) -> int:
        """Reflection padding needs more frames than the widest convolution mirrors."""
        c = self.config
        return 1 + max(d * (k - 1) - d * (k - 1) // 2 for k, d in zip(c.enc_kernel_sizes, c.enc_dilations))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](mel.transpose(1, 2))
        outputs = []
        for block in self.blocks[1:]:
            x = block(x)
            outputs.append(x)
        # Multi-layer feature aggregation: every SE-Res2Net level, not only the last.
        x = self.mfa(torch.cat(outputs, dim=1))
        return self.fc(self.asp(x)[..., None])[..., 0]

    @torch.inference_mode()
    def embed(self, audio24k: np.ndarray | torch.Tensor) -> torch.Tensor:
        """[enc_dim] embedding of one mono 24 kHz clip, in the module's dtype and device
        (features in float32 on that device, as the reference computes them)."""
        weight = self.fc.weight
        mel = speaker_log_mel(audio24k, weight.device)
        if mel.shape[0] < self.min_frames:
            raise InvalidRequest(f"reference audio is too short for a speaker embedding: "
                                 f"{mel.shape[0]} frames of {HOP} samples, at least {self.min_frames}")
        return self(mel[None].to(weight.dtype))[0]


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def read_safetensors(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file whose names start with `prefix`, names kept; only
    those are read (the main Qwen3-TTS file holds gigabytes of talker weights besides)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
    except Exception as exc:  # noqa: BLE001 - any failure is a bad file
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def load_speaker_encoder(root: str | Path, device: torch.device | str = "cpu",
                         dtype: torch.dtype = torch.float32) -> SpeakerEncoder:
    """The speaker encoder of a Qwen3-TTS Base checkpoint directory (config.json +
    model.safetensors), loaded strictly, in eval mode on `device` as `dtype`."""
    root = require_dir(root, "Qwen3-TTS")
    require_files(root, (CONFIG_FILE, WEIGHTS_FILE), "Qwen3-TTS")
    config = read_json(root / CONFIG_FILE)
    kind = config.get("tts_model_type")
    if kind is not None and kind != "base":
        raise CheckpointError(f"{root / CONFIG_FILE}: tts_model_type {kind!r} has no speaker "
                              "encoder; voice cloning needs a Base checkpoint")
    raw = config.get("speaker_encoder_config") or {}
    if not isinstance(raw, dict):
        raise CheckpointError(f"{root / CONFIG_FILE}: speaker_encoder_config must be an object")
    model = SpeakerEncoder(SpeakerEncoderConfig.from_dict(raw, str(root / CONFIG_FILE)))
    # Held under its checkpoint name so that load errors name the keys as the file does.
    load_strict(nn.ModuleDict({PREFIX[:-1]: model}), read_safetensors(root / WEIGHTS_FILE, PREFIX),
                f"{root / WEIGHTS_FILE} ({PREFIX}*)")
    return model.to(device=device, dtype=dtype).eval()
