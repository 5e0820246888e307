"""GLM-TTS's descriptor: zero-shot voice cloning from a 3-10 s reference, 24 kHz (HiFT) or
32 kHz (Vocos2D), streamed in growing chunks."""
from __future__ import annotations


from ...family import Capabilities, Family, lazy, synthetic_reference
from .request import FIELDS, parse_glm_tts_params


FAMILY = Family(
    name="glm_tts",
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
    released_names=("zai-org/GLM-TTS",),
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    example_params=synthetic_reference,     # a 3 s reference: the shortest the family takes
)
