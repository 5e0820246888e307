"""Per-request parameters of the CosyVoice3 family: the one place that validates them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...sampling import METHOD, sampling_overrides
from ...protocol import InvalidRequest, RequestFields, audio_param, int_param, seed_param
from ...voice import VOICE_FEATURES, voice_features_param

# Upstream's repetition-aware sampling knobs (cosyvoice3.yaml llm.sampling), overridable;
# standard sampling (vLLM-Omni's GPU profile) has its own, and top_p/top_k in both.
RAS, STANDARD = "ras", "standard"
METHODS = (RAS, STANDARD)
RAS_KNOBS = ("top_p", "top_k", "win_size", "tau_r")
STANDARD_KNOBS = ("temperature", "top_p", "top_k", "repetition_penalty")
SAMPLING_KNOBS = tuple(dict.fromkeys(RAS_KNOBS + STANDARD_KNOBS))
# vLLM-Omni's H200 profile for CosyVoice3 (standard sampling instead of RAS).
STANDARD_SAMPLING = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.21}
MAX_NEW_TOKENS = 4096          # speech tokens a request may ask for (164 s at 25 a second)
FIELDS = RequestFields(
    takes={
        "ref_audio":
            "required (or a stored voice): a recording to clone (base64, a data: URL; the front fetches URLs), 1-30 s",
        "ref_text": "its transcript, required with ref_audio",
        VOICE_FEATURES: "a stored voice (tritontts.voice), sent by the front for an uploaded one",
        "seed": "the talker's sampler and the flow's noise",
        "max_new_tokens": "1..4096 speech tokens for the whole request (25 a second); the audio ends where "
                          "they run out (default: each segment's own cap, 20 per text token)",
        "speed": "1 only in the stages (the HTTP front time-stretches other speeds)",
        METHOD: "ras (upstream's repetition-aware sampling; the default, or the talker's model.json "
                "sampling_method: --stage-setting cosyvoice3_talker.sampling_method=standard) or standard "
                "(vLLM-Omni's GPU profile: temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.21)",
        "top_p": "sampling override (RAS: upstream 0.8; standard 0.8)",
        "top_k": "sampling override (RAS: upstream 25; standard 20)",
        "win_size": "RAS window (upstream 10; ras only)",
        "tau_r": "RAS repetition threshold (upstream 0.1; ras only)",
        "temperature": "standard sampling only (0.7)",
        "repetition_penalty": "standard sampling only (1.21)",
    },
)


@dataclass(frozen=True)
class CosyVoice3Params:
    ref_audio: bytes | None           # None when voice_features are given
    ref_text: str | None
    seed: int | None
    voice_features: bytes | None = None   # a stored voice's features (tritontts.voice)
    sampling: dict = field(default_factory=dict)   # checked overrides (tritontts.sampling)
    max_new_tokens: int | None = None     # speech tokens for the whole request (None: no cap)


def sampling_of(params: dict[str, Any]) -> dict:
    """The checked sampling overrides, with the method when the request names one; knobs of
    the other method are a 400 (with no method named, the talker checks them against its
    default)."""
    overrides = sampling_overrides(params, SAMPLING_KNOBS)
    method = params.get(METHOD)
    if method is None:
        return overrides
    if method not in METHODS:
        raise InvalidRequest(f"{METHOD} must be one of {', '.join(METHODS)}, got {method!r}")
    check_knobs(method, overrides)
    return {**overrides, METHOD: method}


def check_knobs(method: str, overrides: dict) -> None:
    allowed = RAS_KNOBS if method == RAS else STANDARD_KNOBS
    wrong = sorted(set(overrides) - set(allowed) - {METHOD})
    if wrong:
        raise InvalidRequest(f"{wrong[0]} is a knob of {STANDARD if method == RAS else RAS} sampling, not "
                             f"{method}: set {METHOD} to match or omit it")


def parse_cosyvoice3_params(params: dict[str, Any]) -> CosyVoice3Params:
    FIELDS.check(params, "cosyvoice3")
    speed = params.get("speed", 1.0)
    if speed not in (None, 1, 1.0):
        raise InvalidRequest("cosyvoice3 streams at speed 1.0 only; omit speed")
    budget = int_param(params, "max_new_tokens", 1, MAX_NEW_TOKENS)
    ref_audio, ref_text = params.get("ref_audio"), params.get("ref_text")
    if params.get(VOICE_FEATURES) is not None:
        if ref_audio is not None or ref_text is not None:
            raise InvalidRequest("a stored voice (voice_features) replaces ref_audio and ref_text; "
                                 "send one or the other")
        return CosyVoice3Params(None, None, seed_param(params),
                                voice_features_param(params[VOICE_FEATURES]),
                                sampling_of(params), budget)
    if not ref_audio or not isinstance(ref_audio, str):
        raise InvalidRequest("cosyvoice3 clones a voice: ref_audio (base64 audio, 1-30 s) is required")
    if not ref_text or not isinstance(ref_text, str) or not ref_text.strip():
        raise InvalidRequest("cosyvoice3 clones a voice: ref_text (the transcript of ref_audio) is required")
    return CosyVoice3Params(audio_param(ref_audio), ref_text.strip(), seed_param(params),
                            sampling=sampling_of(params), max_new_tokens=budget)
