"""Serving logic of POST /v1/audio/speech: validate, admit, stream from Triton, encode."""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from tritontts.stage import InvalidRequest, check_text

from . import metrics
from .encoding import AudioEncoder
from .families import FAMILIES
from .protocol import SpeechRequest, error_body
from .triton_client import StageRejected, TritonSpeechClient, TritonUnavailable

logger = logging.getLogger("tritontts.frontend")

# OpenAI model names map to the default family, so SDK code written for OpenAI just works.
OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param), status_code=status, headers=headers)


@dataclass
class SpeechService:
    client: TritonSpeechClient
    families: list[str]                 # the families this front serves
    max_in_flight: int = 64             # above this: 429, never an unbounded queue
    _in_flight: int = field(default=0, init=False)

    def resolve_family(self, model: str) -> str | None:
        if model in OPENAI_MODEL_ALIASES:
            return self.families[0]
        return model if model in self.families else None

    async def ready_families(self) -> list[str]:
        ready = await asyncio.gather(*(self.client.model_ready(f) for f in self.families))
        return [f for f, ok in zip(self.families, ready) if ok]

    async def speech(self, req: SpeechRequest):
        started = time.perf_counter()
        family = self.resolve_family(req.model)
        label = family or "unknown"
        response = await self._speech(req, family, started)
        if not isinstance(response, StreamingResponse):
            metrics.REQUESTS.labels(label, str(response.status_code)).inc()
        return response

    async def _speech(self, req: SpeechRequest, family: str | None, started: float):
        if family is None:
            return error_response(404, f"model {req.model!r} does not exist; served models: "
                                  f"{', '.join(self.families + list(OPENAI_MODEL_ALIASES))}",
                                  param="model")
        try:
            check_text(req.input)
        except InvalidRequest as exc:
            return error_response(400, str(exc), param="input")
        try:
            params = FAMILIES[family].build_params(req)
        except InvalidRequest as exc:
            return error_response(400, str(exc))
        if self._in_flight >= self.max_in_flight:
            return error_response(429, f"server busy: {self._in_flight} requests in flight; retry",
                                  type_="rate_limit_error", headers={"Retry-After": "1"})

        self._in_flight += 1
        metrics.IN_FLIGHT.inc()
        request_id = uuid.uuid4().hex
        chunks = self.client.synthesize(family, req.input, req.voice, params, request_id)
        try:
            first = await chunks.__anext__()
        except BaseException as exc:
            self._release()
            await chunks.aclose()
            return self._failure(exc, request_id)
        metrics.TIME_TO_FIRST_AUDIO.labels(family).observe(time.perf_counter() - started)

        streaming = req.stream or req.stream_format == "sse"
        encoder = AudioEncoder(req.response_format, first.sample_rate, streaming)
        if not streaming:
            try:
                body = await self._collect(family, first, chunks, encoder)
            except BaseException as exc:
                return self._failure(exc, request_id)
            finally:
                self._release()
                await chunks.aclose()
            return Response(body, media_type=encoder.content_type)

        released = False

        def release_once():
            nonlocal released
            if not released:
                released = True
                self._release()

        body = self._stream(family, first, chunks, encoder, req.stream_format == "sse",
                            request_id, release_once)

        async def cleanup():
            # Runs after the response, also when the client left before the body started
            # (the generator's own finally never runs then): free the slot and the stream.
            await body.aclose()
            await chunks.aclose()
            release_once()

        sse = req.stream_format == "sse"
        return StreamingResponse(body, media_type="text/event-stream" if sse else encoder.content_type,
                                 headers={"Cache-Control": "no-cache"} if sse else None,
                                 background=BackgroundTask(cleanup))

    def _release(self):
        self._in_flight -= 1
        metrics.IN_FLIGHT.dec()

    @staticmethod
    def _failure(exc: BaseException, request_id: str) -> Response:
        if isinstance(exc, StageRejected):
            return error_response(400, str(exc))
        if isinstance(exc, TritonUnavailable):
            logger.warning("request %s: Triton unavailable: %s", request_id, exc)
            return error_response(503, f"the inference server is unavailable: {exc}",
                                  type_="server_error", headers={"Retry-After": "5"})
        if isinstance(exc, Exception):  # StageFailed and anything unexpected
            logger.error("request %s failed: %s", request_id, exc)
            return error_response(500, f"synthesis failed: {exc}", type_="server_error")
        raise exc  # CancelledError and friends

    async def _collect(self, family, first, chunks, encoder) -> bytes:
        parts = [encoder.encode(first.audio)]
        samples = first.audio.size
        async for chunk in chunks:
            parts.append(encoder.encode(chunk.audio))
            samples += chunk.audio.size
        parts.append(encoder.finish())
        metrics.AUDIO_SECONDS.labels(family).inc(samples / first.sample_rate)
        return b"".join(parts)

    async def _stream(self, family, first, chunks, encoder, sse: bool,
                      request_id: str, release) -> AsyncIterator[bytes]:
        samples = 0
        status = "200"

        def frame(data: bytes) -> bytes:
            if not sse:
                return data
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            return f"data: {json.dumps(event)}\n\n".encode()

        try:
            chunk = first
            while True:
                samples += chunk.audio.size
                data = encoder.encode(chunk.audio)
                if data:
                    yield frame(data)
                if chunk.final:
                    break
                chunk = await chunks.__anext__()
            tail = encoder.finish()
            if tail:
                yield frame(tail)
            if sse:
                done = {"type": "speech.audio.done",
                        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                                  "audio_seconds": round(samples / first.sample_rate, 3)}}
                yield f"data: {json.dumps(done)}\n\n".encode()
        except (asyncio.CancelledError, GeneratorExit):
            status = "499"  # the client went away; the Triton stream is cancelled below
            raise
        except Exception as exc:
            # Headers are sent: say so in-band for SSE, cut the body for raw audio.
            status = "500"
            logger.error("request %s failed mid-stream: %s", request_id, exc)
            if sse:
                yield f"data: {json.dumps({'type': 'error', **error_body(str(exc), 'server_error')})}\n\n".encode()
            else:
                raise
        finally:
            metrics.AUDIO_SECONDS.labels(family).inc(samples / first.sample_rate)
            metrics.REQUESTS.labels(family, status).inc()
            release()
            await chunks.aclose()
