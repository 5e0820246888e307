"""Per-request parameters of the GLM-TTS family: the one place that validates them (the
prompt stage and the HTTP front both call parse_glm_tts_params).

  ref_audio, ref_text   required (GLM-TTS is zero-shot cloning only): a 3-10 s reference
                        recording (base64 or a data: URL; the front also fetches URLs and
                        file:// paths into it) and its transcript
  voice_features        a stored voice (tritontts.voice), replacing ref_audio + ref_text
  seed                  the talker's sampler and the flow's starting noise
  max_new_tokens        1..4096 speech tokens for the whole request (25 a second); without
                        it each segment runs to upstream's cap (20 tokens per text token)
  top_p, top_k, win_size, tau_r   repetition-aware sampling overrides (upstream's defaults
                        0.8, 25, 10, 0.1)
  non_streaming_mode    true: upstream's whole-utterance synthesis (each segment's tokens
                        all generated, then one full-attention flow run and one vocoder
                        pass; vLLM-Omni's --no-async-chunk); false: streamed chunks
                        (block-causal). Absent: the talker's model.json non_streaming_mode

What the model cannot do is a 400 that says so: instructions, voice design, a language
(it reads the language from the text) and speed other than 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...sampling import sampling_overrides
from ...protocol import InvalidRequest, RequestFields, int_param, seed_param, speed_refusal
from ...voice import VOICE_FEATURES, transcribed_reference

SAMPLING_KNOBS = ("top_p", "top_k", "win_size", "tau_r")
MAX_NEW_TOKENS = 4096          # speech tokens a request may ask for (164 s at 25 a second)
UNSUPPORTED = {
    "instructions": "GLM-TTS takes no style instructions; it speaks in the voice and manner "
                    "of ref_audio",
    "task_type": "GLM-TTS has one task, speech in the voice of ref_audio; omit task_type",
    "language": "GLM-TTS reads the language from the text itself; omit language",
    "speed": speed_refusal('GLM-TTS'),
}
FIELDS = RequestFields(
    takes={
        "ref_audio":
            "required (or a stored voice): a recording to clone (base64, a data: URL; the front fetches URLs), 3-10 s",
        "ref_text": "its transcript, required with ref_audio",
        VOICE_FEATURES: "a stored voice (tritontts.voice), sent by the front for an uploaded one",
        "seed": "the talker's sampler and the flow's starting noise",
        "max_new_tokens": "1..4096 speech tokens for the whole request (25 a second); the audio "
                          "ends where they run out (default: each segment's own cap, 20 per text token)",
        "top_p": "RAS sampling override (upstream 0.8)",
        "top_k": "RAS sampling override (upstream 25)",
        "win_size": "RAS window (upstream 10)",
        "tau_r": "RAS repetition threshold (upstream 0.1)",
        "non_streaming_mode": "true: upstream's whole-utterance synthesis per segment (full-attention flow, "
                              "one vocoder pass; the audio comes per segment); false: streamed chunks; "
                              "default: the talker's model.json (false; --stage-setting "
                              "glm_tts_talker.non_streaming_mode=true is vLLM-Omni's --no-async-chunk)",
    },
    refuses=UNSUPPORTED,
)


@dataclass(frozen=True)
class GLMTTSParams:
    ref_audio: bytes | None          # None when voice_features are given
    ref_text: str | None
    voice_features: bytes | None
    seed: int | None
    sampling: dict = field(default_factory=dict)
    whole: bool | None = None            # non_streaming_mode (None: the talker's default)
    max_new_tokens: int | None = None    # speech tokens for the whole request (None: no cap)


def parse_glm_tts_params(params: dict[str, Any]) -> GLMTTSParams:
    FIELDS.check(params, "glm_tts")
    ref_audio, ref_text, features = transcribed_reference(params, "GLM-TTS")
    if ref_audio is None and features is None:
        raise InvalidRequest("GLM-TTS clones a voice: send ref_audio (a 3-10 s recording) with "
                             "ref_text (its transcript), or use a voice uploaded with POST /v1/audio/voices")
    whole = params.get("non_streaming_mode")
    if whole is not None and not isinstance(whole, bool):
        raise InvalidRequest(f"non_streaming_mode must be true or false, got {whole!r}")
    return GLMTTSParams(ref_audio, ref_text, features, seed_param(params),
                        sampling_overrides(params, SAMPLING_KNOBS), whole,
                        int_param(params, "max_new_tokens", 1, MAX_NEW_TOKENS))
