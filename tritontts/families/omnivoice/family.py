"""OmniVoice's descriptor (k2-fsa/OmniVoice): 600+ languages, an automatic voice, voice
design from attributes in `instructions`, cloning from a reference with its transcript;
24 kHz. Long input streams one segment (sentence) at a time."""
from __future__ import annotations


from ...family import (
    Capabilities, DocumentedRequest, Family, Layout, Variant, VoiceMode, lazy, quick_start, synthetic_reference)
from .request import FIELDS, parse_omnivoice_params


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start() + (
    DocumentedRequest("omnivoice/speech_client.py --text", {"input": "Hello, how are you?"}),
    DocumentedRequest("omnivoice/speech_client.py --language French",
                      {"input": "Bonjour, comment allez-vous?", "language": "French"}),
)

FAMILY = Family(
    name="omnivoice",
    documented_requests=DOCUMENTED,
    description="OmniVoice: bidirectional Qwen3 filling 8 codebooks in 32 unmasking steps "
                "-> higgs-audio v2 codec",
    stages=("omnivoice_prompt", "omnivoice_generator", "omnivoice_decoder"),
    parse_params=parse_omnivoice_params,
    fields=FIELDS,
    capabilities=Capabilities(sample_rate=24000, native_speed=True, reference_audio=True,
                              instructions=True),
    checkpoint_help="a k2-fsa/OmniVoice directory: config.json, model.safetensors, tokenizer "
                    "files, audio_tokenizer/",
    checkpoint_required=True,
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voice_encoder="omnivoice_prompt",
    voice_modes=(VoiceMode("clone", "the reference's codes, loudness and transcript", transcript=True),),
    released_names=("k2-fsa/OmniVoice",),
    layout=Layout(files=("audio_tokenizer/config.json",), config={"model_type": ("omnivoice",)}),
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    graphs=lazy(__package__, ".stages:export_graphs"),
    batch_cases=lazy(__package__, ".batching:batch_cases"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    # Few steps keep the tiny checkpoint's tests fast; the default is 32.
    example_params=lambda: {"num_steps": 8},
    variants={
        "clone": Variant({}, lambda: {"num_steps": 8, **synthetic_reference()}),
    },
)
