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


def test_free_port_draws_only_from_this_process_slice():
    try:
        stack_module.set_port_slice(1, 2)
        low = stack_module._ephemeral_low()
        width = (low - 10000) // 2
        ports = [stack_module.free_port() for _ in range(50)]
        assert all(10000 + width <= p < 10000 + 2 * width for p in ports), ports
        assert len(set(ports)) == 50        # never the same twice in one process
        stack_module.set_port_slice(0, 2)
        assert all(10000 <= stack_module.free_port() < 10000 + width for _ in range(50))
    finally:
        stack_module.set_port_slice(0, 1)
    with pytest.raises(ValueError, match="port slice 2 of 2"):
        stack_module.set_port_slice(2, 2)


def test_every_collected_test_runs_in_its_stack_group_or_its_module_group(request):
    """The suite's own collection (tests/conftest.py): under `--dist loadgroup` each pooled
    server's tests must share one group, and no group may hold two servers' tests, or two
    workers would start the same server (or one would switch servers back and forth)."""
    from conftest import stack_key, group_of

    stacks_of_group: dict[str, set] = {}
    group_of_stack: dict[tuple, set] = {}
    for item in request.session.items:
        group, key = group_of(item), stack_key(item)
        stacks_of_group.setdefault(group, set()).add(key)
        if key is not None:
            group_of_stack.setdefault(key, set()).add(group)
        else:
            assert group == item.module.__name__, item.nodeid
    assert all(len(keys) == 1 for keys in stacks_of_group.values()), stacks_of_group
    assert all(len(groups) == 1 for groups in group_of_stack.values()), group_of_stack


def test_under_two_workers_each_group_runs_whole_on_one_worker():
    """`scripts/test.sh` runs `-n 2 --dist loadgroup`: the scheduler (tests/conftest.py) must
    hand each group to one worker. pytest-xdist's own loadgroup silently ran every test as a
    group of its own under pytest 9.2 (two workers started the same server)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                          "-v", str(tests / "test_kv_budget.py"), str(tests / "test_run_in_groups.py"),
                          "-k", "not two_workers"], capture_output=True, text=True, timeout=300, cwd=tests.parent)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    workers: dict[str, set] = {}
    for worker, module in re.findall(r"\[(gw\d)\] .*?PASSED tests/(\w+)\.py::", out.stdout):
        workers.setdefault(module, set()).add(worker)
    assert set(workers) == {"test_kv_budget", "test_run_in_groups"}, out.stdout[-3000:]
    assert all(len(w) == 1 for w in workers.values()), workers
