"""TritonPool (frontend/triton_pool.py) over scripted servers: least-loaded choice, failover
before the first chunk and not after, health in and out of the rotation, 503 when none
answers, and the pool behind the app's /health. The real thing, two tritonservers with one
killed mid-run, is tests/server/test_triton_pool_e2e.py."""
from __future__ import annotations

import asyncio

import pytest

from frontend.triton_client import StageRejected, TritonUnavailable
from frontend.triton_pool import TritonPool
from fake_triton import FakeTritonClient, run_async, serving


def pool_of(*fakes: FakeTritonClient, interval: float = 3600.0) -> TritonPool:
    by_url = {f"server{i}:8001": fake for i, fake in enumerate(fakes)}
    return TritonPool(list(by_url), health_interval_s=interval, client_factory=by_url.__getitem__)


async def drain(pool: TritonPool, request_id: str = "r") -> list:
    return [chunk async for chunk in pool.synthesize("piper", "Hi.", "", {}, request_id)]


@run_async
async def test_requests_go_to_the_least_loaded_healthy_server_and_spread_when_idle():
    gate = asyncio.Event()
    a, b = FakeTritonClient(gates={1: gate}), FakeTritonClient(gates={1: gate})
    pool = pool_of(a, b)
    held = [asyncio.ensure_future(drain(pool, f"held{i}")) for i in range(3)]
    while a.open_streams + b.open_streams < 3:
        await asyncio.sleep(0.01)
    # Three held open: two on one server and one on the other; the next goes to the one.
    assert sorted([a.open_streams, b.open_streams]) == [1, 2]
    lighter = a if a.open_streams == 1 else b
    before = len(lighter.calls)
    nxt = asyncio.ensure_future(drain(pool, "next"))
    while len(lighter.calls) == before:
        await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(*held, nxt)
    assert [s["in_flight"] for s in pool.state()] == [0, 0]
    assert sum(s["served"] for s in pool.state()) == 4
    await pool.close()


@run_async
async def test_an_unreachable_server_before_the_first_chunk_fails_over_and_leaves_the_rotation():
    dead = FakeTritonClient(errors={0: TritonUnavailable("StatusCode.UNAVAILABLE: connection refused")})
    alive = FakeTritonClient()
    pool = pool_of(dead, alive)
    for i in range(4):
        chunks = await drain(pool, f"r{i}")
        assert [c.index for c in chunks] == [0, 1, 2] and chunks[-1].final
    assert len(dead.calls) == 1          # tried once, then out of the rotation
    assert len(alive.calls) == 4
    assert alive.calls[0]["request_id"] == dead.calls[0]["request_id"] == "r0"
    state = {s["url"]: s for s in pool.state()}
    assert state["server0:8001"]["healthy"] is False
    assert "connection refused" in state["server0:8001"]["last_error"]
    await pool.close()


@run_async
async def test_after_the_first_chunk_a_dying_server_fails_the_request_instead_of_repeating_audio():
    dying = FakeTritonClient(errors={1: TritonUnavailable("StatusCode.UNAVAILABLE: gone")})
    other = FakeTritonClient()
    pool = pool_of(dying, other)
    pool._turn = iter([0] * 10)          # start on the dying server
    got = []
    with pytest.raises(TritonUnavailable):
        async for chunk in pool.synthesize("piper", "Hi.", "", {}, "r"):
            got.append(chunk.index)
    assert got == [0] and other.calls == []
    await pool.close()


@run_async
async def test_a_bad_request_is_not_retried_on_another_server():
    bad = FakeTritonClient(errors={0: StageRejected("speed must be > 0")})
    other = FakeTritonClient(errors={0: StageRejected("speed must be > 0")})
    pool = pool_of(bad, other)
    with pytest.raises(StageRejected):
        await drain(pool)
    assert len(bad.calls) + len(other.calls) == 1
    await pool.close()


@run_async
async def test_health_checks_take_a_server_out_and_back_in():
    a, b = FakeTritonClient(), FakeTritonClient()
    pool = pool_of(a, b, interval=0.02)
    a._server_ready = False
    await pool.check_health()
    assert [s["healthy"] for s in pool.state()] == [False, True]
    for i in range(3):
        await drain(pool, f"r{i}")
    assert len(a.calls) == 0 and len(b.calls) == 3
    a._server_ready = True
    await asyncio.sleep(0.1)              # the background loop notices
    assert [s["healthy"] for s in pool.state()] == [True, True]
    assert await pool.server_ready()
    await pool.close()
    assert a.closed and b.closed


@run_async
async def test_no_server_answering_is_unavailable_after_trying_each():
    down = [FakeTritonClient(errors={0: TritonUnavailable("refused")}) for _ in range(2)]
    pool = pool_of(*down)
    for fake in down:
        fake._server_ready = False
    assert not await pool.server_ready()
    with pytest.raises(TritonUnavailable, match="no tritonserver could take the request"):
        await drain(pool)
    assert [len(f.calls) for f in down] == [1, 1]     # tried anyway: one may be back
    await pool.close()


@run_async
async def test_voice_encoding_fails_over_too():
    dead = FakeTritonClient()
    dead.voice_errors["cosyvoice3_prompt"] = TritonUnavailable("refused")
    pool = pool_of(dead, FakeTritonClient())
    pool._turn = iter([0] * 10)
    features = await pool.encode_voice("cosyvoice3_prompt", {"ref_text": "x"})
    assert features.startswith(b"features of cosyvoice3_prompt")
    await pool.close()


@run_async
async def test_the_front_serves_through_a_pool_and_health_lists_each_server():
    a, b = FakeTritonClient(), FakeTritonClient()
    b._server_ready = False
    async with serving(pool_of(a, b)) as front:
        r = await front.speech(response_format="pcm")
        assert r.status_code == 200 and len(r.content) == 3 * 400 * 2
        health = (await front.http.get("/health")).json()
        assert health["server_ready"] is True
        assert [(s["url"], s["healthy"]) for s in health["tritonservers"]] == [
            ("server0:8001", True), ("server1:8001", False)]


def test_the_launcher_takes_several_comma_separated_triton_urls():
    from frontend.__main__ import parse_args

    assert parse_args(["--triton-url", "a:8001, b:9001"]).triton_url == ["a:8001", "b:9001"]
    with pytest.raises(SystemExit):
        parse_args(["--triton-url", "no-port"])


@run_async
async def test_a_dns_name_stands_for_every_address_it_resolves_to_followed_as_it_changes(monkeypatch):
    """What a Kubernetes headless Service gives: one name, one A record per ready pod."""
    records = {"triton-headless": ["10.0.0.1", "10.0.0.2"]}
    made: dict[str, FakeTritonClient] = {}

    async def getaddrinfo(host, port, type=0):
        return [(2, 1, 6, "", (ip, port)) for ip in records[host]]

    def make(url):
        made[url] = FakeTritonClient()
        return made[url]

    pool = TritonPool(["dns:triton-headless:8001"], health_interval_s=3600, client_factory=make)
    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", getaddrinfo)
    for i in range(4):
        await drain(pool, f"r{i}")
    assert sorted(made) == ["10.0.0.1:8001", "10.0.0.2:8001"]
    assert [len(f.calls) for f in made.values()] == [2, 2]
    records["triton-headless"] = ["10.0.0.2", "10.0.0.3"]      # scaled: one pod replaced
    await pool.check_health()
    assert sorted(s["url"] for s in pool.state()) == ["10.0.0.2:8001", "10.0.0.3:8001"]
    assert made["10.0.0.1:8001"].closed
    await pool.close()
