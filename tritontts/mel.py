"""Mel filter banks and the log-mel spectrograms shared by the families that use them: the
one HiFi-GAN-style vocoders and speaker encoders train on (CosyVoice3's prompt mel,
Qwen3-TTS's speaker features) and Whisper's (the input of CosyVoice3's and GLM-TTS's
speech tokenizers). numpy/torch only: librosa and torchaudio are not available here.
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
