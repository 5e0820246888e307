"""Voxtral TTS's descriptor: speech in the checkpoint's preset voices, 24 kHz, 12.5 frames
per second, streamed in exact chunks (5 frames first, then 25)."""
from __future__ import annotations

from pathlib import Path

from ..family import Capabilities, Family
from .request import KNOWN, parse_voxtral_tts_params


def _open(path: Path):
    from .checkpoint import open_checkpoint

    return open_checkpoint(path)


def _voices(path: Path | None) -> list[str]:
    return ["default"] if path is None else ["default", *_open(path).config.voices]


def _write_random_checkpoint(out: Path, seed: int = 0, size: str = "tiny") -> Path:
    from .random_checkpoint import write_random_checkpoint

    return write_random_checkpoint(out, seed, size)


FAMILY = Family(
    name="voxtral_tts",
    description="Voxtral TTS: Ministral talker on vLLM with its flow-matching acoustic transformer "
                "in every step -> the Voxtral codec; preset voices",
    stages=("voxtral_tts_prompt", "voxtral_tts_talker", "voxtral_tts_codec"),
    parse_params=parse_voxtral_tts_params,
    fields=frozenset(KNOWN),
    capabilities=Capabilities(sample_rate=24000, native_speed=False, reference_audio=False,
                              instructions=False, languages=("en", "fr", "es", "de", "it", "pt", "nl", "hi", "ar")),
    checkpoint_help="a Voxtral TTS directory (Mistral format): params.json, consolidated.safetensors, "
                    "tekken.json, voice_embedding/NAME.pt",
    checkpoint_required=True,
    preflight=lambda path: _open(path) and None,
    voices=_voices,
    write_random_checkpoint=_write_random_checkpoint,
    # The tiny random talker rarely ends by itself: bound its frames.
    example_params=lambda: {"max_new_tokens": 20},
)
