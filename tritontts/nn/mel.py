"""Mel filter banks and the log-mel spectrograms shared by the families that use them: the
one HiFi-GAN-style vocoders and speaker encoders train on (CosyVoice3's prompt mel,
Qwen3-TTS's speaker features) and Whisper's (the input of CosyVoice3's and GLM-TTS's
speech tokenizers), and Kaldi's fbank (the input of the CAM++ speaker embedder). numpy/torch only: librosa and torchaudio are not available here.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch


def _hz_to_mel_slaney(f):
    f = np.asanyarray(f, dtype=np.float64)
    linear = f / (200.0 / 3)
    log_start, log_step = 1000.0 / (200.0 / 3), np.log(6.4) / 27.0
    return np.where(f >= 1000.0, log_start + np.log(np.maximum(f, 1e-10) / 1000.0) / log_step, linear)


def _mel_to_hz_slaney(m):
    m = np.asanyarray(m, dtype=np.float64)
    log_start, log_step = 1000.0 / (200.0 / 3), np.log(6.4) / 27.0
    return np.where(m >= log_start, 1000.0 * np.exp(log_step * (m - log_start)), m * (200.0 / 3))


@lru_cache(maxsize=8)
def slaney_mel_filters(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0,
                       fmax: float | None = None) -> np.ndarray:
    """Triangular filters on the Slaney mel scale, area-normalized (librosa's default)."""
    fmax = sr / 2 if fmax is None else fmax
    fft_freqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_points = _mel_to_hz_slaney(np.linspace(_hz_to_mel_slaney(fmin), _hz_to_mel_slaney(fmax), n_mels + 2))
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2:n_mels + 2] - mel_points[:n_mels]))[:, None]
    return weights.astype(np.float32)


def whisper_log_mel(audio16k: np.ndarray, n_mels: int = 128, n_fft: int = 400,
                    hop_length: int = 160) -> np.ndarray:
    """[n_mels, frames] as Whisper computes it: centered (reflect-padded) Hann STFT, the last
    frame dropped, power through Slaney mels up to 8 kHz, log10 floored 8 below its maximum,
    then (x + 4) / 4. The maximum is over the whole input, padding included, as in
    transformers' WhisperFeatureExtractor, which runs this on the padded waveform."""
    x = torch.from_numpy(np.ascontiguousarray(audio16k, dtype=np.float32))
    spec = torch.stft(x, n_fft, hop_length, window=torch.hann_window(n_fft), return_complex=True)
    power = spec[..., :-1].abs() ** 2
    mel = torch.from_numpy(slaney_mel_filters(16000, n_fft, n_mels)) @ power
    log = mel.clamp(min=1e-10).log10()
    log = torch.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).numpy()


def matcha_log_mel(audio: torch.Tensor, rate: int, n_fft: int, hop: int, n_mels: int,
                   fmin: float = 0.0, fmax: float | None = None) -> torch.Tensor:
    """[frames, n_mels] float32 log-mel of mono audio, as Matcha-TTS's mel_spectrogram (which
    CosyVoice and Qwen3-TTS use): reflect-pad (n_fft - hop) / 2 each side, STFT with a Hann
    window of n_fft and no centering, magnitude sqrt(re^2 + im^2 + 1e-9), Slaney mel filters,
    natural log clamped at 1e-5."""
    side = (n_fft - hop) // 2
    x = torch.nn.functional.pad(audio.to(torch.float32)[None, None], (side, side), mode="reflect")[0]
    spec = torch.stft(x, n_fft, hop, n_fft, window=torch.hann_window(n_fft, device=x.device),
                      center=False, return_complex=True)
    magnitude = torch.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
    basis = torch.from_numpy(slaney_mel_filters(rate, n_fft, n_mels, fmin, fmax)).to(x.device)
    return (basis @ magnitude).clamp(min=1e-5).log()[0].T.contiguous()


@lru_cache(maxsize=4)
def _kaldi_mel_banks(num_bins: int, padded: int, sr: int, low: float, high: float) -> np.ndarray:
    mel = lambda f: 1127.0 * np.log(1.0 + np.asarray(f, dtype=np.float64) / 700.0)  # noqa: E731
    fft_bin_hz = sr / padded
    low_mel, high_mel = mel(low), mel(high)
    delta = (high_mel - low_mel) / (num_bins + 1)
    left = low_mel + np.arange(num_bins) * delta
    center, right = left + delta, left + 2 * delta
    freqs_mel = mel(fft_bin_hz * np.arange(padded // 2))
    up = (freqs_mel[None] - left[:, None]) / (center - left)[:, None]
    down = (right[:, None] - freqs_mel[None]) / (right - center)[:, None]
    banks = np.maximum(0.0, np.minimum(up, down))
    return np.pad(banks, ((0, 0), (0, 1)))  # Kaldi drops the Nyquist bin: weight 0


def kaldi_fbank(audio16k: np.ndarray, num_mel_bins: int = 80) -> np.ndarray:
    """[frames, num_mel_bins] log mel energies, Kaldi defaults with dither 0 (25 ms / 10 ms
    frames, snip edges, DC removal, pre-emphasis 0.97, Povey window, 512-point FFT)."""
    sr, frame_len, shift, padded = 16000, 400, 160, 512
    # Kaldi works on 16-bit-scale samples.
    x = np.asarray(audio16k, dtype=np.float64) * 32768.0
    n_frames = 1 + (len(x) - frame_len) // shift if len(x) >= frame_len else 0
    if n_frames == 0:
        return np.zeros((0, num_mel_bins), np.float32)
    idx = np.arange(frame_len)[None] + shift * np.arange(n_frames)[:, None]
    frames = x[idx]
    frames = frames - frames.mean(axis=1, keepdims=True)
    frames = np.concatenate([frames[:, :1] - 0.97 * frames[:, :1],
                             frames[:, 1:] - 0.97 * frames[:, :-1]], axis=1)
    povey = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(frame_len) / (frame_len - 1))) ** 0.85
    frames = frames * povey
    power = np.abs(np.fft.rfft(frames, n=padded)) ** 2
    energies = power @ _kaldi_mel_banks(num_mel_bins, padded, sr, 20.0, sr / 2).T
    return np.log(np.maximum(energies, np.finfo(np.float32).eps)).astype(np.float32)
