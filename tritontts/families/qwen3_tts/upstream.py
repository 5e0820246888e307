"""qwen3_tts: its upstream implementations for parity checks (tests, benchmarks), on the
same weights as ours (tritontts.upstream has the loading helpers)."""
from __future__ import annotations

from contextlib import contextmanager

from ...upstream import package_module


def _librosa_mel(sr, n_fft, n_mels=128, fmin=0.0, fmax=None, **_):
    """librosa.filters.mel (Slaney scale and norm) from transformers' audio_utils, for
    reference code that imports librosa (not installed here)."""
    import numpy as np
    from transformers.audio_utils import mel_filter_bank

    return mel_filter_bank(n_fft // 2 + 1, n_mels, fmin, sr / 2 if fmax is None else fmax, sr,
                           norm="slaney", mel_scale="slaney").T.astype(np.float32)


@contextmanager
def qwen_tts_module(name: str):
    """Import one module of qwen-tts-compat 0.1.1.post1 (the Qwen3-TTS reference; setup
    unpacks it into .venv/reference) without its package __init__ (which loads the inference
    wrappers: sox, librosa, hub downloads). Stood in for while importing: the qwen_tts and
    qwen_tts.inference packages (empty, real __path__), qwen_tts.inference.qwen3_tts_tokenizer
    (only named at import time by the talker module), librosa.filters.mel (computed with
    transformers), sox and torchaudio (unused by the model code). Removed afterwards."""
    import transformers.audio_utils  # noqa: F401 - before any torchaudio stand-in exists

    stand_ins = {
        "librosa": {}, "librosa.filters": {"mel": _librosa_mel}, "sox": {},
        "qwen_tts.inference.qwen3_tts_tokenizer": {"Qwen3TTSTokenizer": type("Qwen3TTSTokenizer", (), {})},
    }
    with package_module("qwen_tts", ("inference",), name, stand_ins) as module:
        yield module
