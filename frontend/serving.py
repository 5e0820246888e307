"""Serving logic of speech requests, in parts that every endpoint (HTTP body, raw stream,
SSE, and later WebSocket or batch) shares:

  SpeechService.prepare(req)  -> Prepared | SpeechError   every check made without Triton
  Admission.slot()            how many syntheses run at once; one more is Overloaded (429)
  Synthesis                   async iterator of AudioChunk that holds a slot while it runs
  SpeechService.speech(req)   POST /v1/audio/speech: the three above, encoded for HTTP

Failures reach the client as SpeechError (status, OpenAI error body, headers) whatever the
transport; `speech_error` says how a failure of the synthesis reads.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from pathlib import Path

from fastapi.responses import JSONResponse, Response, StreamingResponse

from tritontts.families import family_of
from tritontts.family import Family, Form, VoiceMode
from tritontts.deploy.repository import served_model_stage
from tritontts.protocol import WORD_TIMESTAMPS, InvalidRequest, asks_nothing, check_text, words_request
from tritontts.voice import VOICE_FEATURES

from . import metrics
from .encoding import AudioEncoder
from .media import MediaError, MediaPolicy, resolve_audio
from .protocol import FAMILY_FIELDS, SpeechRequest, error_body
from .triton_client import (AudioChunk, SpeechClient, StageRejected, StageStalled, TritonBusy,
                           TritonUnavailable)
from .voices import StoredVoice, VoiceError, VoiceStore

logger = logging.getLogger("tritontts.frontend")

# OpenAI model names map to the first served family, so SDK code written for OpenAI just works.
OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class SpeechError(Exception):
    """A failed request as the client sees it. An exception so that it can be raised from
    deep inside (admission), and a value so that prepare() can hand it back."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return SpeechError(status, message, type_, param, headers).response()


class Overloaded(SpeechError):
    def __init__(self, in_flight: int, model: str | None = None):
        where = f"{model} has" if model else "the server has"
        super().__init__(429, f"server busy: {where} {in_flight} requests in flight, its limit; retry",
                         "rate_limit_error", headers={"Retry-After": "1"})


def speech_error(exc: BaseException, request_id: str) -> SpeechError:
    """How a failure of the synthesis reads to the client. CancelledError and other
    non-Exceptions are re-raised: the client is gone and nobody waits for an answer."""
    if isinstance(exc, SpeechError):
        return exc
    if isinstance(exc, StageRejected):
        return SpeechError(400, str(exc))
    if isinstance(exc, TritonBusy):
        return SpeechError(429, f"server busy: a stage's queue is full; retry ({exc})",
                           "rate_limit_error", headers={"Retry-After": "1"})
    if isinstance(exc, StageStalled):
        logger.error("request %s: %s", request_id, exc)
        return SpeechError(503, str(exc), "server_error", headers={"Retry-After": "5"})
    if isinstance(exc, TritonUnavailable):
        logger.warning("request %s: Triton unavailable: %s", request_id, exc)
        return SpeechError(503, f"the inference server is unavailable: {exc}", "server_error",
                           headers={"Retry-After": "5"})
    if isinstance(exc, Exception):  # StageFailed and anything unexpected
        logger.error("request %s failed: %s", request_id, exc)
        return SpeechError(500, f"synthesis failed: {exc}", "server_error")
    raise exc


class Admission:
    """At most `limit` syntheses at once, and at most `per_model[m]` of model m (a talker
    family's bound sits below the server's: its engine runs a few sequences at a time);
    the next one is refused at once rather than queued, since a queue in front of a
    saturated pipeline only turns load into timeouts."""

    def __init__(self, limit: int, per_model: dict[str, int] | None = None):
        self.limit = limit
        self.per_model = dict(per_model or {})
        self.in_flight = 0
        self.model_in_flight: dict[str, int] = {}

    @asynccontextmanager
    async def slot(self, model: str | None = None) -> AsyncIterator[None]:
        # No await between the checks and the increments: the event loop cannot admit two
        # requests into the last slot.
        if self.in_flight >= self.limit:
            raise Overloaded(self.in_flight)
        mine = self.model_in_flight.get(model, 0)
        if model in self.per_model and mine >= self.per_model[model]:
            raise Overloaded(mine, model)
        self.in_flight += 1
        self.model_in_flight[model] = mine + 1
        metrics.IN_FLIGHT.inc()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.model_in_flight[model] -= 1
            metrics.IN_FLIGHT.dec()


