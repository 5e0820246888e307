"""Request and response models of the OpenAI audio API (the subset we serve)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tritontts.families import DEFAULT_FAMILY

from .encoding import FORMATS

ResponseFormat = Literal[FORMATS]  # type: ignore[valid-type]


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech. Fields beyond OpenAI's (seed, noise_scale, ...) travel to
    the family as per-request parameters; the family's parser rejects what it does not know
    (OpenAI SDK: pass them with extra_body)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(DEFAULT_FAMILY, description="a family name, or an alias such as tts-1")
    input: str = Field(..., description="the text to speak")
    voice: str = Field("default", description="a voice of the family")
    instructions: str | None = Field(None, description="accepted for SDK compatibility; "
                                     "families without style control ignore it")
    response_format: ResponseFormat = "wav"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream: bool = Field(False, description="stream audio as it is synthesized")
    stream_format: Literal["audio", "sse"] = Field(
        "audio", description="'audio': raw bytes; 'sse': speech.audio.delta events (implies stream)")

    def extra_params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "tritontts"
    created: int = 0


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def error_body(message: str, type_: str = "invalid_request_error",
               param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
