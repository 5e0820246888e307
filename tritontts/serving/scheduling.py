"""Chunk scheduling for decoupled synthesis stages.

Triton's queue is first-in-first-out: under load, the first sentence of a new stream waits
behind every later sentence of the streams before it, and time to first audio grows with
the load. A stage using ChunkScheduler takes chunks off Triton's queue at once and runs
them on its own worker threads, lowest chunk index first (then arrival), so every stream's
next chunk goes before any stream's chunk after it: new streams start fast and running
streams advance in step. Results of one stream are released in chunk order, whatever order
the workers finish them in (state keyed by the stream id the text stage assigns).

Given `played` (the seconds of audio a result carries), the order is earliest deadline
first instead: a new stream's first chunk is due `first_audio_target` after it arrived; a
playing stream's next chunk is due when a listener who started at its first chunk would
run dry, less `margin` (the time a chunk may take to make). So a stream about to run dry
goes before a new one, and a new one before streams with seconds of audio in hand: first
audio stays early while playing streams do not stall (underruns, tritontts.benchmark).

A stream runs at most `chunks_per_stream` chunks at once (default 1): its first chunk then
has the cores to itself instead of sharing them with its own second chunk, which it would
otherwise delay (its audio plays for far longer than the next chunk takes to make), while
other streams still keep every worker busy. Once its first chunk is out, a stream may run
up to `later_chunks_per_stream` at once (default: the same) on workers that would
otherwise idle: only when no chunk is startable within the base limit, so under load
nothing changes, and a lone stream's later chunks use every worker (each chunk's own
resources, e.g. its thread count, stay what its index says, so results do not depend on
the load). A job that starts when no other job runs and none could start (`alone()` is
true on its worker thread) may use every core, e.g. a wider onnxruntime session; under
load each job gets its own core.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

# A stream whose final chunk never comes (its text stage failed midway) is forgotten after this.
STALE_STREAM_S = 600.0

_worker = threading.local()


def alone() -> bool:
    """On a scheduler's worker: whether the running job started with no other job running
    or ready to run (it may use every core). False anywhere else."""
    return getattr(_worker, "alone", False)


@dataclass(order=True)
class _Job:
    chunk_index: int
    seq: int
    stream_id: int = field(compare=False)
    final: bool = field(compare=False)
    work: Callable[[], Any] = field(compare=False)
    deliver: Callable[[Any], None] = field(compare=False)
    arrival: float = field(compare=False, default_factory=time.monotonic)


@dataclass
class _Stream:
    next_index: int = 0
    ready: dict = field(default_factory=dict)  # chunk index -> (result, deliver, final)
    touched: float = field(default_factory=time.monotonic)
    first_at: float | None = None     # when its first chunk was delivered
    audio: float = 0.0                # seconds of audio delivered so far


class ChunkScheduler:
    def __init__(self, workers: int, name: str = "chunks", chunks_per_stream: int = 1,
                 later_chunks_per_stream: int | None = None, played: Callable[[Any], float] | None = None,
                 first_audio_target: float = 0.5, margin: float = 0.5):
        self._queue: list[_Job] = []
        self._streams: dict[int, _Stream] = {}
        self._running: dict[int, int] = {}     # stream id -> its chunks on a worker now
        self._chunks_per_stream = chunks_per_stream
        self._later_chunks_per_stream = later_chunks_per_stream or chunks_per_stream
        self._played = played
        self._first_audio_target, self._margin = first_audio_target, margin
        self._lock = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self._threads = [threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, stream_id: int, chunk_index: int, final: bool,
               work: Callable[[], Any], deliver: Callable[[Any], None]) -> None:
        """Run work() on a worker; deliver(result) once all earlier chunks are delivered.
        If work() raises, deliver receives the exception (the stream's order still holds)."""
        with self._lock:
            self._queue.append(_Job(chunk_index, next(self._seq), stream_id, final, work, deliver))
            self._lock.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        for t in self._threads:
            t.join(timeout=5)

    def _startable(self, job: _Job, idle: bool = False) -> bool:
        """Whether `job` may start now; `idle`: no job is startable within the base limit,
        so a stream whose first chunk is out may use its later limit."""
        limit = self._chunks_per_stream
        if idle:
            stream = self._streams.get(job.stream_id)
            if stream is not None and stream.next_index > 0:     # its first chunk is out
                limit = self._later_chunks_per_stream
        return self._running.get(job.stream_id, 0) < limit

    def _deadline(self, job: _Job) -> float:
        stream = self._streams.get(job.stream_id)
        if stream is None or stream.first_at is None:
            return job.arrival + self._first_audio_target
        return stream.first_at + stream.audio - self._margin

    def _take(self) -> _Job | None:
        """The job to start now, off the queue (None: none can start now): the earliest
        chunk index first, or with `played`, the earliest deadline."""
        startable = ([j for j in self._queue if self._startable(j)]
                     or [j for j in self._queue if self._startable(j, idle=True)])
        if not startable:
            return None
        if self._played is None:
            job = min(startable)
        else:
            job = min(startable, key=lambda j: (self._deadline(j), j.chunk_index, j.seq))
        self._queue.remove(job)
        return job

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (job := self._take()) is None:
                    self._lock.wait()
                if self._closed:
                    return
                self._running[job.stream_id] = self._running.get(job.stream_id, 0) + 1
                _worker.alone = (sum(self._running.values()) == 1
                                 and not any(self._startable(j) for j in self._queue))
            try:
                result = job.work()
            except Exception as exc:  # noqa: BLE001 - handed to deliver, never lost
                result = exc
            finally:
                _worker.alone = False
            self._release(job, result)

    def _release(self, job: _Job, result: Any) -> None:
        # Deliver under the lock so two workers never send one stream's chunks out of order;
        # the stream's next chunk may start only once this one's audio is counted (its
        # deadline depends on it).
        with self._lock:
            self._running[job.stream_id] -= 1
            if not self._running[job.stream_id]:
                del self._running[job.stream_id]
            self._lock.notify_all()
            now = time.monotonic()
            stream = self._streams.setdefault(job.stream_id, _Stream())
            stream.ready[job.chunk_index] = (result, job.deliver, job.final)
            stream.touched = now
            while stream.next_index in stream.ready:
                result, deliver, final = stream.ready.pop(stream.next_index)
                deliver(result)
                if self._played is not None and not isinstance(result, Exception):
                    stream.first_at = stream.first_at if stream.first_at is not None else now
                    stream.audio += self._played(result)
                stream.next_index += 1
                if final:
                    del self._streams[job.stream_id]
                    break
            for key in [k for k, s in self._streams.items() if now - s.touched > STALE_STREAM_S]:
                del self._streams[key]
