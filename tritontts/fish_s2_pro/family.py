"""Fish Speech S2 Pro's descriptor: speech in the model's own voice, or cloned from a recording
and its transcript; 44.1 kHz, streamed in chunks (4 frames first, then 25)."""
from __future__ import annotations

from pathlib import Path

from ..family import Capabilities, Family, synthetic_reference
from .request import KNOWN, parse_fish_s2_pro_params


def _preflight(path: Path) -> None:
    from .checkpoint import open_checkpoint

    open_checkpoint(path)


def _write_random_checkpoint(out: Path, seed: int = 0, size: str = "tiny") -> Path:
    from .random_checkpoint import write_random_checkpoint

    return write_random_checkpoint(out, seed, size)


FAMILY = Family(
    name="fish_s2_pro",
    description="Fish Speech S2 Pro: dual-AR talker on vLLM (slow AR, fast AR over 10 codebooks in "
                "every step) -> the causal DAC codec, 44.1 kHz; its own voice or ref_audio's",
    stages=("fish_s2_pro_prompt", "fish_s2_pro_talker", "fish_s2_pro_codec"),
    parse_params=parse_fish_s2_pro_params,
    fields=frozenset(KNOWN),
    capabilities=Capabilities(sample_rate=44100, native_speed=False, reference_audio=True,
                              instructions=False, languages=("en", "zh", "ja", "ko", "fr", "de", "es", "ar")),
    checkpoint_help="a fishaudio/s2-pro directory: config.json, model.safetensors (or shards + "
                    "model.safetensors.index.json), tokenizer.json, codec.pth",
    checkpoint_required=True,
    preflight=_preflight,
    voices=lambda checkpoint: ["default"],
    voice_encoder="fish_s2_pro_prompt",
    released_names=("fishaudio/s2-pro",),
    write_random_checkpoint=_write_random_checkpoint,
    # Cloning (the family's richer path); the tiny random talker rarely ends by itself: bounded.
    example_params=lambda: {"max_new_tokens": 24, **synthetic_reference()},
)
