"""Two real tritonservers (Piper) behind one front (`--triton-url A,B`): requests spread
over both, and when one is killed mid-run (SIGKILL of its whole process group) no request
sent after the kill fails; /health reports the dead one and stays 200. A second front on
the same servers serves too (fronts share servers without coordinating)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tritontts.testing.audio import decode, rms
from tritontts.testing.stack import Stack, free_port, new_user_environment
from tritontts.deploy.tritonserver import TritonServer

SECONDS_BEFORE_KILL, SECONDS_AFTER_KILL = 6.0, 10.0
CLIENTS = 4
BODY = {"model": "piper", "input": "The server behind me may go away.", "response_format": "wav"}


@pytest.fixture(scope="module")
def servers(stacks, caches, tmp_path_factory):
    stacks.close()                 # one pooled stack at a time on this machine: none now
    tmp = tmp_path_factory.mktemp("pool")
    # Over this process's environment (what the launcher does with its own): only the run's
    # caches. A whole new user's environment as `env` replaced this venv's PATH entry that
    # tritontts.deploy.tritonserver.triton_env puts first, so the stub took the system
    # python3's prefix and could not import numpy; it passed only after other tests.
    caches_only = {k: v for k, v in new_user_environment(caches).items()
                   if k in ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITONTTS_CACHE")}
    started = [TritonServer(["piper"], free_port(), free_port(), free_port(),
                            env=caches_only, log_path=tmp / f"triton{i}.log").start()
               for i in range(2)]
    try:
        for server in started:
            server.wait_ready()
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def fronts(servers, caches, tmp_path_factory):
    urls = ",".join(s.grpc_url for s in servers)
    made = []
    try:
        for i in range(2):
            made.append(Stack(tmp_path_factory.mktemp(f"pool-front{i}"), ("piper",), {}, caches,
                              extra_args=("--triton-url", urls)).start())
        yield made
    finally:
        for front in made:
            front.stop()


def speak(url: str) -> tuple[int, float, str]:
    r = httpx.post(url + "/v1/audio/speech", json=BODY, timeout=120)
    if r.status_code != 200:
        return r.status_code, 0.0, r.text[:200]
    audio, rate = decode(r.content)
    return 200, audio.size / rate if rms(audio) > 1e-3 else 0.0, ""


def test_requests_spread_over_both_servers_and_a_second_front_shares_them(fronts):
    for front in fronts:
        for _ in range(4):
            status, seconds, error = speak(front.url)
            assert status == 200 and seconds > 1.0, error
    states = httpx.get(fronts[0].url + "/health", timeout=10).json()["tritonservers"]
    assert all(s["healthy"] for s in states)
    assert all(s["served"] >= 1 for s in states), states


def test_killing_one_server_mid_run_fails_no_request_sent_after_it(fronts, servers):
    front = fronts[0]
    kill_at = time.monotonic() + SECONDS_BEFORE_KILL
    stop_at = kill_at + SECONDS_AFTER_KILL
    results: list[tuple[float, float, int, float, str]] = []   # sent, done, status, audio s, error
    lock = threading.Lock()

    def client(_):
        while time.monotonic() < stop_at:
            sent = time.monotonic()
            status, seconds, error = speak(front.url)
            with lock:
                results.append((sent, time.monotonic(), status, seconds, error))

    def killer():
        time.sleep(max(0.0, kill_at - time.monotonic()))
        servers[0]._stopping = True          # not a stop(): a crash the supervisor must not undo
        servers[0]._kill_group()

    with ThreadPoolExecutor(CLIENTS + 1) as pool:
        pool.submit(killer)
        list(pool.map(client, range(CLIENTS)))
    assert servers[0].process.poll() is not None, "the server was not killed"
    after = [r for r in results if r[0] > kill_at]
    before = [r for r in results if r[1] < kill_at]
    assert len(before) >= CLIENTS and len(after) >= CLIENTS, (len(before), len(after))
    failed = [r for r in after if r[2] != 200 or r[3] <= 1.0]
    assert not failed, failed[:3]
    health = httpx.get(front.url + "/health", timeout=10)
    assert health.status_code == 200
    states = {s["url"]: s["healthy"] for s in health.json()["tritonservers"]}
    assert states == {servers[0].grpc_url: False, servers[1].grpc_url: True}
    print(f"{len(before)} requests before the kill, {len(after)} after, none failed; "
          f"{sum(1 for r in results if r[2] != 200)} failed in flight at the kill")
