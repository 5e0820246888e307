"""GET/POST /v1/audio/voices and DELETE /v1/audio/voices/{name}: the serving logic.

An upload is checked (name, consent, type, size, 1-30 s of sound), then every served model
that clones (Family.voice_encoder) computes the voice's features once, through its prompt
stage, in its family's first voice mode that fits whether the upload has a transcript
(Family.voice_mode: e.g. a Base Qwen3-TTS voice without ref_text is x-vector only; a family
that needs a transcript answers that it does, before Triton is asked); the recording, the
transcript and those features are stored together (VoiceStore). A request that names the
voice sends the stored features instead of the recording, so the reference is never
decoded, tokenized or embedded again. tritontts-voice (frontend/voice_cli.py) writes the
same folders offline from the same requests (serving.recording_params).
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import PurePath
from typing import Any

from tritontts.audio import decode_audio
from tritontts.protocol import InvalidRequest
from tritontts.voice import EMBEDDING_MODE

from .protocol import MAX_EMBEDDING_DIM
from .serving import SpeechError, SpeechService, recording_params
from .voices import StoredVoice, VoiceError, check_name

MAX_UPLOAD_BYTES = 10 * 1024 * 1024
MIN_SECONDS, MAX_SECONDS = 1.0, 30.0
MAX_CONSENT_CHARS = 256
MAX_REF_TEXT_CHARS = 4096
MAX_DESCRIPTION_CHARS = 1000
AUDIO_TYPES = {
    "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
    "audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/flac": "flac", "audio/x-flac": "flac",
    "audio/ogg": "ogg", "audio/opus": "ogg", "audio/webm": "webm", "audio/mp4": "m4a",
    "audio/x-m4a": "m4a", "audio/aac": "aac",
}
EXTENSIONS = {".wav": "wav", ".wave": "wav", ".mp3": "mp3", ".flac": "flac", ".ogg": "ogg",
              ".opus": "ogg", ".oga": "ogg", ".webm": "webm", ".m4a": "m4a", ".mp4": "m4a",
              ".aac": "aac"}


def check_text_field(value: str | None, name: str, limit: int, required: bool = False) -> str | None:
    value = value.strip() if isinstance(value, str) else None
    if not value:
        if required:
            raise SpeechError(400, f"{name} is required", param=name)
        return None
    if len(value) > limit:
        raise SpeechError(400, f"{name} is {len(value)} characters; the limit is {limit}", param=name)
    if any(ord(c) < 32 and c not in "\t\n" for c in value):
        raise SpeechError(400, f"{name} contains control characters", param=name)
    return value


def audio_extension(content_type: str | None, filename: str | None) -> str:
    """The stored file's extension, from the upload's declared type (or its file name when
    the type is generic); anything that is not a known audio type is a 400."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype in AUDIO_TYPES:
        return AUDIO_TYPES[ctype]
    suffix = PurePath(filename or "").suffix.lower()
    if ctype in ("", "application/octet-stream") and suffix in EXTENSIONS:
        return EXTENSIONS[suffix]
    raise SpeechError(400, f"audio_sample is {ctype or 'untyped'} ({filename or 'no file name'}); "
                      f"send one of: {', '.join(sorted(set(AUDIO_TYPES.values())))}", param="audio_sample")


def check_upload_size(audio: bytes) -> None:
    if len(audio) > MAX_UPLOAD_BYTES:
        raise SpeechError(413, f"audio_sample is larger than {MAX_UPLOAD_BYTES // 2**20} MB",
                          param="audio_sample")


def check_recording(data: bytes) -> float:
    """Seconds of a decodable, non-silent recording of 1-30 s (else a 400)."""
    try:
        audio, rate = decode_audio(data, "audio_sample")
    except InvalidRequest as exc:
        raise SpeechError(400, str(exc), param="audio_sample") from None
    seconds = audio.size / rate
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise SpeechError(400, f"audio_sample is {seconds:.1f} s long; it must be between "
                          f"{MIN_SECONDS:g} and {MAX_SECONDS:g} s", param="audio_sample")
    if float(abs(audio).max()) < 1e-4:
        raise SpeechError(400, "audio_sample is silent", param="audio_sample")
    return seconds


