"""Admission: 429 past max_in_flight, and the slot (with the in-flight gauge) freed however
a request ends: done, failed mid-stream, or abandoned by its client."""
from __future__ import annotations

import asyncio

import pytest
from fake_triton import FakeTritonClient, in_flight_gauge, run_async, serving

from frontend.triton_client import StageFailed, _classify


@run_async
async def test_request_past_max_in_flight_is_429_with_retry_after():
    release = asyncio.Event()
    async with serving(FakeTritonClient(gates={0: release}), max_in_flight=1) as front:
        held = asyncio.create_task(front.speech())
        await front.fake.waiting.wait()
        r = await front.speech()
        release.set()
        await held
    assert r.status_code == 429 and r.headers["retry-after"] == "1"


@run_async
async def test_slot_and_gauge_are_taken_while_served_and_freed_after_completion():
    release = asyncio.Event()
    baseline = in_flight_gauge()
    async with serving(FakeTritonClient(gates={1: release})) as front:
        held = asyncio.create_task(front.speech())
        await front.fake.waiting.wait()
        during = front.admission.in_flight, in_flight_gauge() - baseline
        release.set()
        assert (await held).status_code == 200
        after = front.admission.in_flight, in_flight_gauge() - baseline
    assert during == (1, 1) and after == (0, 0)


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
@run_async
async def test_slot_and_gauge_are_freed_after_a_mid_stream_failure(stream_format):
    baseline = in_flight_gauge()
    fake = FakeTritonClient(errors={1: StageFailed("vocoder exploded")})
    async with serving(fake) as front:
        exchange = front.exchange(stream=True, stream_format=stream_format)
        await exchange.outcome()
        assert (front.admission.in_flight, in_flight_gauge() - baseline) == (0, 0)


@run_async
async def test_client_disconnect_mid_stream_frees_the_slot_and_cancels_the_triton_stream():
    baseline = in_flight_gauge()
    fake = FakeTritonClient(gates={1: asyncio.Event()})  # never opened: the stream stalls
    async with serving(fake) as front:
        exchange = front.exchange(stream=True)
        assert (await exchange.message())["type"] == "http.response.start"
        assert (await exchange.message())["body"]  # the first chunk went out
        await fake.waiting.wait()
        exchange.disconnect()
        await exchange.outcome()
        assert (front.admission.in_flight, in_flight_gauge() - baseline) == (0, 0)
        assert fake.cancelled == 1 and fake.open_streams == 0


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
@run_async
async def test_client_gone_before_the_body_starts_frees_the_slot_and_cancels_the_triton_stream(
        spec_version):
    """The headers are stuck on their way to a client that stopped reading, then it leaves:
    the body never starts, so only the response itself can free what the request holds."""
    baseline = in_flight_gauge()
    fake = FakeTritonClient(gates={1: asyncio.Event()})
    async with serving(fake) as front:
        exchange = front.exchange(spec_version, stall=True, stream=True)
        await exchange.stalled.wait()
        exchange.disconnect()
        await exchange.outcome()
        assert exchange.drained() == []  # not even the headers were sent
        assert (front.admission.in_flight, in_flight_gauge() - baseline) == (0, 0)
        assert fake.cancelled == 1 and fake.open_streams == 0


@run_async
async def test_a_model_at_its_own_bound_is_429_naming_it_while_others_are_served():
    gate = asyncio.Event()
    fake = FakeTritonClient(gates={0: gate})
    clone = {"model": "cosyvoice3", "ref_audio": "UklGRg==", "ref_text": "x"}
    async with serving(fake, ["piper", "cosyvoice3"], max_in_flight_per_model={"cosyvoice3": 1}) as front:
        held = asyncio.create_task(front.speech(**clone))
        await fake.waiting.wait()
        refused = await front.speech(**clone)
        gate.set()     # the piper request below passes the gate at once
        other = await front.speech(model="piper")
        assert (await held).status_code == 200
        assert front.admission.model_in_flight == {"cosyvoice3": 0, "piper": 0}
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert "cosyvoice3 has 1 requests in flight" in refused.json()["error"]["message"]
    assert other.status_code == 200


@run_async
async def test_a_full_stage_queue_is_429_with_retry_after():
    busy = _classify("[StatusCode.UNAVAILABLE] Exceeds maximum queue size")
    async with serving(FakeTritonClient(errors={0: busy})) as front:
        r = await front.speech()
    assert r.status_code == 429 and r.headers["retry-after"] == "1"


@run_async
async def test_a_stream_whose_next_chunk_never_comes_fails_at_the_stall_bound():
    from frontend.triton_client import StageStalled, _bounded

    async def stalls():
        yield "first"
        await asyncio.Event().wait()     # a stage that died: nothing ever comes

    got = []
    with pytest.raises(StageStalled, match="no audio for 0.2 s"):
        async for item in _bounded(stalls(), 0.2):
            got.append(item)
    assert got == ["first"]

    async def flat():               # the server says its stages executed nothing meanwhile
        return 7

    with pytest.raises(StageStalled, match="none of its stages executed"):
        async for item in _bounded(stalls(), 0.2, flat):
            pass


@run_async
async def test_a_stream_queued_behind_other_work_waits_past_the_stall_bound_while_its_stages_execute():
    from frontend.triton_client import _bounded

    async def slow():
        yield "first"
        await asyncio.sleep(0.7)         # three stall bounds: other requests' work goes first
        yield "second"

    executions = iter(range(100))

    async def busy():                    # each look finds more finished executions
        return next(executions)

    got = [item async for item in _bounded(slow(), 0.2, busy)]
    assert got == ["first", "second"]
