"""VoxCPM2's descriptor: speech in the model's own voice, or cloned from a recording (with
its transcript, also continued from it); 48 kHz, streamed patch by patch."""
from __future__ import annotations


from ...family import (
    REF_AUDIO, Capabilities, DocumentedRequest, Family, Form, Layout, VoiceMode, lazy, quick_start,
    synthetic_reference)
from .request import CLONE_MODES, FIELDS, parse_voxcpm2_params


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start() + (
    DocumentedRequest("voxcpm2/openai_speech_client.py --text", {"input": "Hello, this is VoxCPM2."}),
    DocumentedRequest("voxcpm2/openai_speech_client.py --ref-audio (no transcript)",
                      {"input": "This should sound like the reference speaker.", "ref_audio": REF_AUDIO}),
)

FAMILY = Family(
    name="voxcpm2",
    documented_requests=DOCUMENTED,
    description="VoxCPM2: MiniCPM4 talker on vLLM with its local DiT in every step -> causal "
                "AudioVAE, 48 kHz; its own voice or ref_audio's",
    stages=("voxcpm2_prompt", "voxcpm2_talker", "voxcpm2_audio_vae"),
    parse_params=parse_voxcpm2_params,
    fields=FIELDS,
    capabilities=Capabilities(sample_rate=48000, native_speed=False, reference_audio=True,
                              instructions=False),
    checkpoint_help="an openbmb/VoxCPM2 directory: config.json, model.safetensors, "
                    "audiovae.safetensors, tokenizer.json + tokenizer_config.json",
    checkpoint_required=True,
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voices=lambda checkpoint: ["default"],
    voice_encoder="voxcpm2_prompt",
    form=lambda checkpoint: Form({"clone_mode": CLONE_MODES}),
    # vLLM-Omni's precompute_custom_voice.py modes; a ref_continuation voice also speaks as
    # clone_mode reference or continuation (the request's clone_mode picks).
    voice_modes=(VoiceMode("ref_continuation", "the reference patches and the continuation patches, with "
                           "the transcript", transcript=True),
                 VoiceMode("reference", "the reference patches alone (no transcript)", transcript=False)),
    released_names=("openbmb/VoxCPM2",),
    layout=Layout(files=("config.json", "audiovae.safetensors")),
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    batch_cases=lazy(__package__, ".batching:batch_cases"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    # Cloning (the family's richer path; zero-shot is covered by its own end-to-end tests).
    # The tiny random talker stops on its own after a few to a few dozen patches: bounded.
    example_params=lambda: {"max_new_tokens": 24, **synthetic_reference()},
)
