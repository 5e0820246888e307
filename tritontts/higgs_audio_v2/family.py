"""higgs-audio v2's descriptor (boson-ai): a Llama-3.2-3B talker with DualFFN emitting 8
delayed codebooks per step, the higgs-audio v2 codec; an automatic voice or cloning from a
reference with its transcript; 24 kHz, 25 frames per second."""
from __future__ import annotations

from pathlib import Path

from ..family import Capabilities, Family, synthetic_reference
from .request import KNOWN, parse_higgs_audio_v2_params


def _open(path: Path):
    from .checkpoint import open_checkpoint

    return open_checkpoint(path)


def _write_random_checkpoint(out: Path, seed: int = 0, size: str = "tiny") -> Path:
    from .random_checkpoint import write_random_checkpoint

    return write_random_checkpoint(out, seed=seed, size=size)


def _export_graphs(path: Path) -> list:
    from .stages import export_graphs

    return export_graphs(_open(path))


FAMILY = Family(
    name="higgs_audio_v2",
    description="higgs-audio v2: vLLM DualFFN Llama talker sampling 8 delayed codebooks per step "
                "-> higgs-audio v2 codec",
    stages=("higgs_audio_v2_prompt", "higgs_audio_v2_talker", "higgs_audio_v2_decoder"),
    parse_params=parse_higgs_audio_v2_params,
    fields=KNOWN,
    capabilities=Capabilities(sample_rate=24000, native_speed=False, reference_audio=True,
                              instructions=False, languages=("en", "zh")),
    checkpoint_help="a bosonai/higgs-audio-v2-generation-3B-base directory in the transformers "
                    "layout: config.json, model.safetensors (or its index and shards), "
                    "tokenizer.json, tokenizer_config.json, audio_tokenizer/",
    checkpoint_required=True,
    preflight=lambda path: _open(path) and None,
    voice_encoder="higgs_audio_v2_prompt",
    released_names=("bosonai/higgs-audio-v2-generation-3B-base",),
    write_random_checkpoint=_write_random_checkpoint,
    export_graphs=_export_graphs,
    # Random weights rarely sample the stream end: bound the frames a test request makes.
    example_params=lambda: {"max_new_tokens": 40},
    variants={
        "clone": ({}, lambda: {"max_new_tokens": 40, **synthetic_reference()}),
    },
)
