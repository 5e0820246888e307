"""CosyVoice3's descriptor: voice cloning from a reference recording, 24 kHz."""
from __future__ import annotations


from ...family import (
    REF_AUDIO, REF_TEXT, Capabilities, DocumentedRequest, Family, Form, Layout, VoiceMode, lazy, quick_start)
from .request import FIELDS, METHOD, METHODS, parse_cosyvoice3_params


def _example_params() -> dict:
    """A 3 s synthetic reference: enough for the tiny checkpoint's tokenizers."""
    import base64
    import io

    import numpy as np
    import soundfile as sf

    rate = 24000
    t = np.arange(3 * rate) / rate
    audio = (0.3 * np.sin(2 * np.pi * 150 * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV")
    return {"ref_audio": base64.b64encode(buf.getvalue()).decode(),
            "ref_text": "This is the reference voice."}


# vLLM-Omni's documented requests (examples/online_serving/text_to_speech/README.md).
DOCUMENTED = quick_start(400, "ref_audio") + (
    DocumentedRequest("cosyvoice3/speech_client.py --text (it sends its default zero-shot prompt)",
                      {"input": "收到好友从远方寄来的生日礼物。", "ref_audio": REF_AUDIO, "ref_text": REF_TEXT}),
    DocumentedRequest("cosyvoice3/speech_client.py --ref-audio --ref-text",
                      {"input": "Hello, this is a cloned voice.", "ref_audio": REF_AUDIO, "ref_text": REF_TEXT}),
    DocumentedRequest("cosyvoice3/speech_client.py --stream --output output.pcm",
                      {"input": "Hello world", "ref_audio": REF_AUDIO, "ref_text": REF_TEXT, "stream": True,
                       "stream_format": "audio", "response_format": "pcm"}, "stream"),
)

FAMILY = Family(
    name="cosyvoice3",
    documented_requests=DOCUMENTED,
    description="Fun-CosyVoice3: vLLM talker -> flow matching DiT -> CausalHiFT; clones "
                "the voice of ref_audio",
    stages=("cosyvoice3_prompt", "cosyvoice3_talker", "cosyvoice3_flow", "cosyvoice3_hift"),
    parse_params=parse_cosyvoice3_params,
    fields=FIELDS,
    capabilities=Capabilities(sample_rate=24000, native_speed=False, reference_audio=True,
                              instructions=False),
    checkpoint_help="a Fun-CosyVoice3-0.5B-2512 directory: cosyvoice3.yaml, llm.pt, flow.pt, "
                    "hift.pt, campplus.onnx, speech_tokenizer_v3.onnx, CosyVoice-BlankEN/",
    checkpoint_required=True,
    open_checkpoint=lazy(__package__, ".checkpoint:open_checkpoint"),
    voices=lambda checkpoint: ["default"],
    voice_encoder="cosyvoice3_prompt",
    form=lambda checkpoint: Form({METHOD: METHODS}, reference_required=True),
    voice_modes=(VoiceMode("clone", "the reference's speech tokens, CAM++ embedding and prompt mel with its "
                           "transcript (upstream's zero-shot prompt)", transcript=True),),
    released_names=("FunAudioLLM/Fun-CosyVoice3-0.5B-2512",),
    layout=Layout(files=("cosyvoice3.yaml", "llm.pt", "flow.pt", "hift.pt")),
    write_random_checkpoint=lazy(__package__, ".random_checkpoint:write_random_checkpoint"),
    graphs=lazy(__package__, ".stages:export_graphs"),
    batch_cases=lazy(__package__, ".batching:batch_cases"),
    torch_networks=lazy(__package__, ".networks:torch_networks"),
    example_params=_example_params,
)
