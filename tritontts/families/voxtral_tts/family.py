"""Voxtral TTS's descriptor: speech in the checkpoint's preset voices, 24 kHz, 12.5 frames
per second, streamed in exact chunks (5 frames first, then 25)."""
from __future__ import annotations

from pathlib import Path

from ...family import Capabilities, Family, Layout, lazy, quick_start
from .request import FIELDS, parse_voxtral_tts_params


def _voices(path: Path | None) -> list[str]:
    return ["default"] if path is None else ["default", *FAMILY.open_checkpoint(path).config.voices]


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start()

FAMILY = Family(
    name="voxtral_tts",
    documented_requests=DOCUMENTED,
    description="Voxtral TTS: Ministral talker on vLLM with its flow-matching acoustic transformer "
                "in every step -> the Voxtral codec; preset voices",
    stages=("voxtral_tts_prompt", "voxtral_tts_talker", "voxtral_tts_codec"),
    parse_params=parse_voxtral_tts_params,
    fields=FIELDS,
    capabilities=Capabilities(preset_voices=True, sample_rate=24000, native_speed=False, reference_audio=False,
                              instructions=False),
    checkpoint_help="a Voxtral TTS directory (Mistral format): params.json, consolidated.safetensors, "
                    "tekken.json, voice_embedding/NAME.pt",
    checkpoint_required=True,
    released_names=("mistralai/Voxtral-4B-TTS-2603",),
    layout=Layout(files=("params.json", "tekken.json", "consolidated.safetensors")),
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voices=_voices,
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    batch_cases=lazy(__package__, ".batching:batch_cases"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    # The tiny random talker rarely ends by itself: bound its frames.
    example_params=lambda: {"max_new_tokens": 20},
)
