"""run_in_groups (tritontts.serving.stage): the dynamic batcher's requests of equal key
computed in one call, a failure kept to the request that fails."""
from pathlib import Path

import numpy as np
import pytest

from tritontts.protocol import InvalidRequest
from tritontts.serving.stage import Inputs, run_in_groups


def shape(inputs):
    if inputs["x"].ndim != 1:
        raise InvalidRequest("x must be 1-D")
    return inputs["x"].shape[0]


def test_requests_of_one_shape_are_computed_in_one_call_in_the_batchs_order():
    calls = []

    def compute(members):
        calls.append(len(members))
        stacked = np.stack([m["x"] for m in members]) * 2
        return [{"y": row} for row in stacked]

    batch = [Inputs(x=np.arange(n, dtype=np.float32)) for n in (3, 5, 3, 3, 5)]
    ready = []
    results = run_in_groups(batch, shape, compute, lambda i, r: ready.append(i))
    assert sorted(calls) == [2, 3]
    assert [r["y"].shape[0] for r in results] == [3, 5, 3, 3, 5]
    assert all(np.array_equal(r["y"], b["x"] * 2) for r, b in zip(results, batch))
    assert sorted(ready) == [0, 1, 2, 3, 4]


def test_a_bad_key_fails_alone_and_a_failing_group_is_retried_one_request_at_a_time():
    def compute(members):
        if any(m["x"][0] < 0 for m in members):
            raise ValueError("negative start")
        return [{"y": m["x"] + 1} for m in members]

    batch = [Inputs(x=np.zeros(2)), Inputs(x=np.zeros((2, 2))), Inputs(x=-np.ones(2)), Inputs(x=np.ones(2))]
    results = run_in_groups(batch, shape, compute)
    assert isinstance(results[1], InvalidRequest)
    assert isinstance(results[2], ValueError)
    assert np.array_equal(results[0]["y"], [1, 1]) and np.array_equal(results[3]["y"], [2, 2])
    with pytest.raises(ValueError):       # the control: the group alone does fail
        compute([batch[0], batch[2]])


def test_max_rows_splits_a_group_into_calls_of_at_most_that_many_rows_keeping_each_result():
    calls = []

    def compute(members):
        calls.append(len(members))
        return [{"y": m["x"] + 1} for m in members]

    batch = [Inputs(x=np.arange(3, dtype=np.float32) + k) for k in range(5)]
    results = run_in_groups(batch, shape, compute, max_rows=2)
    assert calls == [2, 2, 1]
    assert all(np.array_equal(r["y"], b["x"] + 1) for r, b in zip(results, batch))
    calls.clear()
    run_in_groups(batch, shape, compute)            # the control: no cap, one call
    assert calls == [5]


def test_the_servers_max_rows_per_call_overrides_every_grouped_stages_config(monkeypatch):
    """TRITONTTS_MAX_ROWS_PER_CALL (tritontts.benchmark.batching --served serves a checkpoint
    with batches whole and row by row) wins over the config's max_rows_per_call."""
    from tritontts.serving.stage import MAX_ROWS_PER_CALL_ENV, GroupedStage, StageContext

    calls = []

    class Doubling(GroupedStage):
        def batch_key(self, inputs):
            return shape(inputs)

        def run_group(self, members):
            calls.append(len(members))
            return [{"y": m["x"] * 2} for m in members]

    stage = Doubling(StageContext("doubling", Path("."), parameters={"max_rows_per_call": "4"}))
    batch = [Inputs(x=np.arange(3, dtype=np.float32)) for _ in range(5)]
    stage.run_batch(batch)
    assert calls == [4, 1]                      # the config's cap
    calls.clear()
    monkeypatch.setenv(MAX_ROWS_PER_CALL_ENV, "1")
    stage.run_batch(batch)
    assert calls == [1] * 5
    calls.clear()
    monkeypatch.setenv(MAX_ROWS_PER_CALL_ENV, "0")
    assert all(np.array_equal(r["y"], b["x"] * 2) for r, b in zip(stage.run_batch(batch), batch))
    assert calls == [5]


def test_a_call_never_holds_two_rows_of_one_stream_and_each_streams_rows_keep_their_order():
    """A stream's chunks queued together are computed in successive calls (a batch's float
    sums depend on its row count), while rows of other streams still share a call."""
    calls = []

    def compute(members):
        calls.append([(int(m.scalar("stream_id", -1)), int(m["x"][0])) for m in members])
        return [{"y": m["x"]} for m in members]

    rows = [(1, 0), (1, 1), (2, 0), (1, 2), (2, 1), (3, 0)]
    batch = [Inputs(stream_id=np.array([s], np.int64), x=np.array([k, 0, 0], np.float32)) for s, k in rows]
    results = run_in_groups(batch, shape, compute)
    assert calls == [[(1, 0), (2, 0), (3, 0)], [(1, 1), (2, 1)], [(1, 2)]]
    assert [int(r["y"][0]) for r in results] == [k for _, k in rows]
    # Rows without a stream id are streams of their own: one call, as before.
    calls.clear()
    run_in_groups([Inputs(x=np.zeros(3, np.float32)) for _ in range(4)], shape, compute)
    assert [len(c) for c in calls] == [4]
