"""run_in_groups (tritontts.serving.stage): the dynamic batcher's requests of equal key
computed in one call, a failure kept to the request that fails."""
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
