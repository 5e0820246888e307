"""Fish Speech S2 Pro's descriptor: speech in the model's own voice, or cloned from a recording
and its transcript; 44.1 kHz, streamed in chunks (4 frames first, then 25)."""
from __future__ import annotations


from ...family import (
    REF_AUDIO, REF_TEXT, Capabilities, DocumentedRequest, Family, Layout, VoiceMode, lazy, quick_start,
    synthetic_reference)
from .request import FIELDS, parse_fish_s2_pro_params


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start() + (
    DocumentedRequest("fish_speech voice cloning (curl)",
                      {"input": "Hello, this is a cloned voice.", "voice": "default", "ref_audio": REF_AUDIO,
                       "ref_text": REF_TEXT}),
    DocumentedRequest("fish_speech/speech_client.py --text", {"input": "Hello, how are you?"}),
    DocumentedRequest("fish_speech/speech_client.py --stream --output output.pcm",
                      {"input": "Hello world", "stream": True, "stream_format": "audio", "response_format": "pcm"},
                      "stream"),
)

FAMILY = Family(
    name="fish_s2_pro",
    documented_requests=DOCUMENTED,
    description="Fish Speech S2 Pro: dual-AR talker on vLLM (slow AR, fast AR over 10 codebooks in "
                "every step) -> the causal DAC codec, 44.1 kHz; its own voice or ref_audio's",
    stages=("fish_s2_pro_prompt", "fish_s2_pro_talker", "fish_s2_pro_codec"),
    parse_params=parse_fish_s2_pro_params,
    fields=FIELDS,
    capabilities=Capabilities(sample_rate=44100, native_speed=False, reference_audio=True,
                              instructions=False),
    checkpoint_help="a fishaudio/s2-pro directory: config.json, model.safetensors (or shards + "
                    "model.safetensors.index.json), tokenizer.json, codec.pth",
    checkpoint_required=True,
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voices=lambda checkpoint: ["default"],
    voice_encoder="fish_s2_pro_prompt",
    voice_modes=(VoiceMode("clone", "the reference's codes with its transcript", transcript=True),),
    released_names=("fishaudio/s2-pro",),
    layout=Layout(files=("codec.pth",), config={"model_type": ("fish_qwen3_omni",)}),
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    # Cloning (the family's richer path); the tiny random talker rarely ends by itself: bounded.
    example_params=lambda: {"max_new_tokens": 24, **synthetic_reference()},
)
