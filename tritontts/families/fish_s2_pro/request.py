"""Per-request parameters of the Fish Speech S2 Pro family: the one place that validates them
(the prompt stage and the HTTP front both call parse_fish_s2_pro_params).

  ref_audio              a 1-30 s recording to clone (base64 or a data: URL; the front also
                         fetches URLs and file:// paths into it)
  ref_text               its transcript (required with ref_audio: upstream conditions on the
                         recording and what it says, and ignores a recording without one)
  voice_features         a stored voice (tritontts.voice), replacing ref_audio + ref_text
  seed                   every draw of the request (main tokens and codes)
  max_new_tokens         1..4096 frames (21.5 a second; upstream's default 1024 without it)
  temperature, top_p     upstream's sampling of the main token and the codes (0.8 and 0.8;
                         top-k is fixed at 30 as upstream fixes it); top level or in
                         extra_params

The text may carry <|speaker:N|> tags (a dialogue) and upstream's inline cues; any other
control token is refused by the prompt stage. What the model cannot do is a 400 that says so:
instructions, task_type, language and speed other than 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...sampling import sampling_overrides
from ...protocol import RequestFields, int_param, seed_param, speed_refusal
from ...voice import VOICE_FEATURES, transcribed_reference

SAMPLING_KNOBS = ("temperature", "top_p")
UNSUPPORTED = {
    "instructions": "Fish Speech S2 Pro takes its cues inline in the text (e.g. [whisper]); "
                    "omit instructions",
    "task_type": "Fish Speech S2 Pro has one task (speech from text, optionally cloned); omit task_type",
    "language": "Fish Speech S2 Pro reads the language from the text itself; omit language",
    "speed": speed_refusal('Fish Speech S2 Pro'),
}
FIELDS = RequestFields(
    takes={
        "ref_audio":
            "a recording to clone (base64, a data: URL; the front fetches URLs), 1-30 s, with ref_text",
        "ref_text": "its transcript (required with ref_audio)",
        VOICE_FEATURES: "a stored voice (tritontts.voice), sent by the front for an uploaded one",
        "seed": "every draw of the request (main tokens and codes)",
        "max_new_tokens": "1..4096 frames (21.5 a second; default 1024)",
        "temperature": "upstream's sampling of the main token and the codes (0.8)",
        "top_p": "upstream's nucleus (0.8; top-k fixed at 30 as upstream)",
    },
    refuses=UNSUPPORTED,
)
MAX_NEW_TOKENS = 4096
DEFAULT_MAX_NEW_TOKENS = 1024


@dataclass(frozen=True)
class FishS2ProParams:
    ref_audio: bytes | None
    ref_text: str | None
    voice_features: bytes | None
    seed: int | None
    max_new_tokens: int | None
    sampling: dict = field(default_factory=dict)


def parse_fish_s2_pro_params(params: dict[str, Any]) -> FishS2ProParams:
    FIELDS.check(params, "fish_s2_pro")
    ref_audio, ref_text, features = transcribed_reference(params, "Fish Speech S2 Pro")
    return FishS2ProParams(
        ref_audio=ref_audio, ref_text=ref_text, voice_features=features, seed=seed_param(params),
        max_new_tokens=int_param(params, "max_new_tokens", 1, MAX_NEW_TOKENS),
        sampling=sampling_overrides(params, SAMPLING_KNOBS))