def parse_embedding(text: str) -> list[float]:
    try:
        value = json.loads(text)
    except ValueError:
        raise SpeechError(400, "speaker_embedding must be a JSON list of numbers",
                          param="speaker_embedding") from None
    if (not isinstance(value, list) or not 1 <= len(value) <= MAX_EMBEDDING_DIM
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise SpeechError(400, f"speaker_embedding must be a JSON list of 1 to {MAX_EMBEDDING_DIM} "
                          "numbers", param="speaker_embedding")
    if not all(math.isfinite(v) for v in value):
        raise SpeechError(400, "speaker_embedding values must be finite", param="speaker_embedding")
    return [float(v) for v in value]


def builtin_voices(service: SpeechService) -> dict[str, list[str]]:
    return {m.name: list(m.voices or ("default",)) for m in service.models.values()}


async def upload_voice(service: SpeechService, *, name: str, consent: str, audio: bytes | None,
                       filename: str | None, content_type: str | None,
                       speaker_embedding: str | None, ref_text: str | None,
                       speaker_description: str | None, model: str | None) -> dict[str, Any]:
    try:
        name = check_name(name)
    except VoiceError as exc:
        raise SpeechError(exc.status, str(exc), param=exc.param) from None
    consent = check_text_field(consent, "consent", MAX_CONSENT_CHARS, required=True)
    ref_text = check_text_field(ref_text, "ref_text", MAX_REF_TEXT_CHARS)
    description = check_text_field(speaker_description, "speaker_description", MAX_DESCRIPTION_CHARS)
    if (audio is None) == (speaker_embedding is None):
        raise SpeechError(400, "send audio_sample (a recording) or speaker_embedding (a JSON list), "
                          "one of the two", param="audio_sample")
    for served, voices in builtin_voices(service).items():
        if any(v.casefold() == name.casefold() for v in voices):
            raise SpeechError(409, f"name {name!r} is a built-in voice of {served}; choose another",
                              param="name")
    try:
        service.voices.check_new(name)
    except VoiceError as exc:
        raise SpeechError(exc.status, str(exc), param=exc.param) from None

    voice = StoredVoice(name=name, consent=consent, created=int(time.time()), ref_text=ref_text,
                        speaker_description=description)
    extension = "bin"
    if audio is not None:
        check_upload_size(audio)
        extension = audio_extension(content_type, filename)
        voice.duration = await asyncio.to_thread(check_recording, audio)
        voice.mime_type, voice.file_size = (content_type or f"audio/{extension}"), len(audio)
    else:
        voice.speaker_embedding, voice.source = parse_embedding(speaker_embedding), "embedding"

    targets = [service.resolve_model(model)] if model else [
        m for m in service.models.values() if m.family.voice_encoder is not None]
    if not targets or any(m.family.voice_encoder is None for m in targets):
        cloning = [m.name for m in service.models.values() if m.family.voice_encoder]
        message = (f"{model} does not clone voices" if model else
                   f"no served model clones voices (served: {', '.join(service.models)})")
        raise SpeechError(400, message + (f"; models that do: {', '.join(cloning)}" if cloning else ""),
                          param="model" if model else None)
    # Each model's request: the recording in its family's mode (a model whose family needs a
    # transcript the upload lacks fails here, without asking Triton), or the embedding.
    requests: dict[str, tuple[str, dict[str, Any]]] = {}
    failures: list[tuple[Any, SpeechError]] = []
    for m in targets:
        if audio is None:
            requests[m.name] = (EMBEDDING_MODE, service.reference_params(voice, m.family))
            continue
        try:
            mode, params = recording_params(m.family, audio, ref_text)
        except SpeechError as exc:
            failures.append((m, SpeechError(exc.status, f"{m.name}: {exc.message}", param=exc.param)))
            continue
        requests[m.name] = (mode.name, params)
    asked = [m for m in targets if m.name in requests]
    results = await asyncio.gather(*(service.encode_voice(m, requests[m.name][1]) for m in asked),
                                   return_exceptions=True)
    features = {m.name: r for m, r in zip(asked, results) if isinstance(r, bytes)}
    failures += [(m, r) for m, r in zip(asked, results) if not isinstance(r, bytes)]
    for _, error in failures:
        if not isinstance(error, SpeechError):
            raise error
    if not features:
        worst = max((e for _, e in failures), key=lambda e: e.status)
        message = "; ".join(e.message for _, e in failures)
        params = {e.param for _, e in failures}
        raise SpeechError(worst.status, f"no served model can use this voice: {message}", worst.type,
                          param=params.pop() if len(params) == 1 else None, headers=worst.headers)
    voice.modes = {model: requests[model][0] for model in features}
    try:
        stored = service.voices.add(voice, audio, extension, features)
    except VoiceError as exc:   # another upload of the same name won the race
        raise SpeechError(exc.status, str(exc), param=exc.param) from None
    info = stored.info(family_names(service))
    info["unusable_by"] = {m.name: e.message for m, e in failures}
    return {"success": True, "voice": info}


def family_names(service: SpeechService) -> dict[str, str]:
    return {m.name: m.family.name for m in service.models.values()}


def list_voices(service: SpeechService) -> dict[str, Any]:
    """vLLM-Omni's shape (voices: names, uploaded_voices: details) plus `data`: every voice
    with its family and kind."""
    data = []
    for served in service.models.values():
        for voice in served.voices or ("default",):
            data.append({"name": voice, "model": served.name, "family": served.family.name,
                         "kind": "builtin", "created": 0})
    names = family_names(service)
    uploaded = [v.info(names) for v in service.voices.list()]
    for info in uploaded:
        for model in info["models"]:
            data.append({"name": info["name"], "model": model, "family": names.get(model),
                         "kind": info["kind"], "created": info["created"]})
    return {"object": "list", "voices": sorted({d["name"] for d in data}),
            "uploaded_voices": uploaded, "data": data}


def delete_voice(service: SpeechService, name: str) -> dict[str, Any]:
    try:
        voice = service.voices.delete(name)
    except VoiceError as exc:
        raise SpeechError(exc.status, str(exc), param=exc.param) from None
    return {"success": True, "name": voice.name, "deleted": True}

