"""Gepard-1.0's descriptor: speech in the model's learned default voice, 22.05 kHz, 21.5
frames per second, streamed in exact chunks (10 frames first, then 86)."""
from __future__ import annotations

from pathlib import Path

from ..family import Capabilities, Family
from .request import KNOWN, parse_gepard_params


def _preflight(path: Path) -> None:
    from .checkpoint import open_checkpoint

    open_checkpoint(path)


def _write_random_checkpoint(out: Path, seed: int = 0, size: str = "tiny") -> Path:
    from .random_checkpoint import write_random_checkpoint

    return write_random_checkpoint(out, seed, size)


FAMILY = Family(
    name="gepard",
    description="Gepard-1.0: Qwen3.5 (Gated-DeltaNet hybrid) talker on vLLM drawing 32 FSQ codes and a "
                "stop verdict per step -> NVIDIA NanoCodec, 22.05 kHz; its default voice",
    stages=("gepard_prompt", "gepard_talker", "gepard_codec"),
    parse_params=parse_gepard_params,
    fields=frozenset(KNOWN),
    capabilities=Capabilities(sample_rate=22050, native_speed=False, reference_audio=False,
                              instructions=False, languages=("en",)),
    checkpoint_help="a nineninesix/gepard-1.0 directory: config.json, gepard_config.json, model.safetensors, "
                    "tokenizer.json, and the NanoCodec archive nemo-nano-codec-22khz-1.89kbps-21.5fps.nemo",
    checkpoint_required=True,
    preflight=_preflight,
    voices=lambda checkpoint: ["default"],
    released_names=("nineninesix/gepard-1.0",),
    write_random_checkpoint=_write_random_checkpoint,
    # The tiny random talker's stop head is a coin toss: bound its frames.
    example_params=lambda: {"max_new_tokens": 24},
)
