"""CosyVoice3: OpenAI speech request (+ ref_audio, ref_text) -> cosyvoice3 ensemble parameters."""
from __future__ import annotations

from tritontts.cosyvoice3.request import parse_cosyvoice3_params

from ..protocol import SpeechRequest


def build_params(request: SpeechRequest) -> dict:
    params = {**request.extra_params()}
    if request.speed != 1.0:
        params["speed"] = request.speed
    parse_cosyvoice3_params(params)  # 400 here, before the audio travels to Triton
    return params
