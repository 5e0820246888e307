"""The ensemble protocol every family speaks, and the request validators every parser uses
(no Triton, no torch: the front imports it).

Every family ensemble takes the same inputs and streams the same outputs, so the front,
tritonclient users and perf_analyzer talk to all families alike:

  inputs   text   BYTES [1]   UTF-8 text to speak
           voice  BYTES [1]   voice name ("" = the family's default voice)
           params BYTES [1]   JSON object of per-request parameters ("" = {}), validated
                              by the family's own parser (e.g. tritontts.piper.request)
  outputs  audio        FP32  [-1]  mono samples in [-1, 1] for one chunk
           sample_rate  INT32 [1]
           chunk_index  INT32 [1]   0, 1, 2, ... in order
           is_final     BOOL  [1]   true on the request's last chunk

Between stages, every chunk also carries stream_id (INT64 [1], random per request, set by
the family's first stage): any per-stream state in a later stage is keyed by it, never by
instance or arrival order.

Word timestamps (a server started with --word-aligner): the stages also carry
words_request (BYTES [1]: "" when the request does not ask, else a JSON object with the text
to align, set by the first stage's host from params' word_timestamps), and the ensemble
ends with the word_aligner stage, whose extra output is

           words        BYTES [1]   JSON list of {word, start_ms, end_ms}: the words placed
                                    with this chunk, ms from the request's first sample

Errors: a stage answers a bad request with a TritonError whose message starts with
INVALID_REQUEST_TAG; the front turns that into HTTP 400 with the rest of the message. A
stage that could not answer for want of a server resource (its response did not fit the
shared memory Triton's Python backend moves tensors through) starts its message with
UNAVAILABLE_TAG: HTTP 503, retry later. Any other error is a server fault (HTTP 500).
"""
from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TEXT, VOICE, PARAMS = "text", "voice", "params"
AUDIO, SAMPLE_RATE, CHUNK_INDEX, IS_FINAL = "audio", "sample_rate", "chunk_index", "is_final"
STREAM_ID = "stream_id"
ENSEMBLE_INPUTS = (TEXT, VOICE, PARAMS)
ENSEMBLE_OUTPUTS = (AUDIO, SAMPLE_RATE, CHUNK_INDEX, IS_FINAL)
WORDS_REQUEST, WORDS = "words_request", "words"
WORD_TIMESTAMPS = "word_timestamps"     # the request field (params), as vLLM-Omni names it
# The languages the configured aligner places words in (the launcher sets it for the stages).
WORD_ALIGNER_LANGUAGES_ENV = "TRITONTTS_WORD_ALIGNER_LANGUAGES"

INVALID_REQUEST_TAG = "[invalid_request]"
UNAVAILABLE_TAG = "[unavailable]"

# Longest text one request may carry; longer input is a 400, not an hour of audio.
MAX_INPUT_CHARS = 4096


class InvalidRequest(ValueError):
    """The request is wrong and the message says what to fix (HTTP 400)."""


def check_text(text: str) -> str:
    """The input text rules every family shares (the front checks them too, for a 400
    before Triton is asked)."""
    if not text or not text.strip():
        raise InvalidRequest("input is empty: give the text to speak")
    if len(text) > MAX_INPUT_CHARS:
        raise InvalidRequest(f"input is {len(text)} characters; the limit is {MAX_INPUT_CHARS}: "
                             "split it into several requests")
    if not any(unicodedata.category(c)[0] in "LN" for c in text):
        # Punctuation, emoji, invisible characters only: families that read raw text spoke
        # noise for it, the others refused it; now every family refuses it the same way.
        raise InvalidRequest("input has nothing to speak (no letters or digits): give the text to speak")
    return text


