"""Piper: OpenAI speech request -> piper ensemble parameters."""
from __future__ import annotations

import dataclasses

from tritontts.piper.request import parse_piper_params

from ..protocol import SpeechRequest


def build_params(request: SpeechRequest) -> dict:
    params = parse_piper_params({"speed": request.speed, **request.extra_params()})
    return {k: v for k, v in dataclasses.asdict(params).items() if v is not None}
