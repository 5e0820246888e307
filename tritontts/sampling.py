"""Sampling overrides: the talker's sampling knobs a request may set (in `extra_params`, or
as top-level fields), over the checkpoint's own defaults.

Each family's parser names the knobs its talker has (`sampling_overrides(params, names)`),
so a knob the family does not have is a 400 naming it like any unknown field. The prompt
stage hands the checked overrides to the talker as the `sampling` tensor (JSON); the
talker applies them over its defaults (`apply`). Without overrides nothing changes, so
parity with the references holds.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable

from .protocol import InvalidRequest

SAMPLING = "sampling"      # the prompt stage's output and the talker's input
# How a talker samples, where it has more than one way (CosyVoice3: "ras" or "standard"):
# travels with the overrides, a string among the numbers.
METHOD = "sampling_method"

# name: (type, lowest, highest, lowest excluded)
RULES: dict[str, tuple[type, float, float, bool]] = {
    "temperature": (float, 0.0, 2.0, False),           # 0: greedy
    "top_p": (float, 0.0, 1.0, True),
    "top_k": (int, 0, 10000, False),                    # 0: no limit
    "repetition_penalty": (float, 0.0, 2.0, True),
    "win_size": (int, 1, 1000, False),                  # CosyVoice3's repetition-aware sampling
    "tau_r": (float, 0.0, 10.0, True),
    "subtalker_temperature": (float, 0.0, 2.0, True),   # Qwen3-TTS's code predictor
    "subtalker_top_p": (float, 0.0, 1.0, True),
    "subtalker_top_k": (int, 0, 10000, False),
    "cfg_value": (float, 0.5, 5.0, False),              # flow matching's CFG (VoxCPM2, Voxtral TTS)
    "inference_timesteps": (int, 1, 50, False),
}


def sampling_overrides(params: dict[str, Any], names: Iterable[str]) -> dict[str, float | int]:
    """The overrides among `names` that params sets, checked (InvalidRequest naming one)."""
    out: dict[str, float | int] = {}
    for name in names:
        value = params.get(name)
        if value is None:
            continue
        kind, low, high, open_low = RULES[name]
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not numeric or (kind is int and not isinstance(value, int)) or not math.isfinite(value):
            raise InvalidRequest(f"{name} must be {'an integer' if kind is int else 'a number'} "
                                 f"from {low:g} to {high:g}, got {value!r}")
        if not (low < value if open_low else low <= value) or value > high:
            bound = f"above {low:g}" if open_low else f"from {low:g}"
            raise InvalidRequest(f"{name} must be {bound} up to {high:g}, got {value}")
        out[name] = kind(value)
    return out


def encode(overrides: dict[str, float | int]) -> str:
    return json.dumps(overrides, sort_keys=True)


def decode(raw: str | bytes | None) -> dict[str, float | int]:
    if not raw:
        return {}
    data = json.loads(raw)
    unknown = set(data) - set(RULES) - {METHOD}
    if unknown:
        raise InvalidRequest(f"unknown sampling overrides {sorted(unknown)}")
    return data


def apply(defaults: dict[str, Any], overrides: dict[str, float | int], prefix: str = "") -> dict[str, Any]:
    """defaults with the overrides whose name is prefix + key (e.g. subtalker_top_k -> top_k)."""
    return {k: overrides.get(prefix + k, v) for k, v in defaults.items()}
