"""Per-request parameters of the CosyVoice3 family: the one place that validates them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...sampling import sampling_overrides
from ...protocol import InvalidRequest, RequestFields, audio_param, seed_param
from ...voice import VOICE_FEATURES, voice_features_param

# Upstream's repetition-aware sampling knobs (cosyvoice3.yaml llm.sampling), overridable.
SAMPLING_KNOBS = ("top_p", "top_k", "win_size", "tau_r")
FIELDS = RequestFields(
    takes={
        "ref_audio":
            "required (or a stored voice): a recording to clone (base64, a data: URL; the front fetches URLs), 1-30 s",
        "ref_text": "its transcript, required with ref_audio",
        VOICE_FEATURES: "a stored voice (tritontts.voice), sent by the front for an uploaded one",
        "seed": "the talker's sampler and the flow's noise",
        "speed": "1 only (streams at speed 1.0)",
        "top_p": "RAS sampling override (upstream 0.8)",
        "top_k": "RAS sampling override (upstream 25)",
        "win_size": "RAS window (upstream 10)",
        "tau_r": "RAS repetition threshold (upstream 0.1)",
    },
)


@dataclass(frozen=True)
class CosyVoice3Params:
    ref_audio: bytes | None           # None when voice_features are given
    ref_text: str | None
    seed: int | None
    voice_features: bytes | None = None   # a stored voice's features (tritontts.voice)
    sampling: dict = field(default_factory=dict)   # checked overrides (tritontts.sampling)


def parse_cosyvoice3_params(params: dict[str, Any]) -> CosyVoice3Params:
    FIELDS.check(params, "cosyvoice3")
    speed = params.get("speed", 1.0)
    if speed not in (None, 1, 1.0):
        raise InvalidRequest("cosyvoice3 streams at speed 1.0 only; omit speed")
    ref_audio, ref_text = params.get("ref_audio"), params.get("ref_text")
    if params.get(VOICE_FEATURES) is not None:
        if ref_audio is not None or ref_text is not None:
            raise InvalidRequest("a stored voice (voice_features) replaces ref_audio and ref_text; "
                                 "send one or the other")
        return CosyVoice3Params(None, None, seed_param(params),
                                voice_features_param(params[VOICE_FEATURES]),
                                sampling_overrides(params, SAMPLING_KNOBS))
    if not ref_audio or not isinstance(ref_audio, str):
        raise InvalidRequest("cosyvoice3 clones a voice: ref_audio (base64 audio, 1-30 s) is required")
    if not ref_text or not isinstance(ref_text, str) or not ref_text.strip():
        raise InvalidRequest("cosyvoice3 clones a voice: ref_text (the transcript of ref_audio) is required")
    return CosyVoice3Params(audio_param(ref_audio), ref_text.strip(), seed_param(params),
                            sampling=sampling_overrides(params, SAMPLING_KNOBS))
