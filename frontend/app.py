"""The FastAPI app: the speech API in front of Triton, one handler per endpoint."""
from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, File, Form, Request, UploadFile, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles

from .demo_page import DEMO_PAGE

from . import metrics
from .media import MediaPolicy
from .models_api import describe_models
from .protocol import (BatchItemResult, BatchSpeechRequest, BatchSpeechResponse, ModelCard,
                       ModelList, SpeechRequest)
from .serving import (Overloaded, SpeechError, SpeechService, error_response, served_models,
                      speech_error)
from .triton_client import SpeechClient, TritonSpeechClient
from .triton_pool import TritonPool
from .voice_api import MAX_UPLOAD_BYTES, delete_voice, list_voices, upload_voice
from .voices import VoiceStore
from .websocket import serve_session

logger = logging.getLogger("tritontts.frontend")

# Largest request body: a speech request may carry a 16 MiB reference as base64, a batch
# a few of them; anything larger is refused before it is read.
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_UPLOAD_BODY_BYTES = MAX_UPLOAD_BYTES + 1024 * 1024     # the form fields around the file


class ApiKey:
    """With an API key set, every route but /health and the demo page's static files needs
    `Authorization: Bearer <key>` (a WebSocket may send it as ?api_key=, since browsers
    cannot set its headers; the page asks for the key and sends it on every API call)."""

    OPEN = ("/health",)
    OPEN_PREFIXES = ("/demo/",)

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        if self.key is None or scope["type"] not in ("http", "websocket") or scope["path"] in self.OPEN \
                or scope["path"] == "/demo" or scope["path"].startswith(self.OPEN_PREFIXES):
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        given = header[7:] if header.lower().startswith("bearer ") else ""
        if not given and scope["type"] == "websocket":
            from urllib.parse import parse_qs

            given = (parse_qs(scope.get("query_string", b"").decode()).get("api_key") or [""])[0]
        if hmac.compare_digest(given.encode(), self.key.encode()):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await receive()                                     # websocket.connect
            return await send({"type": "websocket.close", "code": 1008})
        response = error_response(401, "a valid API key is required: send Authorization: Bearer <key>",
                                  "authentication_error", headers={"WWW-Authenticate": "Bearer"})
        return await response(scope, receive, send)


