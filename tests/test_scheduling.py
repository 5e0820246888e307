"""ChunkScheduler: earliest chunk first across streams, in-order release within a stream."""
from __future__ import annotations

import threading
import time

from tritontts.scheduling import ChunkScheduler


def test_streams_release_in_order_even_when_workers_finish_out_of_order():
    sched = ChunkScheduler(workers=3)
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
