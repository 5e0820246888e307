"""ChunkScheduler: earliest chunk first across streams, in-order release within a stream."""
from __future__ import annotations

import threading
import time

from tritontts.serving.scheduling import ChunkScheduler


def test_streams_release_in_order_even_when_workers_finish_out_of_order():
    sched = ChunkScheduler(workers=3, chunks_per_stream=4)
    delivered: list[tuple[int, int]] = []
    done = threading.Event()
    durations = {0: 0.15, 1: 0.01, 2: 0.05, 3: 0.0}  # chunk 0 is the slowest

    def deliver(result):
        delivered.append(result)
        if len(delivered) == 8:
            done.set()

    for stream in (1, 2):
        for index in range(4):
            sched.submit(stream, index, index == 3,
                         lambda s=stream, i=index: (time.sleep(durations[i]), (s, i))[1], deliver)
    assert done.wait(10)
    sched.close()
    for stream in (1, 2):
        assert [i for s, i in delivered if s == stream] == [0, 1, 2, 3]


def test_earliest_chunk_index_runs_first():
    sched = ChunkScheduler(workers=1)
    gate = threading.Event()
    started: list[tuple[int, int]] = []
    finished = threading.Event()
    # Block the only worker, queue stream A's chunks 1..3 and then stream B's chunk 0.
    sched.submit(99, 0, True, lambda: gate.wait(5), lambda r: None)
    time.sleep(0.05)
    for index in (1, 2, 3):
        sched.submit(1, index, index == 3, lambda i=index: started.append((1, i)), lambda r: None)
    sched.submit(2, 0, True, lambda: started.append((2, 0)),
                 lambda r: None)
    sched.submit(2, 1, True, lambda: (started.append((2, 1)), finished.set()), lambda r: None)
    gate.set()
    assert finished.wait(5)
    time.sleep(0.1)
    sched.close()
    assert started[0] == (2, 0), started  # the new stream's first chunk jumps the queue
    assert started.index((1, 1)) < started.index((2, 1)) < started.index((1, 2))


def test_a_failing_chunk_is_delivered_as_its_exception():
    sched = ChunkScheduler(workers=2)
    got = []
    done = threading.Event()

    def boom():
        raise RuntimeError("bad chunk")

    sched.submit(5, 0, False, boom, got.append)
    sched.submit(5, 1, True, lambda: "ok", lambda r: (got.append(r), done.set()))
    assert done.wait(5)
    sched.close()
    assert isinstance(got[0], RuntimeError) and got[1] == "ok"


def test_a_stream_runs_one_chunk_at_a_time_while_other_streams_use_the_other_workers():
    sched = ChunkScheduler(workers=2)
    lock = threading.Lock()
    running: dict[int, int] = {}
    most: dict[int, int] = {}
    busy_streams: list[int] = []
    done = threading.Event()
    delivered = []

    def work(stream):
        with lock:
            running[stream] = running.get(stream, 0) + 1
            most[stream] = max(most.get(stream, 0), running[stream])
            busy_streams.append(len([s for s, n in running.items() if n]))
        time.sleep(0.03)
        with lock:
            running[stream] -= 1

    def deliver(result):
        delivered.append(result)
        if len(delivered) == 8:
            done.set()

    for index in range(4):           # stream 1's chunks all queued before stream 2 arrives
        sched.submit(1, index, index == 3, lambda: work(1), deliver)
    for index in range(4):
        sched.submit(2, index, index == 3, lambda: work(2), deliver)
    assert done.wait(10)
    sched.close()
    assert most == {1: 1, 2: 1}              # never two chunks of one stream at once
    assert max(busy_streams) == 2            # but both workers were busy with both streams


def test_a_lone_streams_first_chunk_runs_alone_and_its_later_chunks_fill_the_idle_workers():
    sched = ChunkScheduler(workers=2, chunks_per_stream=1, later_chunks_per_stream=2)
    lock = threading.Lock()
    running = [0]
    beside: dict[int, int] = {}       # chunk index -> most chunks of the stream running with it
    done = threading.Event()
    delivered = []

    def work(index):
        with lock:
            running[0] += 1
            beside[index] = running[0]
        time.sleep(0.05)
        with lock:
            beside[index] = max(beside[index], running[0])
            running[0] -= 1
        return index

    def deliver(result):
        delivered.append(result)
        if len(delivered) == 5:
            done.set()

    for index in range(5):
        sched.submit(1, index, index == 4, lambda i=index: work(i), deliver)
    assert done.wait(10)
    sched.close()
    assert delivered == [0, 1, 2, 3, 4]      # still released in order
    assert beside[0] == 1                    # the first chunk had the workers to itself
    assert max(beside[i] for i in range(1, 5)) == 2   # later ones ran two at a time


