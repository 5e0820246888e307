"""Upstream implementations for numeric parity checks (vLLM-Omni, the models' own
packages), imported from PyPI packages without what cannot load here.

scripts/setup.sh unpacks `s3tokenizer`, `vllm-omni` and the models' own packages into
.venv/reference (on sys.path through a .pth file) instead of installing them: vllm-omni
registers a vLLM plugin that breaks stock vLLM, and they pull torchaudio, which does not
load beside this torch. `placeholder_modules` stands in for imports that the exercised
code paths never use. Each family's harness is its own `families/<family>/upstream.py`.
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


@contextmanager
def package_module(package: str, subpackages: tuple[str, ...], name: str,
                    stand_ins: dict[str, dict]):
    """Import `name` from an unpacked reference package without running the __init__ of
    `package` or of `subpackages` (empty modules with the real __path__ stand in for them,
    so the files below load normally), with `stand_ins` (module name -> attributes) for
    imports whose code cannot load here. Everything is removed from sys.modules after."""
    import importlib
    import importlib.util

    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, \
        f"{package} reference missing: run scripts/setup.sh"
    root = spec.submodule_search_locations[0]
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == package}
    for sub in ("", *subpackages):
        module = types.ModuleType(package + ("." + sub if sub else ""))
        module.__path__ = [root + ("/" + sub.replace(".", "/") if sub else "")]
        sys.modules[module.__name__] = module
    added = []
    for stand_in, attrs in stand_ins.items():
        if stand_in not in sys.modules:
            module = types.ModuleType(stand_in)
            module.__dict__.update(attrs)
            sys.modules[stand_in] = module
            added.append(stand_in)
    for stand_in in added:        # a stood-in submodule is also its parent's attribute
        parent, _, child = stand_in.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, sys.modules[stand_in])
    try:
        yield importlib.import_module(name)
    finally:
        for key in [k for k in sys.modules if k.split(".")[0] == package]:
            del sys.modules[key]
        sys.modules.update(saved)
        for stand_in in added:
            sys.modules.pop(stand_in, None)


@contextmanager
def vllm_omni_module(name: str, stand_ins: dict[str, dict] | None = None):
    """Import one vLLM-Omni 0.30 module without vllm_omni/__init__.py (which patches another
    vLLM version) or its model registry; `stand_ins` as in package_module (e.g. torchaudio,
    which cannot load beside this torch)."""
    with package_module("vllm_omni", ("model_executor", "model_executor.models"), name,
                         stand_ins or {}) as module:
        yield module
