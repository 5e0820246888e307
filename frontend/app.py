"""The FastAPI app: OpenAI audio API in front of Triton."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import metrics
from .protocol import ModelCard, ModelList, SpeechRequest
from .serving import SpeechService, error_response
from .triton_client import SpeechClient, TritonSpeechClient


def create_app(triton_url: str, families: list[str], max_in_flight: int = 64,
               request_timeout_s: float = 600.0, client: SpeechClient | None = None) -> FastAPI:
    """`client` replaces the gRPC client to triton_url (the front's unit tests script one)."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # The gRPC channel belongs to the server's event loop, so it is opened here.
        speech_client = client or TritonSpeechClient(triton_url, request_timeout_s)
        app.state.service = SpeechService(speech_client, families, max_in_flight)
        yield
        await speech_client.close()

    app = FastAPI(title="tritontts", summary="OpenAI audio API on Triton", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError):
        # OpenAI answers malformed requests with 400, not FastAPI's 422.
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        metrics.REQUESTS.labels("unknown", "400").inc()
        return error_response(400, problems, param=str(first[-1]) if len(first) > 1 else None)

    @app.post("/v1/audio/speech")
    async def speech(req: SpeechRequest):
        return await app.state.service.speech(req)

    @app.get("/v1/models")
    async def models() -> ModelList:
        ready = await app.state.service.ready_families()
        return ModelList(data=[ModelCard(id=name) for name in ready])

    @app.get("/health")
    async def health():
        service: SpeechService = app.state.service
        server_ready = await service.client.server_ready()
        ready = await service.ready_families() if server_ready else []
        body = {"triton": triton_url, "server_ready": server_ready, "ready_models": ready,
                "models": service.families}
        return JSONResponse(body, status_code=200 if len(ready) == len(service.families) else 503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
