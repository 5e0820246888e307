"""Per-request parameters of the OmniVoice family: the one place that validates them
(the prompt stage and the HTTP front both call parse_omnivoice_params).

  language         an ISO 639 code or a language name OmniVoice was trained on
                   (tritontts/families/omnivoice/languages.tsv); absent: language-agnostic
  instructions     voice design: comma-separated attributes (female, low pitch, british
                   accent, whisper, ...; or Chinese ones), checked as the reference does
  ref_audio        cloning: a reference recording (base64 or a data: URL), 1-30 s
  ref_text         its transcript (required with ref_audio: nothing here transcribes)
  voice_features   a stored voice's reference codes (tritontts.voice; the front sends them
                   for a voice uploaded with POST /v1/audio/voices)
  speed            0.25-4: divides the estimated duration (the model speaks the text in
                   fewer or more frames)
  seed             the Gumbel noise of the unmasking steps
  num_steps        unmasking steps, 4-64 (default 32)
  guidance_scale   classifier-free guidance, 0-10 (default 2; 0 skips the unconditional pass)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...protocol import InvalidRequest, RequestFields, number_param, seed_param
from ...voice import VOICE_FEATURES, transcribed_reference
from .text import resolve_instructions, resolve_language

FIELDS = RequestFields(
    takes={
        "language":
            "an ISO 639 code or a language name OmniVoice was trained on; absent: language-agnostic",
        "instructions":
            "voice design: comma-separated attributes (female, low pitch, british accent, whisper, ...)",
        "ref_audio":
            "cloning: a recording to clone (base64, a data: URL; the front fetches URLs), 1-30 s",
        "ref_text": "its transcript (required with ref_audio)",
        VOICE_FEATURES: "a stored voice (tritontts.voice), sent by the front for an uploaded one",
        "speed": "0.25-4: divides the estimated duration",
        "seed": "the Gumbel noise of the unmasking steps",
        "num_steps": "unmasking steps, 4-64 (default 32)",
        "guidance_scale": "classifier-free guidance, 0-10 (default 2)",
    },
)
DEFAULT_STEPS, MIN_STEPS, MAX_STEPS = 32, 4, 64
DEFAULT_GUIDANCE, MAX_GUIDANCE = 2.0, 10.0
MIN_SPEED, MAX_SPEED = 0.25, 4.0
MAX_TEXT_FIELD_CHARS = 1024


@dataclass(frozen=True)
class OmniVoiceParams:
    language: str | None
    instructions: str | None       # raw; resolved against the text by the stage
    ref_audio: bytes | None
    ref_text: str | None
    voice_features: bytes | None
    speed: float
    seed: int | None
    num_steps: int
    guidance_scale: float

    @property
    def cloning(self) -> bool:
        return self.ref_audio is not None or self.voice_features is not None


def _text_field(params: dict[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{name} must be non-empty text")
    if len(value) > MAX_TEXT_FIELD_CHARS:
        raise InvalidRequest(f"{name} is {len(value)} characters; the limit is {MAX_TEXT_FIELD_CHARS}")
    return value.strip()


def parse_omnivoice_params(params: dict[str, Any]) -> OmniVoiceParams:
    FIELDS.check(params, "omnivoice")
    language = params.get("language")
    if language is not None and not isinstance(language, str):
        raise InvalidRequest("language must be text: an ISO 639 code such as en or a name such as English")
    steps = params.get("num_steps", DEFAULT_STEPS)
    if isinstance(steps, bool) or not isinstance(steps, int) or not MIN_STEPS <= steps <= MAX_STEPS:
        raise InvalidRequest(f"num_steps must be an integer from {MIN_STEPS} to {MAX_STEPS}, got {steps!r}")
    ref_audio, ref_text, features = transcribed_reference(params, "OmniVoice")
    instructions = _text_field(params, "instructions")
    # Checked here for the front's 400; the stage resolves them again against the text
    # (Chinese text turns the attributes into their Chinese forms).
    resolve_instructions(instructions, "")
    return OmniVoiceParams(
        language=resolve_language(language),
        instructions=instructions,
        ref_audio=ref_audio, ref_text=ref_text, voice_features=features,
        speed=number_param(params, "speed", 1.0, MIN_SPEED, MAX_SPEED),
        seed=seed_param(params), num_steps=steps,
        guidance_scale=number_param(params, "guidance_scale", DEFAULT_GUIDANCE, 0.0, MAX_GUIDANCE))
