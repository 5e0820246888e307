"""Which forced aligner a --word-aligner folder holds, and the languages it places words
in, read from its files alone (json only: the launcher and the front import this without
torch). A CTranslate2 Whisper folder (model.bin + tokenizer.json) is aligned by
tritontts.alignment.whisper, a Qwen3-ForcedAligner checkpoint (a qwen3_asr config.json
with a timestamp head) by tritontts.alignment.qwen3_forced_aligner."""
from __future__ import annotations

import json
from pathlib import Path

from .languages import WHISPER_LANGUAGES, qwen3_forced_aligner_languages

WHISPER, QWEN3_FORCED_ALIGNER = "whisper", "qwen3_forced_aligner"


def _config(path: Path) -> dict | None:
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def aligner_kind(path: Path) -> str | None:
    """WHISPER, QWEN3_FORCED_ALIGNER, or None for a folder that is neither."""
    path = Path(path)
    if (path / "model.bin").is_file() and (path / "tokenizer.json").is_file():
        return WHISPER
    config = _config(path)
    if (config is not None and config.get("model_type") == "qwen3_asr" and "timestamp_token_id" in config
            and isinstance(config.get("thinker_config"), dict) and "classify_num" in config["thinker_config"]):
        return QWEN3_FORCED_ALIGNER
    return None


def aligner_languages(path: Path) -> tuple[str, ...]:
    """The codes of the languages the aligner in `path` places words in."""
    if aligner_kind(path) == QWEN3_FORCED_ALIGNER:
        return qwen3_forced_aligner_languages(_config(path))
    return WHISPER_LANGUAGES


def load_aligner(path: Path, threads: int | None = 1):
    """The aligner `path` holds (WhisperAligner or Qwen3ForcedAligner), loaded; `threads`: its
    CPU threads (None: torch's as they are, for Qwen3-ForcedAligner)."""
    if aligner_kind(path) == QWEN3_FORCED_ALIGNER:
        from .qwen3_forced_aligner import Qwen3ForcedAligner

        return Qwen3ForcedAligner(path, threads=threads)
    from .whisper import WhisperAligner

    return WhisperAligner(path, threads=threads or 1)