def decode_params(raw: str | bytes | None) -> dict[str, Any]:
    """Decode the `params` tensor: empty means no parameters."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="strict")
    if not raw:
        return {}
    try:
        params = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"params must be a JSON object: {exc}") from None
    if not isinstance(params, dict):
        raise InvalidRequest("params must be a JSON object")
    return params


# The `language` values that name each language a word aligner may place words in (ISO 639
# code -> every spelling a request may use; a code not here matches only itself).
LANGUAGE_NAMES = {
    "en": ("en", "eng", "english", "en-us", "en-gb", "en_us", "en_gb"),
    "zh": ("zh", "zho", "chinese", "mandarin", "zh-cn", "zh_cn"),
    "yue": ("yue", "cantonese", "zh-hk", "zh_hk"),
    "fr": ("fr", "fra", "french"),
    "de": ("de", "deu", "german"),
    "it": ("it", "ita", "italian"),
    "ja": ("ja", "jpn", "japanese"),
    "ko": ("ko", "kor", "korean"),
    "pt": ("pt", "por", "portuguese", "pt-br", "pt_br"),
    "ru": ("ru", "rus", "russian"),
    "es": ("es", "spa", "spanish"),
}
_ANY_LANGUAGE = ("", "auto")


def words_request(text: str, params: dict[str, Any], languages: tuple[str, ...] | None) -> str:
    """The words_request a request carries between stages: "" unless params ask for
    word_timestamps (which is taken out of `params`: the family's own parser never sees it),
    else the text to align as JSON. `languages`: the aligner's (None: no aligner is
    configured); a request for another language, or with no aligner, is an InvalidRequest."""
    asked = params.pop(WORD_TIMESTAMPS, False)
    if asked in (False, None):
        return ""
    if asked is not True:
        raise InvalidRequest(f"{WORD_TIMESTAMPS} must be true or false, got {asked!r}")
    if languages is None:
        raise InvalidRequest(f"{WORD_TIMESTAMPS} needs a word aligner: start the server with "
                             "--word-aligner (python -m frontend --word-aligner ...)")
    language = str(params.get("language") or "").strip().lower()
    if language not in _ANY_LANGUAGE and not any(
            language in LANGUAGE_NAMES.get(code, (code,)) for code in languages):
        raise InvalidRequest(f"{WORD_TIMESTAMPS}: the word aligner places words in "
                             f"{', '.join(languages)} only, not language {params.get('language')!r}")
    return json.dumps({"text": text})


def split_unavailable(message: str) -> str | None:
    """The stage's reason if it is a want of a server resource (UNAVAILABLE_TAG)."""
    idx = message.find(UNAVAILABLE_TAG)
    return None if idx < 0 else message[idx + len(UNAVAILABLE_TAG):].strip()


def split_invalid_request(message: str) -> str | None:
    """Return the client-facing part of a stage error if it is a request error."""
    idx = message.find(INVALID_REQUEST_TAG)
    if idx < 0:
        return None
    return message[idx + len(INVALID_REQUEST_TAG):].strip()


@dataclass(frozen=True)
class RequestFields:
    """A family's request fields, declared once: what it takes (field -> what it does) and
    what it refuses (field -> why: the 400's message). Its parser checks a request with
    `check`, the front names `takes` in its 400 for a field the family does not know, and
    the family's docs page shows `table()` (tests/contract/test_docs.py keeps it there)."""
    takes: Mapping[str, str]
    refuses: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        both = set(self.takes) & set(self.refuses)
        if both:
            raise ValueError(f"fields both taken and refused: {sorted(both)}")

    @property
    def known(self) -> frozenset[str]:
        return frozenset(self.takes) | frozenset(self.refuses)

    def check(self, params: dict[str, Any], family: str) -> None:
        """400 for a field neither taken nor refused (naming what is taken), then for a
        refused one (its reason)."""
        unknown = set(params) - self.known
        if unknown:
            raise InvalidRequest(f"unknown parameter(s) {sorted(unknown)} for {family}; "
                                 f"it takes: {', '.join(sorted(self.takes)) or 'none'}")
        reject_unsupported(params, self.refuses)

    def table(self) -> str:
        rows = ["| field | |", "|---|---|"]
        rows += [f"| `{name}` | {what} |" for name, what in self.takes.items()]
        rows += [f"| `{name}` | refused: {why} |" for name, why in self.refuses.items()]
        return "\n".join(rows) + "\n"


