"""OmniVoice's descriptor (k2-fsa/OmniVoice): 600+ languages, an automatic voice, voice
design from attributes in `instructions`, cloning from a reference with its transcript;
24 kHz. Long input streams one segment (sentence) at a time."""
from __future__ import annotations

from pathlib import Path

from ..family import Capabilities, Family, synthetic_reference
from .request import KNOWN, parse_omnivoice_params
from .text import languages


def _open(path: Path):
    from .checkpoint import open_checkpoint

    return open_checkpoint(path)


def _write_random_checkpoint(out: Path, seed: int = 0, size: str = "tiny") -> Path:
    from .random_checkpoint import write_random_checkpoint

    return write_random_checkpoint(out, seed=seed, size=size)


def _export_graphs(path: Path) -> list:
    from ..higgs_codec import decoder_graph, load_codec_decoder
    from .generator import load_generator, logits_graph

    checkpoint = _open(path)
    return [logits_graph(load_generator(checkpoint)), decoder_graph(load_codec_decoder(checkpoint.codec_dir))]


FAMILY = Family(
    name="omnivoice",
    description="OmniVoice: bidirectional Qwen3 filling 8 codebooks in 32 unmasking steps "
                "-> higgs-audio v2 codec",
    stages=("omnivoice_prompt", "omnivoice_generator", "omnivoice_decoder"),
    parse_params=parse_omnivoice_params,
    fields=KNOWN,
    capabilities=Capabilities(sample_rate=24000, native_speed=True, reference_audio=True,
                              instructions=True, languages=tuple(languages())),
    checkpoint_help="a k2-fsa/OmniVoice directory: config.json, model.safetensors, tokenizer "
                    "files, audio_tokenizer/",
    checkpoint_required=True,
    preflight=lambda path: _open(path) and None,
    voice_encoder="omnivoice_prompt",
    released_names=("k2-fsa/OmniVoice",),
    write_random_checkpoint=_write_random_checkpoint,
    export_graphs=_export_graphs,
    # Few steps keep the tiny checkpoint's tests fast; the default is 32.
    example_params=lambda: {"num_steps": 8},
    variants={
        "clone": ({}, lambda: {"num_steps": 8, **synthetic_reference()}),
    },
)