# The sample rate of an audio response's body (raw pcm carries none itself): what a player of
# the stream needs before the first byte.
SAMPLE_RATE_HEADER = "X-Sample-Rate"

@dataclass(frozen=True)
class Prepared:
    """A request that passed every check the front can make before Triton is asked."""
    model: str          # the served model (the ensemble): a family, or another checkpoint of it
    family: Family
    text: str
    voice: str
    params: dict[str, Any]
    received: float  # time.perf_counter() at arrival: time to first audio counts from here
    response_format: str = "wav"
    sample_rate: int | None = None      # resample to this rate (None: the family's own)
    speed: float = 1.0                  # the front's time-stretch (a family without duration control)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    word_timestamps: bool = False       # the chunks carry their words (a --word-aligner server)

    def delivered_words(self, chunk: AudioChunk) -> list[dict]:
        """A chunk's words in the delivered audio's timeline (the front's time-stretch applied)."""
        if not chunk.words:
            return []
        if self.speed == 1.0:
            return list(chunk.words)
        return [{"word": w["word"], "start_ms": int(round(w["start_ms"] / self.speed)),
                 "end_ms": int(round(w["end_ms"] / self.speed))} for w in chunk.words]


@dataclass(frozen=True)
class ServedModel:
    """A model the front serves: its family, and what the launcher knows of its checkpoint."""
    name: str
    family: Family
    checkpoint: Path | None = None
    voices: tuple[str, ...] | None = None   # built-in voices (None: unknown, the stage decides)
    form: Form = field(default_factory=Form)  # what its checkpoint's requests need (Family.form)


def served_models(names: list[str], checkpoints: dict[str, Path | None] | None = None
                  ) -> dict[str, ServedModel]:
    """ServedModel per name; built-in voices read from the checkpoints the launcher knows."""
    models = {}
    for name in names:
        family = family_of(name)
        if family is None:
            raise ValueError(f"{name!r} is no family's model")
        path = (checkpoints or {}).get(name)
        voices, form = None, Form()
        try:
            if path is not None or not family.checkpoint_required:
                voices = tuple(family.voices(path))
            form = family.form(path)            # a family's own, or its checkpoint's
        except Exception as exc:   # noqa: BLE001 - the stages report a bad checkpoint
            logger.warning("voices or form of %s unknown: %s", name, exc)
        models[name] = ServedModel(name, family, path, voices, form)
    return models


class Synthesis:
    """The audio chunks of one prepared request, in order, up to the final one.

    The first __anext__ takes an admission slot (raising Overloaded past the limit) and
    then asks Triton; the slot is freed when the chunks run out, when they fail, or on
    aclose(), which also cancels the Triton stream. Whoever stops reading early must call
    aclose(): a suspended iterator would hold its slot until garbage collection.
    """

    def __init__(self, client: SpeechClient, admission: Admission, prepared: Prepared):
        self.prepared = prepared
        self.samples = 0
        self.sample_rate: int | None = None
        self._chunks = self._run(client, admission)

    @property
    def audio_seconds(self) -> float:
        return self.samples / self.sample_rate if self.sample_rate else 0.0

    def __aiter__(self) -> "Synthesis":
        return self

    async def __anext__(self) -> AudioChunk:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        await self._chunks.aclose()

    async def _run(self, client: SpeechClient, admission: Admission) -> AsyncIterator[AudioChunk]:
        p = self.prepared
        model = p.model
        async with admission.slot(model):
            chunks = client.synthesize(model, p.text, p.voice, p.params, p.request_id)
            try:
                async for chunk in chunks:
                    if self.sample_rate is None:
                        metrics.TIME_TO_FIRST_AUDIO.labels(model).observe(
                            time.perf_counter() - p.received)
                        self.sample_rate = chunk.sample_rate
                    self.samples += chunk.audio.size
                    yield chunk
                    if chunk.final:
                        break
            finally:
                await chunks.aclose()
                metrics.AUDIO_SECONDS.labels(model).inc(self.audio_seconds)


