"""The load driver: N concurrent streaming requests through the OpenAI front, closed loop,
for a bounded time per concurrency level, and what a listener would have heard.

Each request streams raw PCM (`stream_format: "audio"`, `response_format: "pcm"`: no
header, so the first byte is the first audio) and records when each piece arrived and how
much audio had arrived by then. From that:

  time to first audio   request sent -> first audio byte
  real-time factor      request wall time / audio duration (below 1: faster than real time)
  worst gap             longest wait between two pieces after the first
  underruns             times a listener who starts playing at the first byte, and pauses
                        whenever the buffer runs dry, would have run dry
"""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import httpx

# Held-out text of varied length (Harvard sentences, lists 1-3; not used by any test):
# 1, 2, 3 and 5 sentences, so every level sees short and long requests alike.
TEXTS: tuple[str, ...] = (
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon. The source of the huge river is the clear spring.",
    "Kick the ball straight and follow through. Help the woman get back to her feet. "
    "A pot of tea helps to pass the evening.",
    "Smoky fires lack flame and heat. The soft cushion broke the man's fall. The salt breeze "
    "came across from the sea. The girl at the booth sold fifty bonds. The small pup gnawed "
    "a hole in the sock.",
    "The fish twisted and turned on the bent hook.",
    "Press the pants and sew a button on the vest. The swan dive was far short of perfect.",
)

PCM_BYTES_PER_SAMPLE = 2   # the front's pcm is 16-bit mono


@dataclass
class RequestResult:
    """One request, as its client saw it (times in seconds from sending it)."""
    chars: int
    status: int = 0
    error: str | None = None
    first_audio: float | None = None
    wall: float = 0.0
    # (arrival time, audio seconds that piece carried), in arrival order
    pieces: list[tuple[float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and self.audio_seconds > 0

    @property
    def audio_seconds(self) -> float:
        return sum(seconds for _, seconds in self.pieces)

    @property
    def rtf(self) -> float:
        return self.wall / self.audio_seconds if self.audio_seconds else math.inf

    @property
    def worst_gap(self) -> float:
        times = [t for t, _ in self.pieces]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)

    @property
    def underruns(self) -> int:
        return count_underruns(self.pieces)


def count_underruns(pieces: Sequence[tuple[float, float]]) -> int:
    """How often a real-time player runs dry: it starts at the first piece's arrival, plays
    each piece for its duration, and when the next piece has not arrived by the time the
    buffer ends, it stalls (one underrun) and resumes when that piece arrives."""
    if not pieces:
        return 0
    first_arrival, first_seconds = pieces[0]
    playing_until = first_arrival + first_seconds
    stalls = 0
    for arrival, seconds in pieces[1:]:
        if arrival > playing_until:
            stalls += 1
            playing_until = arrival
        playing_until += seconds
    return stalls


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between order statistics; None for no values."""
    ordered = sorted(v for v in values if v is not None and math.isfinite(v))
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def stream_one(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                     sample_rate: int) -> RequestResult:
    """One streaming request; never raises (an error is recorded on the result)."""
    result = RequestResult(chars=len(body.get("input", "")))
    bytes_per_second = sample_rate * PCM_BYTES_PER_SAMPLE
    start = time.perf_counter()
    carry = 0    # an odd byte split across pieces still belongs to one sample
    try:
        async with client.stream("POST", url, json=body) as response:
            result.status = response.status_code
            if response.status_code != 200:
                result.error = (await response.aread()).decode("utf-8", "replace")[:300]
                return result
            async for piece in response.aiter_raw():
                now = time.perf_counter() - start
                if not piece:
                    continue
                if result.first_audio is None:
                    result.first_audio = now
                whole = (len(piece) + carry) // PCM_BYTES_PER_SAMPLE * PCM_BYTES_PER_SAMPLE
                carry = len(piece) + carry - whole
                result.pieces.append((now, whole / bytes_per_second))
    except (httpx.HTTPError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.wall = time.perf_counter() - start
    return result


@dataclass
class Level:
    """One concurrency level's requests and its wall time (first send to last answer)."""
    concurrency: int
    results: list[RequestResult]
    wall: float

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.results if r.ok]
        rejected = [r for r in self.results if r.status in (429, 503)]
        errors = [r for r in self.results if not r.ok and r not in rejected]
        ttfa = [r.first_audio for r in ok]
        rtf = [r.rtf for r in ok]
        audio = sum(r.audio_seconds for r in ok)
        return {
            "concurrency": self.concurrency,
            "requests": len(self.results),
            "ok": len(ok),
            "rejected": len(rejected),
            "errors": len(errors),
            "first_errors": sorted({(r.error or f"HTTP {r.status}")[:200] for r in errors})[:3],
            "ttfa_p50": percentile(ttfa, 50),
            "ttfa_p95": percentile(ttfa, 95),
            "ttfa_p99": percentile(ttfa, 99),
            "rtf_p50": percentile(rtf, 50),
            "rtf_p95": percentile(rtf, 95),
            "audio_seconds": audio,
            "wall_seconds": self.wall,
            "audio_s_per_s": audio / self.wall if self.wall else None,
            "worst_gap": max((r.worst_gap for r in ok), default=None),
            "underruns": sum(r.underruns for r in ok),
            "requests_with_underruns": sum(1 for r in ok if r.underruns),
        }


async def run_level(url: str, bodies: Callable[[int], dict[str, Any]], sample_rate: int,
                    concurrency: int, seconds: float, timeout: float = 600.0,
                    on_result: Callable[[RequestResult], None] | None = None) -> Level:
    """`concurrency` clients in a closed loop: each sends its next request as soon as the
    last one ends, until `seconds` have passed (every client sends at least one; requests
    under way at the deadline finish and count)."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    results: list[RequestResult] = []
    counter = iter(range(1 << 62))
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        start = time.perf_counter()
        deadline = start + seconds

        async def worker():
            while True:
                result = await stream_one(client, url, bodies(next(counter)), sample_rate)
                results.append(result)
                if on_result is not None:
                    on_result(result)
                if time.perf_counter() >= deadline:
                    return

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return Level(concurrency, results, wall)


def request_bodies(model: str, extra: dict[str, Any], seeded: bool,
                   texts: Sequence[str] = TEXTS) -> Callable[[int], dict[str, Any]]:
    """The i-th request: the texts in turn, streamed as raw PCM; with `seeded` (the family
    takes a seed), seed i, so a run repeats exactly."""
    def body(i: int) -> dict[str, Any]:
        request = {"model": model, "input": texts[i % len(texts)], "response_format": "pcm",
                   "stream_format": "audio", **extra}
        if seeded:
            request.setdefault("seed", i)
        return request
    return body


MAX_NEW_TOKENS = 100      # frames per request where a family takes max_new_tokens (4-8 s of audio)


def capped_bodies(name: str) -> Callable[[int], dict[str, Any]]:
    """The family's requests on a random checkpoint: the load texts, seeded, with its
    example fields, at most MAX_NEW_TOKENS frames where it takes max_new_tokens (random
    weights rarely stop on their own: a talker would run to its full length)."""
    from ..families import FAMILIES

    family = FAMILIES[name]
    extra = family.example_params()
    if "max_new_tokens" in family.fields.takes:
        extra.setdefault("max_new_tokens", MAX_NEW_TOKENS)
    return request_bodies(name, extra, seeded=True, texts=TEXTS)