# How a client shows each field a family takes (GET /v1/audio/models; the demo page builds its
# form from it): text, long_text, audio (an upload or a recording, sent as a data: URL),
# integer, number, boolean, choice (its values: the checkpoint's Form.choices), json (a list
# or object typed as JSON), internal (the front fills it in; never a user's field).
# tests/front/test_front_models_api.py keeps every family's fields here. MAIN_FIELDS are shown
# first; the others go under a form's "advanced" section.
FIELD_KINDS = {
    "instructions": "long_text", "ref_audio": "audio", "ref_text": "text", "language": "text",
    "task_type": "choice", "input_mode": "choice", "clone_mode": "choice", "sampling_method": "choice",
    "duration_seconds": "number", "seed": "integer", "speed": "number",
    "max_new_tokens": "integer", "initial_codec_chunk_frames": "integer", "num_steps": "integer",
    "num_inference_steps": "integer", "inference_timesteps": "integer", "top_k": "integer",
    "subtalker_top_k": "integer", "win_size": "integer",
    "temperature": "number", "top_p": "number", "repetition_penalty": "number",
    "subtalker_temperature": "number", "subtalker_top_p": "number", "guidance_scale": "number",
    "cfg_value": "number", "sway": "number", "tau_r": "number", "noise_scale": "number",
    "noise_w_scale": "number",
    "non_streaming_mode": "boolean", "x_vector_only_mode": "boolean", "vae_sample": "boolean",
    "t_grid": "json", "speaker_embedding": "json",
    "voice_features": "internal",
}
MAIN_FIELDS = ("task_type", "instructions", "input_mode", "language", "ref_audio", "ref_text",
               "clone_mode", "duration_seconds", "speed", "seed")


def speed_refusal(family: str) -> str:
    """The reason every family without duration control gives for `speed` in its stages'
    params (a gRPC client's): the HTTP front serves it as a time-stretch of the audio."""
    return (f"{family} has no duration control: the HTTP front serves speed as a time-stretch "
            f"of its audio (pitch kept); over gRPC omit speed")


def reject_unsupported(params: dict[str, Any], unsupported: dict[str, str]) -> None:
    """Fields other families take that this one cannot honour: a 400 with the family's own
    reason. speed 1 and an automatic language mean "nothing asked", so they pass."""
    for name, why in unsupported.items():
        if not asks_nothing(name, params.get(name)):
            raise InvalidRequest(f"{name}: {why}")


def asks_nothing(name: str, value: Any) -> bool:
    """A refused field that asks for nothing: absent, false or empty, speed 1, an automatic
    language."""
    if value is None or value is False or (isinstance(value, (str, list, dict)) and not value):
        return True
    return (name == "speed" and value == 1) or (name == "language" and value in ("auto", "Auto"))


# Largest uploaded audio a request may carry (decoded), e.g. a voice-cloning reference.
MAX_AUDIO_PARAM_BYTES = 16 * 1024 * 1024


def audio_param(value: Any, name: str = "ref_audio") -> bytes:
    """An audio file sent inside the JSON params: base64, or a browser's data: URL."""
    import base64
    import binascii

    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{name} must be base64-encoded audio (wav, flac, mp3, ogg) or a data: URL")
    if value.startswith("data:"):   # data:audio/wav;base64,....
        value = value.partition(",")[2]
    if len(value) * 3 // 4 > MAX_AUDIO_PARAM_BYTES:
        raise InvalidRequest(f"{name} is larger than {MAX_AUDIO_PARAM_BYTES // 2**20} MiB")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{name} must be base64-encoded audio (wav, flac, mp3, ogg)") from None


def number_param(params: dict[str, Any], name: str, default: float | None,
                 low: float, high: float) -> float | None:
    """A numeric parameter within [low, high], or the default when absent/null."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{name} must be a number between {low} and {high}")
    if not low <= float(value) <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}, got {value}")
    return float(value)


def int_param(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """An integer parameter within [low, high], or None when absent/null."""
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def seed_param(params: dict[str, Any]) -> int | None:
    value = params.get("seed")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidRequest("seed must be a non-negative integer below 2**63")
    return value


def at_least_one_row(array: np.ndarray) -> np.ndarray:
    """Triton tensors here are never empty: a zero-row array travels as one zero row (the
    count travels beside it)."""
    return array if array.shape[0] else np.zeros((1,) + array.shape[1:], array.dtype)