class SpeechService:
    """The serving logic behind every endpoint: which model, which voice, which parameters
    (prepare), how many at once (admission), the stored voices (voices), and the speech
    endpoint's own HTTP encoding (speech)."""

    def __init__(self, client: SpeechClient, models: dict[str, ServedModel], max_in_flight: int = 64,
                 voices: VoiceStore | None = None, media: MediaPolicy | None = None,
                 max_in_flight_per_model: dict[str, int] | None = None,
                 served_names: dict[str, str] | None = None,
                 word_languages: tuple[str, ...] | None = None):
        self.client = client
        self.word_languages = word_languages    # the word aligner's (None: none configured)
        self.models = models
        self.served_names = dict(served_names or {})     # --served-model-name: NAME -> model
        self.families = list(models)          # the served model names, in launch order
        self.admission = Admission(max_in_flight, max_in_flight_per_model)
        self.voices = voices or VoiceStore(None)
        self.media = media or MediaPolicy()

    # --- which model ---------------------------------------------------------------------

    def resolve_model(self, name: str | None) -> ServedModel:
        if name is None or name == "":
            if len(self.models) == 1:
                return next(iter(self.models.values()))
            raise SpeechError(400, f"model is required: this server serves {', '.join(self.models)}",
                              param="model")
        if name in self.models:
            return self.models[name]
        if name in self.served_names:
            return self.models[self.served_names[name]]
        for model in self.models.values():      # vLLM's model name: the path it was started with
            if model.checkpoint is not None and _same_path(name, model.checkpoint):
                return model
        if name in OPENAI_MODEL_ALIASES:
            return next(iter(self.models.values()))
        for model in self._released(name):
            return model
        raise SpeechError(404, f"model {name!r} does not exist; served models: "
                          f"{', '.join(self.families + list(OPENAI_MODEL_ALIASES))}", param="model")

    def names_of(self, model: str) -> list[str]:
        """The --served-model-name names of a served model."""
        return [name for name, target in self.served_names.items() if target == model]

    def _released(self, name: str):
        """Served models a released checkpoint name means: the one whose checkpoint folder
        has that name, else the family's own model."""
        tail = name.rsplit("/", 1)[-1].casefold()
        families = [m.family for m in self.models.values()
                    if any(n.casefold() in (name.casefold(), tail) or n.rsplit("/", 1)[-1].casefold() == tail
                           for n in m.family.released_names)]
        for family in families:
            same_folder = [m for m in self.models.values() if m.family is family
                           and m.checkpoint is not None and m.checkpoint.name.casefold() == tail]
            yield from same_folder or [m for m in self.models.values() if m.name == family.name][:1]

    async def ready_families(self) -> list[str]:
        ready = await asyncio.gather(*(self.client.model_ready(f) for f in self.families))
        return [f for f, ok in zip(self.families, ready) if ok]

    # --- a request, checked ----------------------------------------------------------------

    async def prepare(self, req: SpeechRequest) -> Prepared:
        """Every check the front can make before Triton is asked; raises SpeechError."""
        received = time.perf_counter()
        served = self.resolve_model(req.model)
        family = served.family
        limit = family.capabilities.max_instructions_chars
        if req.instructions is not None and len(req.instructions) > limit:
            raise SpeechError(400, f"instructions are {len(req.instructions)} characters; {served.name} takes at "
                              f"most {limit}", param="instructions")
        try:
            params = req.family_params()
        except ValueError as exc:
            raise SpeechError(400, str(exc), param="extra_params") from None
        # Word timestamps are the word_aligner stage's, not the family's: taken out before
        # the family's fields are checked, checked here, sent on for the first stage's host.
        asked = params.pop(WORD_TIMESTAMPS, None)       # sent as an extra field
        asked = req.word_timestamps if req.word_timestamps is not None else asked
        try:
            word_timestamps = bool(words_request(req.input, {WORD_TIMESTAMPS: asked,
                                                             "language": params.get("language")},
                                                 self.word_languages))
        except InvalidRequest as exc:
            raise SpeechError(400, str(exc), param=WORD_TIMESTAMPS) from None
        fields = family.fields
        for name in params:
            if name in FAMILY_FIELDS and name in fields.refuses and not asks_nothing(name, params[name]):
                raise SpeechError(400, f"{name} is not supported by {served.name}: {fields.refuses[name]}",
                                  param=name)
            if name in FAMILY_FIELDS and name not in fields.known:
                raise SpeechError(400, f"{name} is not supported by {served.name} ({family.description}); "
                                  f"it takes: {', '.join(sorted(set(fields.takes) - {VOICE_FEATURES})) or 'none'}",
                                  param=name)
        # The text after the fields: an instruction-only request to a family without
        # instructions is told about instructions, not that its input is empty.
        instruction_only = family.capabilities.instruction_only and bool((req.instructions or "").strip())
        try:
            if not (instruction_only and not req.input.strip()):
                check_text(req.input)
        except InvalidRequest as exc:
            raise SpeechError(400, str(exc), param="input") from None
        if VOICE_FEATURES in params:
            raise SpeechError(400, "voice_features are sent by the front for an uploaded voice; "
                              "name the voice in `voice` instead", param=VOICE_FEATURES)
        if params.get("ref_audio") is not None:
            try:
                audio = await resolve_audio(params["ref_audio"], self.media)
            except MediaError as exc:
                raise SpeechError(400, str(exc), param=exc.field) from None
            params["ref_audio"] = base64.b64encode(audio).decode()
        voice = await self.voice_for(served, req.voice or "default", params)
        try:
            speed = 1.0 if req.speed is None else req.speed
            params = family.request_params(speed, params)
        except InvalidRequest as exc:
            raise SpeechError(400, str(exc), param=_named_field(str(exc), params)) from None
        if word_timestamps:
            params[WORD_TIMESTAMPS] = True
        return Prepared(served.name, family, req.input, voice, params, received,
                        req.response_format or "wav", req.sample_rate,
                        speed=1.0 if family.capabilities.native_speed else speed,
                        word_timestamps=word_timestamps)

    async def voice_for(self, served: ServedModel, voice: str, params: dict[str, Any]) -> str:
        """The voice the stages get: an uploaded voice as `default` with its stored features
        in params; any other name as it is (built-in voices win over uploaded ones)."""
        if any(voice.casefold() == v.casefold() for v in served.voices or ("default",)):
            return voice
        stored = self.voices.get(voice)
        if stored is None:
            return voice        # the family's stage says which voices it has, and how to clone
        for name in ("ref_audio", "ref_text", "speaker_embedding"):
            if params.get(name) is not None:
                raise SpeechError(400, f"voice {stored.name!r} is an uploaded voice: it replaces "
                                  f"{name}; send one or the other", param=name)
        blob = await self.voice_features(stored, served)
        params[VOICE_FEATURES] = base64.b64encode(blob).decode()
        return "default"

    async def voice_features(self, stored: StoredVoice, served: ServedModel) -> bytes:
        """A stored voice's features for a model: kept from the upload, or computed now
        from the kept recording (a model served after the upload) and kept."""
        blob = self.voices.features(stored, served.name)
        if blob is not None:
            return blob
        family = served.family
        if family.voice_encoder is None:
            raise SpeechError(400, f"{served.name} cannot speak uploaded voices (it does not clone "
                              f"voices); voice {stored.name!r} is for {', '.join(stored.models) or 'none'}",
                              param="voice")
        blob = await self.encode_voice(served, self.reference_params(stored, family))
        self.voices.add_features(stored, served.name, blob)
        return blob

    def reference_params(self, stored: StoredVoice, family: Family) -> dict[str, Any]:
        """The voice encoder's request for a stored voice's features on a model of `family`
        (computed after the upload): its embedding, or its recording in the mode a model
        of the same family stored it in, else the mode its transcript selects."""
        if stored.speaker_embedding is not None:
            return embedding_params(stored.speaker_embedding)
        try:
            reference = self.voices.reference(stored)
        except VoiceError as exc:       # deleted by another front since it was looked up
            raise SpeechError(exc.status, str(exc), param=exc.param) from None
        if reference is None:
            raise SpeechError(400, f"voice {stored.name!r} holds neither a recording nor a speaker "
                              "embedding", param="voice")
        same_family = [mode for model, mode in sorted(stored.modes.items()) if family_of(model) is family
                       and any(m.name == mode for m in family.voice_modes)]
        return recording_params(family, reference, stored.ref_text, same_family[0] if same_family else None)[1]

    async def encode_voice(self, served: ServedModel, params: dict[str, Any]) -> bytes:
        """The model's voice encoder stage on a reference (held in an admission slot: it
        is real work)."""
        family = served.family
        stage = served_model_stage(served.name, family, family.voice_encoder)
        async with self.admission.slot(served.name):
            try:
                return await self.client.encode_voice(stage, params)
            except StageRejected as exc:
                raise SpeechError(400, f"{served.name}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - reads as speech errors do
                raise speech_error(exc, "voice-upload") from None

    def synthesis(self, prepared: Prepared) -> Synthesis:
        return Synthesis(self.client, self.admission, prepared)

    # --- POST /v1/audio/speech -----------------------------------------------------------

    async def speech(self, req: SpeechRequest) -> Response:
        try:
            prepared = await self.prepare(req)
        except SpeechError as exc:
            model = req.model if req.model in self.models else "unknown"
            return _counted(model, exc.response())
        model = prepared.model
        synthesis = self.synthesis(prepared)
        # Headers wait for the first chunk: until then every failure is still a clean
        # status code (400, 429, 503) instead of a stream cut short.
        try:
            first = await anext(synthesis)
            encoder = AudioEncoder(prepared.response_format, first.sample_rate, req.streaming,
                                   prepared.sample_rate, prepared.speed)
        except BaseException as exc:
            await synthesis.aclose()
            return _counted(model, speech_error(exc, prepared.request_id).response())
        if req.streaming:
            return AudioStreamResponse(synthesis, first, encoder, sse=req.sse)
        words: list[dict] = []
        try:
            body = await encoded_body(first, synthesis, encoder, words)
        except BaseException as exc:
            return _counted(model, speech_error(exc, prepared.request_id).response())
        finally:
            await synthesis.aclose()
        headers = {SAMPLE_RATE_HEADER: str(encoder.sample_rate)}
        if prepared.word_timestamps:
            headers.update(word_timestamp_headers(words))
        return _counted(model, Response(body, media_type=encoder.content_type, headers=headers))

    async def whole(self, prepared: Prepared) -> tuple[bytes, AudioEncoder, Synthesis, list[dict] | None]:
        """A prepared request synthesized and encoded whole (batch items), with its words
        when it asked for word timestamps."""
        synthesis = self.synthesis(prepared)
        words: list[dict] = []
        try:
            first = await anext(synthesis)
            encoder = AudioEncoder(prepared.response_format, first.sample_rate, False,
                                   prepared.sample_rate, prepared.speed)
            body = await encoded_body(first, synthesis, encoder, words)
            return body, encoder, synthesis, words if prepared.word_timestamps else None
        finally:
            await synthesis.aclose()


def recording_params(family: Family, audio: bytes, ref_text: str | None,
                     mode: str | None = None) -> tuple[VoiceMode, dict[str, Any]]:
    """The mode (Family.voice_mode: `mode`, else the first that fits whether there is a
    transcript) and the voice encoder's request for a recording: what an upload sends each
    cloning model, and what tritontts-voice precompute hands the stage in-process, so the
    two compute the same features. A mode that does not fit is a 400 saying why."""
    try:
        chosen = family.voice_mode(bool(ref_text), mode)
    except ValueError as exc:
        raise SpeechError(400, str(exc), param="mode" if mode else "ref_text") from None
    params: dict[str, Any] = {"ref_audio": base64.b64encode(audio).decode()}
    if ref_text:
        params["ref_text"] = ref_text
    params.update(chosen.params)
    return chosen, params


def embedding_params(embedding: list[float]) -> dict[str, Any]:
    """The voice encoder's request for a voice stored from a speaker embedding."""
    return {"speaker_embedding": list(embedding)}


def _same_path(name: str, checkpoint: Path) -> bool:
    """Whether a request's `model` is this checkpoint's path: as the launcher was given it,
    or the same folder (relative to the front's working directory, or absolute)."""
    if name.rstrip("/") == str(checkpoint).rstrip("/"):
        return True
    if "/" not in name and not name.startswith("."):
        return False            # a bare name is a model name, never a folder in the cwd
    try:
        return Path(name).expanduser().resolve() == checkpoint.expanduser().resolve()
    except OSError:
        return False


def _named_field(message: str, params: dict[str, Any]) -> str | None:
    """The request field a family parser's message is about (its messages start with it)."""
    first = message.split(" ", 1)[0].strip("'\"")
    return first if first in params or first in FAMILY_FIELDS else None


# Word timestamps of a whole response travel in a header, as vLLM-Omni sends them: a JSON
# list of {word, start_ms, end_ms} (ASCII: non-ASCII as \\uXXXX), or, past this many bytes,
# a header saying they were left out (the SSE stream and the batch endpoint carry any size).
WORD_TIMESTAMPS_HEADER = "X-Word-Timestamps"
WORD_TIMESTAMPS_OMITTED_HEADER = "X-Word-Timestamps-Omitted"
WORD_TIMESTAMPS_HEADER_LIMIT = 4096


def word_timestamp_headers(words: list[dict]) -> dict[str, str]:
    value = json.dumps(words)
    if len(value) > WORD_TIMESTAMPS_HEADER_LIMIT:
        return {WORD_TIMESTAMPS_OMITTED_HEADER:
                f"oversize; bytes={len(value)}; limit={WORD_TIMESTAMPS_HEADER_LIMIT}"}
    return {WORD_TIMESTAMPS_HEADER: value}


async def encoded_body(first: AudioChunk, rest: Synthesis, encoder: AudioEncoder,
                       words: list[dict] | None = None) -> bytes:
    """The whole encoded audio; `words` (if given) gets every chunk's words."""
    async with aclosing(_encoded(first, rest, encoder, words)) as parts:
        return b"".join([part async for part in parts])


def _counted(model: str, response: Response) -> Response:
    metrics.REQUESTS.labels(model, str(response.status_code)).inc()
    return response


async def _encoded(first: AudioChunk, rest: Synthesis,
                   encoder: AudioEncoder, words: list[dict] | None = None) -> AsyncIterator[bytes]:
    """The encoded audio of a synthesis whose first chunk was already read; no empty parts.
    `words` (if given) gets each chunk's words, in the delivered timeline, before the chunk's
    audio is yielded."""
    async def chunks():
        yield first
        async for chunk in rest:
            yield chunk

    async for chunk in chunks():
        if words is not None and chunk.words:
            words += rest.prepared.delivered_words(chunk)
        data = encoder.encode(chunk.audio)
        if data:
            yield data
    tail = encoder.finish()
    if tail:
        yield tail


def sse_event(event: dict) -> bytes:
    """One SSE event; the `event:` line carries the type as vLLM-Omni's does (OpenAI's SDK
    reads the data line)."""
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


class AudioStreamResponse(StreamingResponse):
    """A synthesis streamed as raw audio bytes or as SSE events.

    However the response ends (all audio sent, synthesis failed mid-stream, or the client
    gone before or while the body is sent), __call__'s finally closes the synthesis, which
    frees its admission slot and cancels the Triton stream, and counts the request once.
    A BackgroundTask would not do: Starlette skips it when the client vanishes on an
    ASGI 2.4 server, and the body generator's own finally never runs if it never started.
    """

    def __init__(self, synthesis: Synthesis, first: AudioChunk, encoder: AudioEncoder, sse: bool):
        self.synthesis, self.sse = synthesis, sse
        # Word timestamps ride the SSE events: each delta carries the words placed since the
        # last one ("timestamps", vLLM-Omni's WebSocket name), the done event any left.
        self.words: list[dict] | None = [] if sse and synthesis.prepared.word_timestamps else None
        self.words_sent = 0
        self.response_format = encoder.format
        self.outcome = "499"  # until the body ends otherwise: the client went away
        headers = {SAMPLE_RATE_HEADER: str(encoder.sample_rate)}
        if sse:
            headers["Cache-Control"] = "no-cache"
        super().__init__(self._body(first, encoder),
                         media_type="text/event-stream" if sse else encoder.content_type, headers=headers)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            await self.synthesis.aclose()
            metrics.REQUESTS.labels(self.synthesis.prepared.model, self.outcome).inc()

    def _new_words(self) -> dict:
        if self.words is None:
            return {}
        new, self.words_sent = self.words[self.words_sent:], len(self.words)
        return {"timestamps": new}

    def _frame(self, data: bytes) -> bytes:
        if not self.sse:
            return data
        return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode(),
                          "response_format": self.response_format, **self._new_words()})

    async def _body(self, first: AudioChunk, encoder: AudioEncoder) -> AsyncIterator[bytes]:
        try:
            async with aclosing(_encoded(first, self.synthesis, encoder, self.words)) as parts:
                async for data in parts:
                    yield self._frame(data)
            if self.sse:
                yield sse_event({"type": "speech.audio.done",
                                 "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                                           "audio_seconds": round(encoder.seconds, 3)},
                                 **self._new_words()})
            self.outcome = "200"
        except Exception as exc:
            # Headers are sent: say so in-band for SSE, cut the body for raw audio.
            self.outcome = "500"
            logger.error("request %s failed mid-stream: %s",
                         self.synthesis.prepared.request_id, exc)
            if not self.sse:
                raise
            error = error_body(str(exc), "server_error", code="500")["error"]
            if self.synthesis.samples:
                error.update(partial_audio=True, action="discard")
            yield sse_event({"type": "speech.audio.error", "error": error})
