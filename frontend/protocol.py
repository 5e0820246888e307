"""Request and response models of the speech API: OpenAI's audio API plus vLLM-Omni's
speech fields, so that clients written for either keep working.

Types are strict (a string where a number belongs is a 400 naming the field, never a silent
conversion). Which of the model-specific fields a request may use is the family's call:
its parameter parser (the one its stages use) rejects what it cannot honor, naming the
field.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from .encoding import FORMATS

ResponseFormat = Literal[FORMATS]  # type: ignore[valid-type]
TaskType = Literal["CustomVoice", "VoiceDesign", "Base"]

# The longest instructions any family takes (AuK's are whole instructions); each family's
# own limit (Capabilities.max_instructions_chars: 500 for style instructions, as vLLM-Omni's
# TTS limit) is checked by the front once the model is known.
MAX_INSTRUCTIONS_CHARS = 4096
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 96000
MAX_EMBEDDING_DIM = 8192
MAX_BATCH_ITEMS = 32

# The vLLM-Omni speech fields a family may take (each family's parser lists those it
# honors); they travel to the stages as the request's params. word_timestamps is the
# server's (its word aligner's, for every family), not a family's.
FAMILY_FIELDS = ("task_type", "language", "ref_audio", "ref_text", "x_vector_only_mode",
                 "speaker_embedding", "max_new_tokens", "seed", "initial_codec_chunk_frames",
                 "non_streaming_mode", "instructions")


def _voice_id(value: Any) -> Any:
    """OpenAI's newer SDKs send a custom voice as {"id": "..."}."""
    if isinstance(value, dict):
        if set(value) != {"id"} or not isinstance(value["id"], str):
            raise ValueError('a voice object is {"id": "<voice name>"}')
        return value["id"]
    return value


class SpeechFields(BaseModel):
    """What a speech request, a batch item and a WebSocket session share. Fields beyond these
    (piper's noise_scale, ...) travel to the family's parser as they are, which rejects the
    ones it does not know (OpenAI SDK: pass them with extra_body)."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    model: str | None = Field(None, description="a served model, a family's released checkpoint "
                              "name, or an OpenAI alias; omitted: the one served model")
    voice: str | None = Field(None, validation_alias=AliasChoices("voice", "speaker"),
                              description="a voice of the family, or an uploaded voice")
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS,
                                     description="style or voice description (families that follow them)")
    response_format: ResponseFormat | None = None
    sample_rate: int | None = Field(None, ge=MIN_SAMPLE_RATE, le=MAX_SAMPLE_RATE,
                                    description="resample the audio to this rate")
    speed: float | None = Field(None, ge=0.25, le=4.0)
    task_type: TaskType | None = None
    language: str | None = Field(None, max_length=64)
    ref_audio: str | None = Field(None, description="reference audio: base64, a data: URL, an "
                                  "http(s) URL, or file:// under --allowed-local-media-path")
    ref_text: str | None = Field(None, max_length=4096)
    x_vector_only_mode: bool | None = None
    speaker_embedding: list[float] | None = Field(None, min_length=1, max_length=MAX_EMBEDDING_DIM)
    max_new_tokens: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=0, lt=2**63)
    initial_codec_chunk_frames: int | None = Field(None, ge=1)
    non_streaming_mode: bool | None = None
    word_timestamps: bool | None = None
    extra_params: dict[str, Any] | None = Field(
        None, description="model-specific parameters (e.g. sampling overrides) the family allows")

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, value):
        return _voice_id(value)

    @model_validator(mode="before")
    @classmethod
    def _references(cls, data):
        """vLLM-Omni's `references: [{audio_path, text}]` (one reference) is ref_audio + ref_text."""
        if not isinstance(data, dict) or "references" not in data:
            return data
        refs = data["references"]
        if not isinstance(refs, list) or len(refs) != 1 or not isinstance(refs[0], dict):
            raise ValueError("references must be a list of one {audio_path, text} object")
        data = {k: v for k, v in data.items() if k != "references"}
        if data.get("ref_audio") is not None or data.get("ref_text") is not None:
            raise ValueError("references and ref_audio/ref_text are mutually exclusive")
        data["ref_audio"] = refs[0].get("audio_path")
        if refs[0].get("text") is not None:
            data["ref_text"] = refs[0]["text"]
        return data

    def family_params(self) -> dict[str, Any]:
        """The fields that go to the family's parser: the model-specific ones that are set,
        any extra fields, and extra_params (which may not repeat a field)."""
        params = {name: getattr(self, name) for name in FAMILY_FIELDS if getattr(self, name) is not None}
        params.update(self.model_extra or {})
        for name, value in (self.extra_params or {}).items():
            if name in params or name in type(self).model_fields:
                raise ValueError(f"extra_params.{name} repeats a request field; set it once")
            params[name] = value
        return params


class SpeechRequest(SpeechFields):
    """POST /v1/audio/speech."""

    input: str = Field(..., description="the text to speak")
    stream: bool = Field(False, description="stream audio as it is synthesized (SSE unless "
                         "stream_format is 'audio')")
    stream_format: Literal["audio", "sse"] | None = Field(
        None, description="'audio': raw bytes; 'sse': speech.audio.delta events. Omitted: "
                          "'sse' when stream is true (vLLM-Omni), else not streamed")

    @property
    def streaming(self) -> bool:
        return self.stream or self.stream_format is not None

    @property
    def sse(self) -> bool:
        return self.stream_format == "sse" or (self.stream and self.stream_format is None)


class BatchSpeechRequest(SpeechFields):
    """POST /v1/audio/speech/batch: the batch's fields are defaults for every item. Each
    item (its `input` and any field overriding the batch's) is checked on its own, as a
    speech request, so that one bad item fails alone."""

    items: list[dict[str, Any]] = Field(..., min_length=1, max_length=MAX_BATCH_ITEMS)


class BatchItemResult(BaseModel):
    index: int
    status: Literal["success", "error"]
    audio_data: str | None = None        # base64 of the encoded audio
    media_type: str | None = None
    sample_rate: int | None = None
    audio_seconds: float | None = None
    # word_timestamps asked for: [{word, start_ms, end_ms}] in this item's audio
    word_timestamps: list[dict[str, Any]] | None = None
    error: str | None = None
    status_code: int | None = None


class BatchSpeechResponse(BaseModel):
    id: str
    results: list[BatchItemResult]
    total: int
    succeeded: int
    failed: int


class SessionConfig(SpeechFields):
    """The WebSocket session.config message: the REST fields (no input) plus how text fed
    incrementally is cut into requests."""

    type: Literal["session.config"] = "session.config"
    split_granularity: Literal["sentence", "clause", "none"] = Field(
        "none", description="'none' (default, as vLLM-Omni): the text buffered until input.done is "
        "one request; 'sentence': each sentence is synthesized as soon as it is complete, before "
        "input.done; 'clause' also cuts at , ; :")
    stream_audio: bool | None = Field(None, description="accepted for vLLM-Omni clients: audio "
                                      "always streams as binary frames")


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
