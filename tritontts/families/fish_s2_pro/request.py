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
from ...protocol import int_param, reject_unknown, reject_unsupported, seed_param
from ...voice import VOICE_FEATURES, transcribed_reference

SAMPLING_KNOBS = ("temperature", "top_p")
UNSUPPORTED = {
    "instructions": "Fish Speech S2 Pro takes its cues inline in the text (e.g. [whisper]); "
                    "omit instructions",
    "task_type": "Fish Speech S2 Pro has one task (speech from text, optionally cloned); omit task_type",
    "language": "Fish Speech S2 Pro reads the language from the text itself; omit language",
    "speed": "Fish Speech S2 Pro speaks at speed 1.0 only (it has no duration control); omit speed",
}
KNOWN = frozenset({"ref_audio", "ref_text", VOICE_FEATURES, "seed", "max_new_tokens", *SAMPLING_KNOBS,
                   *UNSUPPORTED})
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
    reject_unknown(params, KNOWN, "fish_s2_pro")
    reject_unsupported(params, UNSUPPORTED)
    ref_audio, ref_text, features = transcribed_reference(params, "Fish Speech S2 Pro")
    return FishS2ProParams(
        ref_audio=ref_audio, ref_text=ref_text, voice_features=features, seed=seed_param(params),
        max_new_tokens=int_param(params, "max_new_tokens", 1, MAX_NEW_TOKENS),
        sampling=sampling_overrides(params, SAMPLING_KNOBS))
