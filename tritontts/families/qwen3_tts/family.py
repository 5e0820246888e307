"""Qwen3-TTS's descriptor: preset speakers with instructions (CustomVoice), voices designed
from a description (VoiceDesign), voice cloning (Base); 24 kHz, 12.5 frames per second.
What a request may do depends on the loaded checkpoint's kind: the stages answer 400
naming the checkpoint kind a task needs."""
from __future__ import annotations

from pathlib import Path

from ...family import (
    REF_AUDIO, REF_TEXT, Capabilities, DocumentedRequest, Family, Form, Layout, SpeakerEmbeddings, Variant,
    VoiceMode, lazy, quick_start, synthetic_reference)
from .request import FIELDS, parse_qwen3_tts_params

# How a Base checkpoint stores a voice from a recording (vLLM-Omni's precompute_custom_voice.py
# modes). The packed features say which (their `mode` metadata), so a request that names the
# voice clones the way it was stored.
ICL = VoiceMode("icl", "Base: x-vector + the reference's codes and transcript, cloned in context",
                transcript=True)
XVEC = VoiceMode("xvec", "Base: the x-vector alone (x_vector_only_mode; no transcript)",
                 transcript=False, params={"x_vector_only_mode": True})
# A voice stored from a speaker embedding (an upload's speaker_embedding, a blend) is in
# tritontts.voice.EMBEDDING_MODE.


def _voices(path: Path | None) -> list[str]:
    if path is None:
        return ["default"]
    return ["default", *FAMILY.open_checkpoint(path).speakers]


# A reference's fields: Base only (the other kinds speak presets or a description).
_REFERENCE = ("ref_audio", "ref_text", "x_vector_only_mode", "speaker_embedding")


def _form(path: Path | None) -> Form:
    """The checkpoint's one task, its languages; CustomVoice: presets and style instructions;
    VoiceDesign: the description is the voice (required); Base: a reference, no instructions."""
    if path is None:
        return Form()
    checkpoint = FAMILY.open_checkpoint(path)
    choices = {"task_type": (checkpoint.task,), "language": checkpoint.languages}
    if checkpoint.kind == "base":
        return Form(choices, reference_required=True, hidden=("instructions",))
    if checkpoint.kind == "voice_design":
        return Form(choices, required=("instructions",), hidden=_REFERENCE)
    return Form(choices, hidden=_REFERENCE)


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start() + (
    DocumentedRequest("speech API quick start (curl)", {"input": "Hello, how are you?", "voice": "vivian",
                                                        "language": "English"}),
    DocumentedRequest("qwen3_tts/openai_speech_client.py --voice ryan --instructions",
                      {"model": "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", "input": "今天天气真好", "voice": "ryan",
                       "instructions": "用开心的语气说"}),
    DocumentedRequest("streaming PCM (curl)", {"input": "Hello, how are you?", "voice": "vivian", "language": "English",
                                               "stream": True, "stream_format": "audio", "response_format": "pcm"},
                      "stream"),
    DocumentedRequest("qwen3_tts/openai_speech_client.py --task-type VoiceDesign",
                      {"model": "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign", "task_type": "VoiceDesign",
                       "input": "哥哥，你回来啦", "instructions": "体现撒娇稚嫩的萝莉女声，音调偏高"},
                      variant="voice_design"),
    DocumentedRequest("qwen3_tts/openai_speech_client.py --task-type Base --ref-audio --ref-text",
                      {"model": "Qwen/Qwen3-TTS-12Hz-1.7B-Base", "task_type": "Base",
                       "input": "Hello, this is a cloned voice", "ref_audio": REF_AUDIO, "ref_text": REF_TEXT},
                      variant="base"),
)

# A checkpoint's tts_model_type as its release names it.
KIND_NAMES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}

FAMILY = Family(
    name="qwen3_tts",
    documented_requests=DOCUMENTED,
    description="Qwen3-TTS 12 Hz: vLLM talker with its code predictor in every step -> Code2Wav",
    stages=("qwen3_tts_prompt", "qwen3_tts_talker", "qwen3_tts_code2wav"),
    parse_params=parse_qwen3_tts_params,
    fields=FIELDS,
    capabilities=Capabilities(preset_voices=True, sample_rate=24000, native_speed=False, reference_audio=True,
                              instructions=True),
    checkpoint_help="a Qwen3-TTS-12Hz-{0.6B,1.7B}-{CustomVoice,VoiceDesign,Base} directory: "
                    "config.json, generation_config.json, model.safetensors, tokenizer files, "
                    "speech_tokenizer/",
    checkpoint_required=True,
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voices=_voices,
    form=_form,
    voice_encoder="qwen3_tts_prompt",
    voice_modes=(ICL, XVEC),
    # CustomVoice speaks a preset's codec-table row, Base an x-vector: both one speaker row.
    speaker_embeddings=SpeakerEmbeddings(presets=lazy(__package__, ".speakers:preset_embeddings")),
    released_names=tuple(f"Qwen/Qwen3-TTS-12Hz-{size}-{kind}" for size, kind in (
        ("0.6B", "CustomVoice"), ("1.7B", "CustomVoice"), ("1.7B", "VoiceDesign"),
        ("0.6B", "Base"), ("1.7B", "Base"))),
    layout=Layout(config={"model_type": ("qwen3_tts",)}),
    variant_of=lambda checkpoint: KIND_NAMES[checkpoint.config.kind],
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    graphs=lazy(__package__, ".stages:export_graphs"),
    batch_cases=lazy(__package__, ".batching:batch_cases"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    # Random weights rarely sample the end code: bound the frames a test request makes.
    example_params=lambda: {"max_new_tokens": 24},
    variants={
        "voice_design": Variant({"kind": "voice_design"},
                                lambda: {"max_new_tokens": 24, "instructions": "A calm, low voice."}),
        "base": Variant({"kind": "base"}, lambda: {"max_new_tokens": 24, **synthetic_reference()}),
    },
)

