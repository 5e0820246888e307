"""In-process harness for the front's unit tests: a scripted Triton client, the app wired
to it, and a raw ASGI exchange for what httpx's ASGITransport cannot show (it buffers
the whole body and never disconnects).

No tritonserver, no sockets: every test runs in milliseconds.
"""
from __future__ import annotations

import asyncio
import functools
import json
from contextlib import asynccontextmanager
from typing import AsyncIterator

import httpx
import numpy as np
from prometheus_client import REGISTRY

from frontend.app import create_app
from frontend.triton_client import AudioChunk

TEST_TIMEOUT_S = 10.0  # a hang fails the test in seconds, not after pytest's 900 s


def run_async(test):
    """An async test run on a fresh asyncio loop (no pytest async plugin needed)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(test(*args, **kwargs), TEST_TIMEOUT_S))
    return run


def tone_chunks(count: int = 3, size: int = 400) -> list[np.ndarray]:
    """Chunks of distinct constant levels, so their order shows in the output."""
    return [np.full(size, 0.1 * (i + 1), dtype=np.float32) for i in range(count)]


def pcm16(audio: np.ndarray) -> bytes:
    return (audio * 32767.0).astype("<i2").tobytes()


def in_flight_gauge() -> float:
    return REGISTRY.get_sample_value("tts_requests_in_flight")


class FakeTritonClient:
    """Stands in for TritonSpeechClient. Every synthesize() streams `chunks` at
    `sample_rate`, the last one marked final, following the script:

      gates    {i: Event}      wait for the event before sending chunk i (holds a request open)
      errors   {i: exception}  raise instead of sending chunk i (0: before the first chunk)
      delay    seconds before each chunk
      ready    the models model_ready() says yes to (None: all of them)
    """

    def __init__(self, chunks: list[np.ndarray] | None = None, sample_rate: int = 22050, *,
                 gates: dict[int, asyncio.Event] | None = None,
                 errors: dict[int, BaseException] | None = None, delay: float = 0.0,
                 ready: set[str] | None = None, server_ready: bool = True):
        self.chunks = tone_chunks() if chunks is None else chunks
        self.sample_rate = sample_rate
        self.gates, self.errors, self.delay = gates or {}, errors or {}, delay
        self.ready, self._server_ready = ready, server_ready
        self.calls: list[dict] = []       # what each synthesize() was asked
        self.encoded: list[dict] = []     # what each encode_voice() was asked
        self.voice_errors: dict[str, BaseException] = {}   # stage -> what encode_voice raises
        self.open_streams = 0             # started and neither finished nor closed
        self.cancelled = 0                # closed by the front before their final chunk
        self.waiting = asyncio.Event()    # set while a stream waits at a gate
        self.closed = False

    async def synthesize(self, model: str, text: str, voice: str, params: dict,
                         request_id: str) -> AsyncIterator[AudioChunk]:
        self.calls.append({"model": model, "text": text, "voice": voice, "params": params,
                           "request_id": request_id})
        self.open_streams += 1
        try:
            for index, audio in enumerate(self.chunks):
                if index in self.gates:
                    self.waiting.set()
                    await self.gates[index].wait()
                    self.waiting.clear()
                if self.delay:
                    await asyncio.sleep(self.delay)
                if index in self.errors:
                    raise self.errors[index]
                yield AudioChunk(audio, self.sample_rate, index, index == len(self.chunks) - 1)
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled += 1  # where the real client cancels the Triton stream
            raise
        finally:
            self.open_streams -= 1

    async def encode_voice(self, model: str, params: dict) -> bytes:
        """Packed "features" that name the stage and the reference they came from."""
        self.encoded.append({"model": model, "params": params})
        if model in self.voice_errors:
            raise self.voice_errors[model]
        return f"features of {model} for {hash(json.dumps(params, sort_keys=True))}".encode()

    async def model_ready(self, model: str) -> bool:
        return self.ready is None or model in self.ready

    async def server_ready(self) -> bool:
        return self._server_ready

    async def close(self) -> None:
        self.closed = True


class Front:
    """The app serving `families` from a fake client, lifespan run, and an httpx client."""

    def __init__(self, app, http: httpx.AsyncClient, fake: FakeTritonClient):
        self.app, self.http, self.fake = app, http, fake

    @property
    def admission(self):
        return self.app.state.service.admission

    def speech(self, **body) -> "httpx.Response":
        return self.http.post("/v1/audio/speech", json={"input": "Hello there.", **body})

    def exchange(self, spec_version: str = "2.3", stall: bool = False, **body) -> "AsgiExchange":
        return AsgiExchange(self.app, "/v1/audio/speech", {"input": "Hello there.", **body},
                            spec_version, stall).start()


@asynccontextmanager
async def serving(fake: FakeTritonClient, families: list[str] | None = None,
                  max_in_flight: int = 64, **options) -> AsyncIterator[Front]:
    """options: create_app's keyword options (voices_dir, media, checkpoints, ...)."""
    app = create_app("fake:0", families or ["piper"], max_in_flight, client=fake, **options)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as http:
            yield Front(app, http, fake)


class AsgiExchange:
    """One POST driven through the ASGI app message by message, as uvicorn would.

    spec_version "2.3" (uvicorn's HTTP servers): a vanished client shows as an
    http.disconnect message. "2.4": send() raises OSError once the client is gone.
    stall: a client that stopped reading, so the first send() never completes: under 2.3
    only the app's own cancellation ends it, under 2.4 the disconnect makes it raise.
    """

    def __init__(self, app, path: str, body: dict, spec_version: str, stall: bool = False):
        self.app, self.body = app, json.dumps(body).encode()
        self.spec_version, self.stall = spec_version, stall
        self.stalled = asyncio.Event()  # set once a send() is stuck
        self.scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": spec_version},
            "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
            "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"front"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(self.body)).encode())],
            "client": ("127.0.0.1", 50000), "server": ("front", 80),
        }
        self.sent: asyncio.Queue[dict] = asyncio.Queue()
        self.gone = asyncio.Event()
        self._request_read = False

    def start(self) -> "AsgiExchange":
        self.task = asyncio.create_task(self.app(self.scope, self._receive, self._send))
        return self

    async def _receive(self) -> dict:
        if not self._request_read:
            self._request_read = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        if self.stall:
            self.stalled.set()
            if self.spec_version == "2.3":
                await asyncio.Event().wait()
            await self.gone.wait()
        if self.gone.is_set() and self.spec_version == "2.4":
            raise OSError("the client went away")
        await self.sent.put(message)

    async def message(self) -> dict:
        return await self.sent.get()

    def disconnect(self) -> None:
        self.gone.set()

    async def outcome(self) -> BaseException | None:
        """Wait for the app to return; what it raised, if anything."""
        try:
            await self.task
        except Exception as exc:  # an app error is what a server would log
            return exc
        return None

    def drained(self) -> list[dict]:
        messages = []
        while not self.sent.empty():
            messages.append(self.sent.get_nowait())
        return messages
