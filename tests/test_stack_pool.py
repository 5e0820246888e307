"""The test servers' pool (tritontts.testing.stack.StackPool) when a server's start fails:
the failed server is stopped, and later asks for the same server fail at once instead of
each waiting out another start. Fake stacks: what is checked is the pool's bookkeeping."""
from __future__ import annotations

import pytest

from tritontts.testing import stack as stack_module


class FakeStack:
    made: list["FakeStack"] = []
    fail = True

    def __init__(self, tmp, families, checkpoints, caches, extra_args=()):
        self.families, self.checkpoints = tuple(families), dict(checkpoints)
        self.abandoned = self.stopped = False
        self.session = None
        self.before = self.at_stop = set()
        FakeStack.made.append(self)

    def start(self):
        if FakeStack.fail:
            raise TimeoutError("tritonserver never became ready")
        return self

    def abandon(self):
        self.abandoned = True

    def terminate(self):
        pass

    def stop(self):
        self.stopped = True
        return 0

    def tail(self):
        return ""


@pytest.fixture
def pool(monkeypatch, tmp_path_factory, tmp_path):
    FakeStack.made, FakeStack.fail = [], True
    monkeypatch.setattr(stack_module, "Stack", FakeStack)
    monkeypatch.setattr(stack_module, "engine_processes", lambda session=None: set())
    pool = stack_module.StackPool(tmp_path_factory, tmp_path, {})
    monkeypatch.setattr(pool, "prepare", lambda families: None)
    return pool


def test_a_failed_start_stops_its_server_and_the_same_server_is_not_started_again(pool):
    with pytest.raises(TimeoutError):
        pool.get(("first",))
    assert len(FakeStack.made) == 1 and FakeStack.made[0].abandoned
    assert pool.live is None
    with pytest.raises(RuntimeError, match="start failed earlier.*never became ready"):
        pool.get(("first",))
    assert len(FakeStack.made) == 1         # no second start of the server that failed


def test_after_a_failed_start_another_server_still_starts(pool):
    with pytest.raises(TimeoutError):
        pool.get(("first",))
    FakeStack.fail = False
    live = pool.get(("second",))
    assert live.families == ("second",) and not live.abandoned
    assert pool.get(("second",)) is live        # reused, not restarted
    pool.close()
    assert live.stopped
