"""higgs-audio v2's descriptor (boson-ai): a Llama-3.2-3B talker with DualFFN emitting 8
delayed codebooks per step, the higgs-audio v2 codec; an automatic voice or cloning from a
reference with its transcript; 24 kHz, 25 frames per second."""
from __future__ import annotations


from ...family import Capabilities, Family, Variant, lazy, synthetic_reference
from .request import FIELDS, parse_higgs_audio_v2_params


FAMILY = Family(
    name="higgs_audio_v2",
    description="higgs-audio v2: vLLM DualFFN Llama talker sampling 8 delayed codebooks per step "
                "-> higgs-audio v2 codec",
    stages=("higgs_audio_v2_prompt", "higgs_audio_v2_talker", "higgs_audio_v2_decoder"),
    parse_params=parse_higgs_audio_v2_params,
    fields=FIELDS,
    capabilities=Capabilities(sample_rate=24000, native_speed=False, reference_audio=True,
                              instructions=False),
    checkpoint_help="a bosonai/higgs-audio-v2-generation-3B-base directory in the transformers "
                    "layout: config.json, model.safetensors (or its index and shards), "
                    "tokenizer.json, tokenizer_config.json, audio_tokenizer/",
    checkpoint_required=True,
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voice_encoder="higgs_audio_v2_prompt",
    released_names=("bosonai/higgs-audio-v2-generation-3B-base",),
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    graphs=lazy(__package__, ".stages:export_graphs"),
    # Random weights rarely sample the stream end: bound the frames a test request makes.
    example_params=lambda: {"max_new_tokens": 40},
    variants={
        "clone": Variant({}, lambda: {"max_new_tokens": 40, **synthetic_reference()}),
    },
)
