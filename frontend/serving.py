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

from fastapi.responses import JSONResponse, Response, StreamingResponse

from tritontts.families import family_of
from tritontts.family import Family
from tritontts.stage import InvalidRequest, check_text

from . import metrics
from .encoding import AudioEncoder
from .protocol import SpeechRequest, error_body
from .triton_client import AudioChunk, SpeechClient, StageRejected, TritonUnavailable

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
    def __init__(self, in_flight: int):
        super().__init__(429, f"server busy: {in_flight} requests in flight; retry",
                         "rate_limit_error", headers={"Retry-After": "1"})


def speech_error(exc: BaseException, request_id: str) -> SpeechError:
    """How a failure of the synthesis reads to the client. CancelledError and other
    non-Exceptions are re-raised: the client is gone and nobody waits for an answer."""
    if isinstance(exc, SpeechError):
        return exc
    if isinstance(exc, StageRejected):
        return SpeechError(400, str(exc))
    if isinstance(exc, TritonUnavailable):
        logger.warning("request %s: Triton unavailable: %s", request_id, exc)
        return SpeechError(503, f"the inference server is unavailable: {exc}", "server_error",
                           headers={"Retry-After": "5"})
    if isinstance(exc, Exception):  # StageFailed and anything unexpected
        logger.error("request %s failed: %s", request_id, exc)
        return SpeechError(500, f"synthesis failed: {exc}", "server_error")
    raise exc


class Admission:
    """At most `limit` syntheses at once; the next one is refused at once rather than queued,
    since a queue in front of a saturated pipeline only turns load into timeouts."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_flight = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        # No await between the check and the increment: the event loop cannot admit two
        # requests into the last slot.
        if self.in_flight >= self.limit:
            raise Overloaded(self.in_flight)
        self.in_flight += 1
        metrics.IN_FLIGHT.inc()
        try:
            yield
        finally:
            self.in_flight -= 1
            metrics.IN_FLIGHT.dec()


@dataclass(frozen=True)
class Prepared:
    """A request that passed every check the front can make before Triton is asked."""
    model: str          # the served model (the ensemble): a family, or another checkpoint of it
    family: Family
    text: str
    voice: str
    params: dict[str, Any]
    received: float  # time.perf_counter() at arrival: time to first audio counts from here
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


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
        async with admission.slot():
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


@dataclass
class SpeechService:
    client: SpeechClient
    families: list[str]                 # the families this front serves
    max_in_flight: int = 64             # above this: 429, never an unbounded queue
    admission: Admission = field(init=False)

    def __post_init__(self):
        self.admission = Admission(self.max_in_flight)

    def resolve_family(self, model: str) -> str | None:
        if model in OPENAI_MODEL_ALIASES:
            return self.families[0]
        return model if model in self.families else None

    async def ready_families(self) -> list[str]:
        ready = await asyncio.gather(*(self.client.model_ready(f) for f in self.families))
        return [f for f, ok in zip(self.families, ready) if ok]

    def prepare(self, req: SpeechRequest) -> Prepared | SpeechError:
        received = time.perf_counter()
        name = self.resolve_family(req.model)
        if name is None:
            return SpeechError(404, f"model {req.model!r} does not exist; served models: "
                               f"{', '.join(self.families + list(OPENAI_MODEL_ALIASES))}",
                               param="model")
        family = family_of(name)
        try:
            check_text(req.input)
        except InvalidRequest as exc:
            return SpeechError(400, str(exc), param="input")
        extra = req.extra_params()
        # OpenAI SDKs send instructions freely; a family without style control ignores
        # them rather than failing the request.
        if req.instructions is not None and family.capabilities.instructions:
            extra["instructions"] = req.instructions
        try:
            params = family.request_params(req.speed, extra)
        except InvalidRequest as exc:
            return SpeechError(400, str(exc))
        return Prepared(name, family, req.input, req.voice, params, received)

    def synthesis(self, prepared: Prepared) -> Synthesis:
        return Synthesis(self.client, self.admission, prepared)

    async def speech(self, req: SpeechRequest) -> Response:
        prepared = self.prepare(req)
        if isinstance(prepared, SpeechError):
            return _counted(self.resolve_family(req.model) or "unknown", prepared.response())
        model = prepared.model
        synthesis = self.synthesis(prepared)
        streaming = req.stream or req.stream_format == "sse"
        # Headers wait for the first chunk: until then every failure is still a clean
        # status code (400, 429, 503) instead of a stream cut short.
        try:
            first = await anext(synthesis)
            encoder = AudioEncoder(req.response_format, first.sample_rate, streaming)
        except BaseException as exc:
            await synthesis.aclose()
            return _counted(model, speech_error(exc, prepared.request_id).response())
        if streaming:
            return AudioStreamResponse(synthesis, first, encoder, sse=req.stream_format == "sse")
        try:
            async with aclosing(_encoded(first, synthesis, encoder)) as parts:
                body = b"".join([part async for part in parts])
        except BaseException as exc:
            return _counted(model, speech_error(exc, prepared.request_id).response())
        finally:
            await synthesis.aclose()
        return _counted(model, Response(body, media_type=encoder.content_type))


def _counted(model: str, response: Response) -> Response:
    metrics.REQUESTS.labels(model, str(response.status_code)).inc()
    return response


async def _encoded(first: AudioChunk, rest: AsyncIterator[AudioChunk],
                   encoder: AudioEncoder) -> AsyncIterator[bytes]:
    """The encoded audio of a synthesis whose first chunk was already read; no empty parts."""
    data = encoder.encode(first.audio)
    if data:
        yield data
    async for chunk in rest:
        data = encoder.encode(chunk.audio)
        if data:
            yield data
    tail = encoder.finish()
    if tail:
        yield tail


def sse_event(event: dict) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


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
        self.outcome = "499"  # until the body ends otherwise: the client went away
        super().__init__(self._body(first, encoder),
                         media_type="text/event-stream" if sse else encoder.content_type,
                         headers={"Cache-Control": "no-cache"} if sse else None)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            await self.synthesis.aclose()
            metrics.REQUESTS.labels(self.synthesis.prepared.model, self.outcome).inc()

    def _frame(self, data: bytes) -> bytes:
        if not self.sse:
            return data
        return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

    async def _body(self, first: AudioChunk, encoder: AudioEncoder) -> AsyncIterator[bytes]:
        try:
            async with aclosing(_encoded(first, self.synthesis, encoder)) as parts:
                async for data in parts:
                    yield self._frame(data)
            if self.sse:
                yield sse_event({"type": "speech.audio.done",
                                 "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                                           "audio_seconds": round(self.synthesis.audio_seconds, 3)}})
            self.outcome = "200"
        except Exception as exc:
            # Headers are sent: say so in-band for SSE, cut the body for raw audio.
            self.outcome = "500"
            logger.error("request %s failed mid-stream: %s",
                         self.synthesis.prepared.request_id, exc)
            if not self.sse:
                raise
            yield sse_event({"type": "error", **error_body(str(exc), "server_error")})
