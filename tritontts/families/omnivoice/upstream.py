"""omnivoice: its upstream implementations for parity checks (tests, benchmarks), on the
same weights as ours (tritontts.upstream has the loading helpers)."""
from __future__ import annotations

from contextlib import contextmanager

from ...upstream import package_module


@contextmanager
def omnivoice_module(name: str):
    """Import one module of omnivoice 0.2.1 (the OmniVoice reference; setup unpacks it into
    .venv/reference) without its package __init__ (which imports the CLI and training code).
    Stood in for while importing: torchaudio (resampling of files; tests pass 24 kHz audio)
    and pydub (silence trimming, which parity tests switch off). Removed afterwards."""
    import transformers  # noqa: F401 - before the torchaudio stand-in: transformers probes it
    import transformers.audio_utils  # noqa: F401
    from transformers import HiggsAudioV2TokenizerModel  # noqa: F401 - resolved before the stand-in

    silence = {"detect_leading_silence": None, "detect_nonsilent": None, "split_on_silence": None}
    stand_ins = {"torchaudio": {}, "pydub": {"AudioSegment": type("AudioSegment", (), {})},
                 "pydub.silence": silence}
    with package_module("omnivoice", ("models", "utils"), name, stand_ins) as module:
        yield module
