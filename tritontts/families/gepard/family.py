"""Gepard-1.0's descriptor: speech in the model's learned default voice, 22.05 kHz, 21.5
frames per second, streamed in exact chunks (10 frames first, then 86)."""
from __future__ import annotations


from ...family import Capabilities, Family, Layout, lazy, quick_start
from .request import FIELDS, parse_gepard_params


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start()

FAMILY = Family(
    name="gepard",
    documented_requests=DOCUMENTED,
    description="Gepard-1.0: Qwen3.5 (Gated-DeltaNet hybrid) talker on vLLM drawing 32 FSQ codes and a "
                "stop verdict per step -> NVIDIA NanoCodec, 22.05 kHz; its default voice",
    stages=("gepard_prompt", "gepard_talker", "gepard_codec"),
    parse_params=parse_gepard_params,
    fields=FIELDS,
    capabilities=Capabilities(sample_rate=22050, native_speed=False, reference_audio=False,
                              instructions=False),
    checkpoint_help="a nineninesix/gepard-1.0 directory: config.json, gepard_config.json, model.safetensors, "
                    "tokenizer.json, and the NanoCodec archive nemo-nano-codec-22khz-1.89kbps-21.5fps.nemo",
    checkpoint_required=True,
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voices=lambda checkpoint: ["default"],
    released_names=("nineninesix/gepard-1.0",),
    # config.json is the bare Qwen3.5 backbone's (qwen3_5_text): the sidecar tells it apart.
    layout=Layout(files=("gepard_config.json",), config={"model_type": ("qwen3_5_text",)}),
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    batch_cases=lazy(__package__, ".batching:batch_cases"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    # The tiny random talker's stop head is a coin toss: bound its frames.
    example_params=lambda: {"max_new_tokens": 24},
)
