"""The languages each word aligner places words in, as ISO 639 codes (the request's
`language` may name one by code or name: tritontts.protocol.LANGUAGE_NAMES). No torch, no
numpy: the launcher imports it."""
from __future__ import annotations

from ..protocol import LANGUAGE_NAMES

# What the Whisper aligner is measured on (tritontts.benchmark.word_alignment): English. An
# English-only checkpoint (*.en) knows no other; a multilingual one is run in English too.
WHISPER_LANGUAGES = ("en",)
# Qwen3-ForcedAligner-0.6B's languages (its model card), for a checkpoint whose config.json
# does not list its own (`support_languages`).
QWEN3_FORCED_ALIGNER_LANGUAGES = ("Chinese", "English", "Cantonese", "French", "German", "Italian",
                                  "Japanese", "Korean", "Portuguese", "Russian", "Spanish")


def language_code(name: str) -> str:
    """A language's ISO 639 code from its name or code ("English" -> "en"); a language the
    table does not know is kept, lowercased."""
    lowered = name.strip().lower()
    return next((code for code, names in LANGUAGE_NAMES.items() if lowered in names), lowered)


def qwen3_forced_aligner_languages(config: dict) -> tuple[str, ...]:
    """The codes of a Qwen3-ForcedAligner config.json's `support_languages`, or the model card's."""
    names = config.get("support_languages") or QWEN3_FORCED_ALIGNER_LANGUAGES
    return tuple(dict.fromkeys(language_code(str(n)) for n in names))
