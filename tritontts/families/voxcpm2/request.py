"""Per-request parameters of the VoxCPM2 family: the one place that validates them (the
prompt stage and the HTTP front both call parse_voxcpm2_params).

  ref_audio              a 1-30 s recording to clone (base64 or a data: URL; the front also
                         fetches URLs and file:// paths into it)
  ref_text               its transcript (optional): with it the model can also continue the
                         recording, not only imitate it
  clone_mode             how the recording is used (upstream's three prompt layouts):
                           reference     the voice only, isolated between reference markers
                                         (the default without ref_text)
                           continuation  the speech continues the recording (needs ref_text)
                           both          reference and continuation together (needs
                                         ref_text; the default with it: upstream's closest
                                         cloning)
  voice_features         a stored voice (tritontts.voice), replacing ref_audio + ref_text
  seed                   the flow-matching noise of every patch
  max_new_tokens         1..4096 patches (6.25 per second); upstream's own cap of 6 patches
                         per text token + 10 still applies
  cfg_value              classifier-free guidance, 0.5..5 (upstream's default 2)
  inference_timesteps    flow-matching steps per patch, 1..50 (upstream's default 10)

What the model cannot do is a 400 that says so: instructions, task_type, language and speed
other than 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...sampling import sampling_overrides
from ...protocol import InvalidRequest, RequestFields, int_param, seed_param, speed_refusal
from ...voice import VOICE_FEATURES, transcribed_reference

SAMPLING_KNOBS = ("cfg_value", "inference_timesteps")
CLONE_MODES = ("reference", "continuation", "both")
UNSUPPORTED = {
    "instructions": "VoxCPM2 takes no style instructions; it speaks in the voice of ref_audio "
                    "(or its own, without one)",
    "task_type": "VoxCPM2 has one task (speech from text, optionally cloned); omit task_type",
    "language": "VoxCPM2 reads the language from the text itself; omit language",
    "speed": speed_refusal('VoxCPM2'),
}
FIELDS = RequestFields(
    takes={
        "ref_audio":
            "a recording to clone (base64, a data: URL; the front fetches URLs), 1-30 s; absent: its own voice",
        "ref_text": "its transcript (optional): with it the model can also continue the recording",
        "clone_mode": "reference | continuation | both (continuation and both need ref_text)",
        VOICE_FEATURES: "a stored voice (tritontts.voice), sent by the front for an uploaded one",
        "seed": "the flow-matching noise of every patch",
        "max_new_tokens": "1..4096 patches (6.25 per second)",
        "cfg_value": "classifier-free guidance, 0.5..5 (upstream 2)",
        "inference_timesteps": "flow-matching steps per patch, 1..50 (upstream 10)",
    },
    refuses=UNSUPPORTED,
)
MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class VoxCPM2Params:
    ref_audio: bytes | None
    ref_text: str | None
    clone_mode: str | None           # None: no voice to clone
    voice_features: bytes | None
    seed: int | None
    max_new_tokens: int | None
    sampling: dict = field(default_factory=dict)


def parse_voxcpm2_params(params: dict[str, Any]) -> VoxCPM2Params:
    FIELDS.check(params, "voxcpm2")
    # The transcript is optional: without it the recording is only imitated, not continued.
    ref_audio, ref_text, features = transcribed_reference(params, "VoxCPM2", transcript_required=False)
    mode = params.get("clone_mode")
    if mode is not None and mode not in CLONE_MODES:
        raise InvalidRequest(f"clone_mode must be one of {', '.join(CLONE_MODES)}, got {mode!r}")
    cloning = ref_audio is not None or features is not None
    if mode is not None and not cloning:
        raise InvalidRequest("clone_mode says how ref_audio is used: send ref_audio (or a stored voice)")
    if mode in ("continuation", "both") and ref_audio is not None and ref_text is None:
        raise InvalidRequest(f"clone_mode {mode!r} continues the recording and needs ref_text, "
                             "its transcript; or use clone_mode 'reference'")
    if mode is None and ref_audio is not None:
        mode = "both" if ref_text is not None else "reference"
    return VoxCPM2Params(
        ref_audio=ref_audio, ref_text=ref_text, clone_mode=mode, voice_features=features,
        seed=seed_param(params), max_new_tokens=int_param(params, "max_new_tokens", 1, MAX_NEW_TOKENS),
        sampling=sampling_overrides(params, SAMPLING_KNOBS))
