"""Per-request parameters of the Voxtral TTS family: the one place that validates them (the
prompt stage and the HTTP front both call parse_voxtral_tts_params).

  voice             a preset voice of the checkpoint (params.json's voices; `default` is the
                    first); checked by the prompt stage, which knows the checkpoint
  seed              every frame's flow-matching noise
  max_new_tokens    1..4096 frames (12.5 per second; without it vLLM-Omni's stage default, 2048)
  cfg_value         classifier-free guidance of the acoustic flow, 0.5..5 (upstream's 1.2)

What the released model cannot do is a 400 that says so: cloning from ref_audio (the
released checkpoint has no codec encoder), instructions, task_type, language, speed != 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...sampling import sampling_overrides
from ...protocol import RequestFields, int_param, seed_param, speed_refusal

SAMPLING_KNOBS = ("cfg_value",)
UNSUPPORTED = {
    "ref_audio": "Voxtral TTS speaks in its preset voices only (the released checkpoint has no "
                 "codec encoder to clone a recording); pick a voice from GET /v1/audio/voices",
    "ref_text": "Voxtral TTS does not clone: omit ref_text and pick a preset voice",
    "instructions": "Voxtral TTS takes no style instructions; pick a preset voice",
    "task_type": "Voxtral TTS has one task (speech in a preset voice); omit task_type",
    "language": "Voxtral TTS reads the language from the text itself; omit language",
    "speed": speed_refusal('Voxtral TTS'),
}
FIELDS = RequestFields(
    takes={
        "seed": "every frame's flow-matching noise",
        "max_new_tokens": "1..4096 frames (12.5 per second; default 2048)",
        "cfg_value": "classifier-free guidance of the acoustic flow, 0.5..5 (upstream 1.2)",
    },
    refuses=UNSUPPORTED,
)
MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class VoxtralTTSParams:
    seed: int | None
    max_new_tokens: int | None
    sampling: dict = field(default_factory=dict)


def parse_voxtral_tts_params(params: dict[str, Any]) -> VoxtralTTSParams:
    FIELDS.check(params, "voxtral_tts")
    return VoxtralTTSParams(seed=seed_param(params),
                            max_new_tokens=int_param(params, "max_new_tokens", 1, MAX_NEW_TOKENS),
                            sampling=sampling_overrides(params, SAMPLING_KNOBS))
