"""GLM-TTS's descriptor: zero-shot voice cloning from a 3-10 s reference, 24 kHz (HiFT) or
32 kHz (Vocos2D), streamed in growing chunks."""
from __future__ import annotations


from ...family import (
    REF_AUDIO, REF_TEXT, Capabilities, DocumentedRequest, Family, Form, Layout, VoiceMode, lazy, quick_start,
    synthetic_reference)
from .request import FIELDS, parse_glm_tts_params


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start(400, "ref_audio") + (
    DocumentedRequest("glm_tts/openai_speech_client.py --ref-audio --ref-text",
                      {"input": "你好，这是语音克隆测试。", "ref_audio": REF_AUDIO, "ref_text": REF_TEXT}),
    DocumentedRequest("glm_tts/openai_speech_client.py --response-format mp3",
                      {"input": "Hello, this is a voice cloning test.", "ref_audio": REF_AUDIO, "ref_text": REF_TEXT,
                       "response_format": "mp3"}),
)

FAMILY = Family(
    name="glm_tts",
    documented_requests=DOCUMENTED,
    description="GLM-TTS: Llama talker on vLLM -> flow-matching DiT -> HiFT; clones the "
                "voice of ref_audio",
    stages=("glm_tts_prompt", "glm_tts_talker", "glm_tts_flow", "glm_tts_vocoder"),
    parse_params=parse_glm_tts_params,
    fields=FIELDS,
    capabilities=Capabilities(sample_rate=24000, native_speed=False, reference_audio=True,
                              instructions=False),
    checkpoint_help="a zai-org/GLM-TTS directory: llm/, vq32k-phoneme-tokenizer/, flow/flow.pt "
                    "+ flow/config.yaml, hift/hift.pt (or vocos2d/), speech_tokenizer/, "
                    "frontend/campplus.onnx",
    checkpoint_required=True,
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voices=lambda checkpoint: ["default"],
    voice_encoder="glm_tts_prompt",
    form=lambda checkpoint: Form(reference_required=True),
    voice_modes=(VoiceMode("clone", "the reference's WhisperVQ tokens, CAM++ embedding and prompt mel with "
                           "its transcript (upstream's zero-shot prompt)", transcript=True),),
    released_names=("zai-org/GLM-TTS",),
    layout=Layout(files=("llm/config.json", "vq32k-phoneme-tokenizer/tokenizer.model", "flow")),
    # upstream's whole-utterance synthesis per segment (full-attention flow, one vocoder pass)
    whole_utterance={"glm_tts_talker": {"non_streaming_mode": True}},
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    example_params=synthetic_reference,     # a 3 s reference: the shortest the family takes
)
