"""One module per family: how an OpenAI speech request becomes that family's ensemble
inputs. The family's own parser (in tritontts) is the one place its parameters are checked.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..protocol import SpeechRequest
from . import cosyvoice3, piper


@dataclass(frozen=True)
class Family:
    name: str            # OpenAI `model` value and the ensemble's name
    build_params: Callable[[SpeechRequest], dict]  # raises tritontts.stage.InvalidRequest


FAMILIES = {f.name: f for f in (
    Family("piper", piper.build_params),
    Family("cosyvoice3", cosyvoice3.build_params),
)}