def test_a_streams_extra_later_chunk_takes_a_worker_only_when_no_other_streams_chunk_could():
    sched = ChunkScheduler(workers=2, chunks_per_stream=1, later_chunks_per_stream=2)
    gate, running = threading.Event(), threading.Event()
    started: list[tuple[int, int]] = []
    out = threading.Semaphore(0)
    for stream, last in ((1, 0), (2, 4)):        # both streams' first chunks are out
        for index in range(last + 1):
            sched.submit(stream, index, False, lambda: None, lambda r: out.release())
    for _ in range(6):
        assert out.acquire(timeout=5)
    sched.submit(1, 1, False, lambda: (running.set(), gate.wait(5)), lambda r: out.release())
    assert running.wait(5)
    # Stream 1's chunk 2 has the lower index, but stream 2's chunk 5 may start within the
    # base limit, so it gets the idle worker.
    sched.submit(1, 2, False, lambda: (started.append((1, 2)), gate.wait(5)), lambda r: out.release())
    sched.submit(2, 5, False, lambda: (started.append((2, 5)), gate.wait(5)), lambda r: out.release())
    time.sleep(0.2)
    assert started == [(2, 5)]
    gate.set()
    for _ in range(3):
        assert out.acquire(timeout=5)
    sched.close()
    assert started == [(2, 5), (1, 2)]


def test_alone_is_true_only_for_a_job_with_nothing_else_running_or_ready():
    from tritontts.serving.scheduling import alone

    sched = ChunkScheduler(workers=2)
    seen: dict[str, bool] = {}
    release = threading.Event()
    finished = threading.Event()
    count = []

    def record(name, wait=None):
        seen[name] = alone()
        if wait is not None:
            wait.wait(5)

    def deliver(_):
        count.append(1)
        if len(count) == 4:
            finished.set()

    sched.submit(1, 0, True, lambda: record("solo"), deliver)
    time.sleep(0.1)
    # stream 2's first chunk runs while its second waits for it: nothing else can start
    sched.submit(2, 0, False, lambda: record("first of a lone stream", release), deliver)
    sched.submit(2, 1, True, lambda: record("second of a lone stream"), deliver)
    time.sleep(0.1)
    sched.submit(3, 0, True, lambda: record("beside another stream"), deliver)
    time.sleep(0.1)
    release.set()
    assert finished.wait(5)
    sched.close()
    assert seen == {"solo": True, "first of a lone stream": True,
                    "second of a lone stream": True, "beside another stream": False}
    assert alone() is False                  # not on a worker


def test_with_audio_durations_a_stream_about_to_run_dry_goes_before_a_new_stream_and_one_with_audio_in_hand_after():
    # Results carry their audio seconds. Streams 1 and 2 each deliver a first chunk: stream 1
    # with 0.2 s of audio (dry almost at once), stream 2 with 30 s (plenty in hand).
    sched = ChunkScheduler(workers=1, played=lambda seconds: seconds,
                           first_audio_target=0.5, margin=0.5)
    gate = threading.Event()
    started: list[tuple[int, int]] = []
    done = threading.Event()
    sched.submit(1, 0, False, lambda: 0.2, lambda r: None)
    sched.submit(2, 0, False, lambda: 30.0, lambda r: None)
    time.sleep(0.1)
    sched.submit(99, 0, True, lambda: gate.wait(5) and 0.0, lambda r: None)   # hold the worker
    time.sleep(0.05)
    sched.submit(2, 1, True, lambda: (started.append((2, 1)), 1.0)[1], lambda r: None)
    sched.submit(3, 0, True, lambda: (started.append((3, 0)), 1.0)[1], lambda r: None)
    sched.submit(1, 1, True, lambda: (started.append((1, 1)), 1.0)[1],
                 lambda r: None)
    sched.submit(4, 0, True, lambda: (started.append((4, 0)), done.set(), 1.0)[2], lambda r: None)
    gate.set()
    assert done.wait(5)
    time.sleep(0.1)
    sched.close()
    # stream 1 (dry) first; then the new streams in arrival order; stream 2 (30 s in hand) last
    assert started == [(1, 1), (3, 0), (4, 0), (2, 1)], started
