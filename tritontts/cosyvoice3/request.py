"""Per-request parameters of the CosyVoice3 family: the one place that validates them."""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from ..stage import InvalidRequest, reject_unknown, seed_param

KNOWN = {"ref_audio", "ref_text", "seed", "speed"}
MAX_REF_AUDIO_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class CosyVoice3Params:
    ref_audio: bytes
    ref_text: str
    seed: int | None


def parse_cosyvoice3_params(params: dict[str, Any]) -> CosyVoice3Params:
    reject_unknown(params, KNOWN, "cosyvoice3")
    speed = params.get("speed", 1.0)
    if speed not in (None, 1, 1.0):
        raise InvalidRequest("cosyvoice3 streams at speed 1.0 only; omit speed")
    ref_audio, ref_text = params.get("ref_audio"), params.get("ref_text")
    if not ref_audio or not isinstance(ref_audio, str):
        raise InvalidRequest("cosyvoice3 clones a voice: ref_audio (base64 audio, 1-30 s) is required")
    if not ref_text or not isinstance(ref_text, str) or not ref_text.strip():
        raise InvalidRequest("cosyvoice3 clones a voice: ref_text (the transcript of ref_audio) is required")
    if ref_audio.startswith("data:"):  # data URLs from browsers: data:audio/wav;base64,....
        ref_audio = ref_audio.partition(",")[2]
    if len(ref_audio) * 3 // 4 > MAX_REF_AUDIO_BYTES:
        raise InvalidRequest(f"ref_audio is larger than {MAX_REF_AUDIO_BYTES // 2**20} MiB")
    try:
        audio = base64.b64decode(ref_audio, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("ref_audio must be base64-encoded audio (wav, flac, mp3, ogg)") from None
    return CosyVoice3Params(audio, ref_text.strip(), seed_param(params))
