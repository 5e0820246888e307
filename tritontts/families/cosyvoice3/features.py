"""The three views of a reference recording that CosyVoice3 conditions on.

  whisper_log_mel  16 kHz, 128-bin log-mel at 100 Hz: input of speech_tokenizer_v3.onnx
                   (shared with GLM-TTS, so it lives in tritontts.nn.mel)
  kaldi_fbank      16 kHz, 80-bin Kaldi fbank (dither 0): input of campplus.onnx
                   (shared with GLM-TTS's CAM++: tritontts.nn.mel)
  prompt_mel       24 kHz, 80-bin log-mel at 50 Hz (n_fft 1920, hop 480): the flow's prompt

Written here with numpy/torch only (torchaudio does not load beside this torch); parity
with s3tokenizer (whisper mel) and kaldi-native-fbank is tested.
"""
from __future__ import annotations

import numpy as np
import torch

from ...nn.mel import matcha_log_mel


def prompt_mel(audio24k: np.ndarray) -> np.ndarray:
    """[frames, 80] log-mel of the prompt at 50 Hz, as CosyVoice3's feat_extractor (n_fft =
    window 1920, hop 480, 80 Slaney mels up to 12 kHz)."""
    audio = torch.from_numpy(np.ascontiguousarray(audio24k, dtype=np.float32))
    return matcha_log_mel(audio, 24000, 1920, 480, 80).numpy()
