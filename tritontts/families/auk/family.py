"""AuK's descriptor (Tencent Hunyuan's AuK and AuK-Flash): instruction-driven audio, 24 kHz.
Speech in a described voice or a clip's voice, and edits of a clip, from one instruction; the
output length is given (duration_seconds) or taken from the clip or the text. No token
stream: the audio is sent in chunks as the VAE decodes the finished latents."""
from __future__ import annotations


from ...family import (
    Capabilities, DocumentedRequest, Family, Form, Layout, Variant, lazy, quick_start, synthetic_reference)
from .request import FIELDS, INPUT_MODES, parse_auk_params


def _clip() -> dict:
    return {"ref_audio": synthetic_reference()["ref_audio"]}


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start() + (
    DocumentedRequest("vLLM-Omni's reading: input alone is the whole instruction",
                      {"input": "A dog barks twice, then a door closes."}),
)

FAMILY = Family(
    name="auk",
    documented_requests=DOCUMENTED,
    description="AuK / AuK-Flash: Qwen2.5-Omni thinker (vLLM prefill, all layers fused) conditions a "
                "rectified-flow MMDiT over 64-d VAE latents -> BigVGAN-flow decoder, 24 kHz; instruction-driven",
    stages=("auk_prompt", "auk_encoder", "auk_dit", "auk_vae"),
    parse_params=parse_auk_params,
    fields=FIELDS,
    capabilities=Capabilities(sample_rate=24000, native_speed=False, reference_audio=True, instructions=True, instruction_only=True, max_instructions_chars=4096),
    checkpoint_help="an AuK checkpoint: vLLM-Omni's assembled folder (config.json model_type auk, the "
                    "Qwen2.5-Omni-3B shards and tokenizer, auk.safetensors, vae.safetensors) or upstream's "
                    "release (config.yaml, auk_base.safetensors or auk_flash.safetensors, vae.safetensors, "
                    "and the thinker in Qwen2.5-Omni-3B/)",
    checkpoint_required=True,
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voices=lambda checkpoint: ["default"],
    form=lambda checkpoint: Form({"input_mode": INPUT_MODES}),
    # Upstream's model names (Tencent-Hunyuan/AuK); a served folder named so matches too.
    released_names=("Tencent-Hunyuan/AuK", "Tencent-Hunyuan/AuK-Flash"),
    layout=Layout(files=("config.json",), config={"model_type": ("auk",)}),
    variant_of=lambda checkpoint: "AuK-Flash" if checkpoint.is_flash else "AuK",
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    # A second of audio in 4 steps keeps the tiny checkpoint's tests fast (the default is 32).
    example_params=lambda: {"duration_seconds": 1.0, "num_inference_steps": 4},
    variants={
        "clip": Variant({}, lambda: {"num_inference_steps": 4, **_clip()}),
    },
)
