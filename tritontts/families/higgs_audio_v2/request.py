"""Per-request parameters of the higgs-audio v2 family: the one place that validates them
(the prompt stage and the HTTP front both call parse_higgs_audio_v2_params).

  ref_audio, ref_text        cloning: a reference recording (base64 or a data: URL, 1-30 s)
                             and its transcript, always together (the reference is prompted
                             as an earlier turn: its transcript, then its audio)
  voice_features             a stored voice (tritontts.voice; the front sends them for a
                             voice uploaded with POST /v1/audio/voices)
  seed                       the code sampler's generator
  max_new_tokens             1..4096 audio frames (25 per second)
  initial_codec_chunk_frames 1..25: frames in the first audio chunk
  temperature, top_k, top_p  sampling overrides (temperature 0: greedy), over the
                             checkpoint's defaults (tritontts.sampling checks them)

What the model cannot do is a 400 that says so: multi-speaker [SPEAKERn] tags (dialogue needs
per-speaker system prompts, not served), instructions, task_type, language (the model takes
none of them as such) and speed other than 1 (no duration control).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...sampling import sampling_overrides
from ...protocol import InvalidRequest, RequestFields, int_param, seed_param, speed_refusal
from ...voice import VOICE_FEATURES, transcribed_reference
from .prompt import SPEAKER_TAG

SAMPLING_KNOBS = ("temperature", "top_k", "top_p")
# Fields other families take that this one cannot honour: named in a 400 of their own.
UNSUPPORTED = {
    "instructions": "higgs-audio v2 takes no style instructions; describe the voice by "
                    "cloning it (ref_audio + ref_text) instead",
    "task_type": "higgs-audio v2 has one task (speech from text, optionally cloned); omit task_type",
    "language": "higgs-audio v2 reads the language from the text itself; omit language",
    "speed": speed_refusal('higgs-audio v2'),
    # Upstream's other prompt forms, out of scope here as in vLLM-Omni (explicit 400s).
    "ref_audio_in_system_message": "the reference in a system-message block is not served: send ref_audio "
                                   "with ref_text (prompted as an earlier turn, upstream's default)",
    "speakers": "multi-speaker dialogue is not served: one speaker per request",
    "messages": "a chat conversation is not served: send the text in input",
}
FIELDS = RequestFields(
    takes={
        "ref_audio":
            "cloning: a recording to clone (base64, a data: URL; the front fetches URLs), 1-30 s, with ref_text",
        "ref_text": "its transcript, always with ref_audio",
        VOICE_FEATURES: "a stored voice (tritontts.voice), sent by the front for an uploaded one",
        "seed": "the code sampler's generator",
        "max_new_tokens": "1..4096 audio frames (25 per second)",
        "initial_codec_chunk_frames": "1..25: frames in the first audio chunk",
        "temperature": "sampling override (0: greedy)",
        "top_k": "sampling override",
        "top_p": "sampling override",
    },
    refuses=UNSUPPORTED,
)
MAX_NEW_TOKENS = 4096
MAX_INITIAL_CHUNK_FRAMES = 25


@dataclass(frozen=True)
class HiggsAudioV2Params:
    ref_audio: bytes | None
    ref_text: str | None
    voice_features: bytes | None
    seed: int | None
    max_new_tokens: int | None
    initial_codec_chunk_frames: int | None
    sampling: dict = field(default_factory=dict)

    @property
    def cloning(self) -> bool:
        return self.ref_audio is not None or self.voice_features is not None


def check_text(text: str) -> None:
    """The text to speak: speaker tags are a 400 naming them."""
    if SPEAKER_TAG.search(text):
        raise InvalidRequest("higgs-audio v2 is served for one speaker: remove the "
                             f"{SPEAKER_TAG.search(text).group(0)} tags (multi-speaker dialogue "
                             "is not supported)")


def parse_higgs_audio_v2_params(params: dict[str, Any]) -> HiggsAudioV2Params:
    FIELDS.check(params, "higgs_audio_v2")
    ref_audio, ref_text, features = transcribed_reference(params, "higgs-audio v2")
    if ref_text is not None:
        check_text(ref_text)
    return HiggsAudioV2Params(
        ref_audio=ref_audio, ref_text=ref_text, voice_features=features, seed=seed_param(params),
        max_new_tokens=int_param(params, "max_new_tokens", 1, MAX_NEW_TOKENS),
        initial_codec_chunk_frames=int_param(params, "initial_codec_chunk_frames", 1, MAX_INITIAL_CHUNK_FRAMES),
        sampling=sampling_overrides(params, SAMPLING_KNOBS))
