"""The three views of a reference recording that CosyVoice3 conditions on.

  whisper_log_mel  16 kHz, 128-bin log-mel at 100 Hz: input of speech_tokenizer_v3.onnx
                   (shared with GLM-TTS, so it lives in tritontts.mel)
  kaldi_fbank      16 kHz, 80-bin Kaldi fbank (dither 0): input of campplus.onnx
  prompt_mel       24 kHz, 80-bin log-mel at 50 Hz (n_fft 1920, hop 480): the flow's prompt

Written here with numpy/torch only (torchaudio does not load beside this torch); parity
with s3tokenizer (whisper mel) and kaldi-native-fbank is tested.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ..mel import matcha_log_mel


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


def prompt_mel(audio24k: np.ndarray) -> np.ndarray:
    """[frames, 80] log-mel of the prompt at 50 Hz, as CosyVoice3's feat_extractor (n_fft =
    window 1920, hop 480, 80 Slaney mels up to 12 kHz)."""
    audio = torch.from_numpy(np.ascontiguousarray(audio24k, dtype=np.float32))
    return matcha_log_mel(audio, 24000, 1920, 480, 80).numpy()
