"""Reference implementations for numeric parity tests, from PyPI.

scripts/setup.sh unpacks `s3tokenizer` and `vllm-omni` into .venv/reference (on sys.path
through a .pth file) instead of installing them: vllm-omni registers a vLLM plugin that
breaks stock vLLM, and both pull torchaudio, which does not load beside this torch.
`placeholder_modules` stands in for imports that the exercised code paths never use.
"""
from __future__ import annotations

import sys
import types
from contextlib import contextmanager


@contextmanager
def placeholder_modules(*names: str):
    added = [n for n in names if n not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def s3tokenizer_utils():
    """s3tokenizer.utils (its log_mel_spectrogram uses torch only; torchaudio is for files)."""
    with placeholder_modules("torchaudio"):
        import s3tokenizer.utils as utils
    return utils
