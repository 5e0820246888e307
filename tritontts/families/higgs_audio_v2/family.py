"""higgs-audio v2's descriptor (boson-ai): a Llama-3.2-3B talker with DualFFN emitting 8
delayed codebooks per step, the higgs-audio v2 codec; an automatic voice or cloning from a
reference with its transcript; 24 kHz, 25 frames per second."""
from __future__ import annotations


from ...family import (
    REF_AUDIO, REF_TEXT, Capabilities, DocumentedRequest, Family, Layout, Variant, VoiceMode, lazy, quick_start,
    synthetic_reference)
from .request import FIELDS, parse_higgs_audio_v2_params


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start() + (
    DocumentedRequest("higgs_audio_v2/batch_speech_client.py --prompts", {"input": "Hello world."}),
    DocumentedRequest("higgs_audio_v2/batch_speech_client.py --prompts",
                      {"input": "The quick brown fox jumps over the lazy dog."}),
    DocumentedRequest("higgs_audio_v2/batch_speech_client.py --ref-audio --ref-text",
                      {"input": "Hello, this is a cloned voice.", "ref_audio": REF_AUDIO, "ref_text": REF_TEXT}),
    # Out of scope, "rejected with explicit 4xx":
    DocumentedRequest("rejected: [SPEAKERn] tags", {"input": "[SPEAKER0] Hello. [SPEAKER1] Hi."},
                      status=400, says="[SPEAKER0]"),
    DocumentedRequest("rejected: profile: speaker descriptions", {"input": "Hi.", "voice": "profile:male_en"},
                      status=400, says="profile:"),
    DocumentedRequest("rejected: ref_audio_in_system_message",
                      {"input": "Hi.", "ref_audio": REF_AUDIO, "ref_text": REF_TEXT,
                       "ref_audio_in_system_message": True}, status=400, says="system-message"),
    DocumentedRequest("rejected: instructions", {"input": "Hi.", "instructions": "Softly."},
                      status=400, says="instructions"),
    DocumentedRequest("rejected: task_type", {"input": "Hi.", "task_type": "Base"}, status=400, says="task_type"),
    DocumentedRequest("rejected: language", {"input": "Hi.", "language": "French"}, status=400, says="language"),
    DocumentedRequest("rejected: x_vector_only_mode", {"input": "Hi.", "x_vector_only_mode": True},
                      status=400, says="x_vector_only_mode"),
    DocumentedRequest("rejected: speaker_embedding", {"input": "Hi.", "speaker_embedding": [0.1, 0.2]},
                      status=400, says="speaker_embedding"),
    # vLLM-Omni refuses speed != 1.0; here the front time-stretches it (docs/api.md).
    DocumentedRequest("speed 1.5 (vLLM-Omni: a 4xx; served here, time-stretched)", {"input": "Hi.", "speed": 1.5}),
)

FAMILY = Family(
    name="higgs_audio_v2",
    documented_requests=DOCUMENTED,
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
    voice_modes=(VoiceMode("clone", "the reference's codes with its transcript, prompted as an earlier turn",
                           transcript=True),),
    released_names=("bosonai/higgs-audio-v2-generation-3B-base",),
    # The unconverted boson-ai release (higgs_audio) is recognised too: its reader says how to convert it.
    layout=Layout(files=("audio_tokenizer/config.json",), config={"model_type": ("higgs_audio_v2", "higgs_audio")}),
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    graphs=lazy(__package__, ".stages:export_graphs"),
    batch_cases=lazy(__package__, ".batching:batch_cases"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    # Random weights rarely sample the stream end: bound the frames a test request makes.
    example_params=lambda: {"max_new_tokens": 40},
    variants={
        "clone": Variant({}, lambda: {"max_new_tokens": 40, **synthetic_reference()}),
    },
)
