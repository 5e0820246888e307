"""Several tritonservers behind one front: each request goes to the least-loaded healthy
one, and a server that dies costs no new request.

A SpeechClient like TritonSpeechClient, over one such client per server:

- health: every `health_interval_s` each server's readiness is asked (gRPC
  ServerReady); a server that fails it, or that refuses a request as unreachable, is out
  of the rotation until it answers ready again.
- choice: the healthy server with the fewest requests in flight from this front (ties go
  round-robin, so an idle pool spreads too). Fronts do not coordinate: each balances its
  own traffic, which spreads the total when several fronts share the servers.
- failover: a request whose server turns out unreachable before its first chunk is sent
  to the next server (same request id: the cancel model is per server). After the first
  chunk it cannot move (the listener already has part of the audio), so it fails as one
  server's request would.

If no server is healthy, the request still tries each (one may be back before its health
check says so) and fails with TritonUnavailable (HTTP 503) only if none answers.

A URL `dns:HOST:PORT` stands for every address HOST resolves to, looked up again at each
health check: a Kubernetes headless Service over the tritonserver pods, so pods that the
autoscaler adds join the rotation and pods that go away leave it (deploy/k8s).
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Sequence

from .triton_client import AudioChunk, SpeechClient, StageStalled, TritonSpeechClient, TritonUnavailable

logger = logging.getLogger("tritontts.frontend")

# Failures that mean "this server cannot serve now", as opposed to "this request is bad or
# failed in a stage" (those would fail on any server, so they are not retried).
UNREACHABLE = (TritonUnavailable, StageStalled)
DNS_PREFIX = "dns:"


@dataclass
class Backend:
    url: str
    client: SpeechClient
    healthy: bool = True
    in_flight: int = 0
    served: int = 0
    last_error: str = ""
    origin: str = ""            # the dns: name it was found under ("" = given as is)
    down_since: float | None = field(default=None, repr=False)

    def state(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "in_flight": self.in_flight,
                "served": self.served, **({"last_error": self.last_error} if self.last_error else {})}


class TritonPool:
    def __init__(self, urls: Sequence[str], request_timeout_s: float = 600.0,
                 stall_timeout_s: float = 120.0, health_interval_s: float = 2.0,
                 client_factory: Callable[[str], SpeechClient] | None = None):
        if not urls:
            raise ValueError("a Triton pool needs at least one URL")
        self._make = client_factory or (lambda url: TritonSpeechClient(url, request_timeout_s, stall_timeout_s))
        self.discovered = [u[len(DNS_PREFIX):] for u in urls if u.startswith(DNS_PREFIX)]
        self.backends = [Backend(url, self._make(url)) for url in urls if not url.startswith(DNS_PREFIX)]
        self.health_interval_s = health_interval_s
        self._turn = itertools.count()
        self._health_task: asyncio.Task | None = None

    # --- health --------------------------------------------------------------------------

    def _ensure_health_loop(self) -> None:
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def _health_loop(self) -> None:
        while True:
            await self.check_health()
            await asyncio.sleep(self.health_interval_s)

    async def discover(self) -> None:
        """Follow each dns: name's addresses: new ones join (as healthy until checked),
        vanished ones leave once nothing of this front runs on them."""
        if not self.discovered:
            return
        wanted: set[str] = set()
        loop = asyncio.get_running_loop()
        for name in self.discovered:
            host, _, port = name.rpartition(":")
            try:
                infos = await loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            except OSError as exc:
                logger.warning("cannot resolve %s: %s", host, exc)
                wanted |= {b.url for b in self.backends if b.origin == name}   # keep what we had
                continue
            for family, _, _, _, address in infos:
                ip = f"[{address[0]}]" if family == socket.AF_INET6 else address[0]
                url = f"{ip}:{port}"
                wanted.add(url)
                if all(b.url != url for b in self.backends):
                    logger.info("tritonserver %s (from %s) joins the rotation", url, name)
                    self.backends.append(Backend(url, self._make(url), origin=name))
        gone = [b for b in self.backends if b.origin and b.url not in wanted and not b.in_flight]
        for backend in gone:
            logger.info("tritonserver %s left %s", backend.url, backend.origin)
            self.backends.remove(backend)
            await backend.client.close()

    async def check_health(self) -> None:
        """Ask every server whether it is ready; update the rotation."""
        await self.discover()
        answers = await asyncio.gather(*(b.client.server_ready() for b in self.backends),
                                       return_exceptions=True)
        for backend, ready in zip(self.backends, answers):
            if ready is True:
                if not backend.healthy:
                    logger.warning("tritonserver %s is ready again: back in the rotation", backend.url)
                backend.healthy, backend.down_since = True, None
            else:
                self._mark_down(backend, "not ready" if ready is False else repr(ready))

    def _mark_down(self, backend: Backend, why: str) -> None:
        if backend.healthy:
            logger.warning("tritonserver %s out of the rotation: %s", backend.url, why)
            backend.down_since = asyncio.get_running_loop().time()
        backend.healthy, backend.last_error = False, why

    def candidates(self) -> list[Backend]:
        """Healthy servers, least loaded first (ties in turn), then the others."""
        self._ensure_health_loop()
        turn = next(self._turn)
        n = len(self.backends)
        if n == 0:
            return []
        rotated = [self.backends[(turn + i) % n] for i in range(n)]
        healthy = sorted((b for b in rotated if b.healthy), key=lambda b: b.in_flight)
        return healthy + [b for b in rotated if not b.healthy]

    def state(self) -> list[dict]:
        return [b.state() for b in self.backends]

    # --- SpeechClient --------------------------------------------------------------------

    async def synthesize(self, model: str, text: str, voice: str, params: dict,
                         request_id: str) -> AsyncIterator[AudioChunk]:
        failure: Exception | None = None
        if not self.backends:          # dns: names not looked up yet
            await self.discover()
        for backend in self.candidates():
            started = False
            backend.in_flight += 1
            try:
                # aclosing: a listener who leaves closes the server's stream now (its
                # cleanup cancels the work in the stages), not when it is collected.
                stream = backend.client.synthesize(model, text, voice, params, request_id)
                async with contextlib.aclosing(stream):
                    async for chunk in stream:
                        started = True
                        # Counted at the final chunk: the caller may stop reading there.
                        backend.served += chunk.final
                        yield chunk
                return
            except UNREACHABLE as exc:
                self._mark_down(backend, str(exc))
                if started:
                    raise
                failure = exc
            finally:
                backend.in_flight -= 1
        raise TritonUnavailable(f"no tritonserver could take the request ({failure})")

    async def encode_voice(self, model: str, params: dict) -> bytes:
        failure: Exception | None = None
        if not self.backends:
            await self.discover()
        for backend in self.candidates():
            backend.in_flight += 1
            try:
                return await backend.client.encode_voice(model, params)
            except UNREACHABLE as exc:
                self._mark_down(backend, str(exc))
                failure = exc
            finally:
                backend.in_flight -= 1
        raise TritonUnavailable(f"no tritonserver could encode the voice ({failure})")

    async def model_ready(self, model: str) -> bool:
        for backend in self.candidates():
            if backend.healthy and await backend.client.model_ready(model):
                return True
        return False

    async def server_ready(self) -> bool:
        """Ready while any server is: the front keeps serving on the others."""
        self._ensure_health_loop()
        await self.check_health()
        return any(b.healthy for b in self.backends)

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        await asyncio.gather(*(b.client.close() for b in self.backends), return_exceptions=True)