class BodyLimit:
    """Refuses a request body over the limit before reading it (declared length), or as soon
    as it passes it (chunked). Plain ASGI, not BaseHTTPMiddleware: that one would sit between
    a streamed response and a vanished client."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = MAX_UPLOAD_BODY_BYTES if scope["path"] == "/v1/audio/voices" else MAX_BODY_BYTES
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            response = error_response(413, f"request body is {length.decode(errors='replace')} "
                                      f"bytes; the limit is {limit}")
            return await response(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise SpeechError(413, f"request body passed {limit} bytes")
            return message

        return await self.app(scope, counted, send)


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """Pydantic's errors as one message, and the field the first is about (the innermost
    name: speaker_embedding for speaker_embedding.0, input for items.3.input)."""
    def where(e):
        return ".".join(str(p) for p in e["loc"] if p != "body")

    problems = "; ".join(f"{where(e)}: {e['msg']}" if where(e) else
                         f"the body must be a JSON object of the request fields ({e['msg']})"
                         for e in errors)
    names = [p for p in (errors[0]["loc"] if errors else ()) if isinstance(p, str) and p != "body"]
    return problems, (names[-1] if names else None)


def triton_client(url: str | list[str], request_timeout_s: float,
                  stall_timeout_s: float) -> SpeechClient:
    urls = [url] if isinstance(url, str) else list(url)
    if len(urls) == 1 and not urls[0].startswith("dns:"):
        return TritonSpeechClient(urls[0], request_timeout_s, stall_timeout_s)
    return TritonPool(urls, request_timeout_s, stall_timeout_s)


def create_app(triton_url: str | list[str], families: list[str], max_in_flight: int = 64,
               request_timeout_s: float = 600.0, client: SpeechClient | None = None, *,
               checkpoints: dict[str, Path | None] | None = None,
               voices_dir: Path | None = None, preload_voices: list[Path] = (),
               max_voices: int = 1000, media: MediaPolicy | None = None,
               api_key: str | None = None,
               max_in_flight_per_model: dict[str, int] | None = None,
               stall_timeout_s: float = 120.0, served_names: dict[str, str] | None = None,
               word_languages: tuple[str, ...] | None = None) -> FastAPI:
    """`client` replaces the gRPC client to triton_url (the front's unit tests script one).
    Several URLs: a TritonPool over them (least-loaded healthy server, failover)."""
    models = served_models(families, checkpoints)
    store = VoiceStore(voices_dir, max_voices, list(preload_voices))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # The gRPC channel belongs to the server's event loop, so it is opened here.
        speech_client = client or triton_client(triton_url, request_timeout_s, stall_timeout_s)
        app.state.service = SpeechService(speech_client, models, max_in_flight, store, media,
                                          max_in_flight_per_model, served_names, word_languages)
        yield
        await speech_client.close()

    app = FastAPI(title="tritontts", summary="OpenAI audio API on Triton", lifespan=lifespan)

    app.add_middleware(BodyLimit)
    app.add_middleware(ApiKey, key=api_key or None)   # outermost: nothing is read unauthenticated

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError):
        # OpenAI answers malformed requests with 400, not FastAPI's 422.
        problems, param = _validation_message(exc.errors())
        metrics.REQUESTS.labels("unknown", "400").inc()
        return error_response(400, problems, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # Unknown paths and methods answer in the OpenAI error shape too.
        message = (f"{request.method} {request.url.path} does not exist on this server"
                   if exc.status_code in (404, 405) else str(exc.detail))
        return error_response(exc.status_code, message)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        # The trace goes to the log, never to the client.
        incident = uuid.uuid4().hex[:12]
        logger.exception("unexpected error %s on %s %s", incident, request.method, request.url.path)
        return error_response(500, f"internal error (incident {incident}); the server stays up",
                              "server_error")

    @app.exception_handler(SpeechError)
    async def speech_failed(_: Request, exc: SpeechError):
        return exc.response()

    @app.post("/v1/audio/speech")
    async def speech(req: SpeechRequest):
        return await app.state.service.speech(req)

    @app.post("/v1/audio/speech/batch")
    async def speech_batch(req: BatchSpeechRequest) -> BatchSpeechResponse:
        return await run_batch(app.state.service, req)

    @app.websocket("/v1/audio/speech/stream")
    async def speech_stream(socket: WebSocket):
        await serve_session(socket, app.state.service)

    @app.get("/v1/audio/voices")
    async def voices():
        return list_voices(app.state.service)

    @app.post("/v1/audio/voices")
    async def add_voice(name: str = Form(...), consent: str = Form(...),
                        audio_sample: UploadFile | None = File(None),
                        speaker_embedding: str | None = Form(None), ref_text: str | None = Form(None),
                        speaker_description: str | None = Form(None), model: str | None = Form(None)):
        audio = None
        if audio_sample is not None:
            audio = await audio_sample.read(MAX_UPLOAD_BYTES + 1)
        return await upload_voice(
            app.state.service, name=name, consent=consent, audio=audio,
            filename=audio_sample.filename if audio_sample else None,
            content_type=audio_sample.content_type if audio_sample else None,
            speaker_embedding=speaker_embedding, ref_text=ref_text,
            speaker_description=speaker_description, model=model)

    @app.delete("/v1/audio/voices/{name}")
    async def remove_voice(name: str):
        return delete_voice(app.state.service, name)

    @app.get("/v1/audio/models")
    async def describe_audio_models():
        service: SpeechService = app.state.service
        return describe_models(service, await service.ready_families())

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        service: SpeechService = app.state.service
        ready = await service.ready_families()
        return ModelList(data=[ModelCard(id=name) for model in ready for name in (model, *service.names_of(model))])

    @app.get("/health")
    async def health():
        service: SpeechService = app.state.service
        server_ready = await service.client.server_ready()
        ready = await service.ready_families() if server_ready else []
        body = {"triton": triton_url, "server_ready": server_ready, "ready_models": ready,
                "models": service.families}
        if isinstance(service.client, TritonPool):
            body["tritonservers"] = service.client.state()
        return JSONResponse(body, status_code=200 if len(ready) == len(service.families) else 503)

    # The demo page (frontend/demo_page): static files calling the API above.
    app.mount("/demo", StaticFiles(directory=DEMO_PAGE, html=True), name="demo")

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


async def run_batch(service: SpeechService, req: BatchSpeechRequest) -> BatchSpeechResponse:
    """Items run concurrently, at most as many at once as admission had free when the batch
    came (none free: the whole batch is a 429); each item succeeds or fails on its own."""
    free = service.admission.limit - service.admission.in_flight
    if free <= 0:
        raise Overloaded(service.admission.in_flight)
    gate = asyncio.Semaphore(free)
    defaults = req.model_dump(exclude={"items"}, exclude_none=True)   # extra fields included

    async def item(index: int, fields: dict) -> BatchItemResult:
        async with gate:
            try:
                try:
                    request = SpeechRequest.model_validate({**defaults, **fields})
                except ValidationError as exc:
                    problems, param = _validation_message(exc.errors())
                    raise SpeechError(400, problems, param=param) from None
                prepared = await service.prepare(request)
                body, encoder, synthesis, words = await service.whole(prepared)
            except BaseException as exc:
                error = speech_error(exc, f"batch item {index}")
                metrics.REQUESTS.labels("batch", str(error.status)).inc()
                return BatchItemResult(index=index, status="error", error=error.message,
                                       status_code=error.status)
        metrics.REQUESTS.labels(prepared.model, "200").inc()
        return BatchItemResult(index=index, status="success", audio_data=base64.b64encode(body).decode(),
                               media_type=encoder.content_type, sample_rate=encoder.sample_rate,
                               audio_seconds=round(synthesis.audio_seconds, 3), status_code=200,
                               word_timestamps=words)

    items = [{k: v for k, v in i.items() if v is not None} for i in req.items]
    results = await asyncio.gather(*(item(k, fields) for k, fields in enumerate(items)))
    ok = sum(r.status == "success" for r in results)
    return BatchSpeechResponse(id=f"batch-{uuid.uuid4().hex}", results=list(results),
                               total=len(results), succeeded=ok, failed=len(results) - ok)

