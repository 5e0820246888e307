"""tritonserver killed (SIGKILL) mid-stream: the stream in flight ends with an error the
client sees, new requests get 503 while it is down, what the dead server left (its Python
stubs) is killed, the launcher brings tritonserver back, and the front serves again by
itself."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import httpx
import pytest

from tritontts.testing.audio import decode, rms
from tritontts.testing.stack import Stack

TEXT = " ".join(["A sentence that keeps the stream busy for a little while."] * 10)


def group_members(pgid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def sse_killing_after_the_first_event(url: str, pid: int) -> list[dict]:
    """A long SSE request's events; `pid` is SIGKILLed once the first has arrived."""
    events = []
    with httpx.stream("POST", url + "/v1/audio/speech", timeout=120,
                      json={"input": TEXT, "stream": True, "response_format": "pcm"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if len(events) == 1:
                    os.kill(pid, signal.SIGKILL)
    return events


@pytest.fixture
def own_stack(stacks, caches, tmp_path):
    stacks.close()      # one server at a time; this one gets killed
    stack = Stack(tmp_path, ("piper",), {}, caches, extra_args=("--stall-timeout", "10")).start()
    yield stack
    assert stack.stop() == 0, stack.tail()


def test_killed_tritonserver_cuts_the_stream_with_an_error_then_comes_back(own_stack):
    url = own_stack.url
    pid = own_stack.tritonserver_pid()
    before = group_members(pid)
    assert len(before) > 1, "the stub processes run in tritonserver's process group"
    events = sse_killing_after_the_first_event(url, pid)
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["type"] == "speech.audio.error" and events[-1]["error"]["partial_audio"], events[-1]

    down = httpx.post(url + "/v1/audio/speech", json={"input": "Hello."}, timeout=60)
    assert down.status_code == 503 and down.headers["retry-after"], down.text
    killed = time.monotonic()
    deadline = killed + 240
    while time.monotonic() < deadline and httpx.get(url + "/health", timeout=5).status_code != 200:
        time.sleep(1)
    print(f"healthy again {time.monotonic() - killed:.0f} s after the kill")
    assert httpx.get(url + "/health", timeout=5).status_code == 200, own_stack.tail()
    assert group_members(pid) == set(), "the dead server's stubs still run"
    assert own_stack.tritonserver_pid() != pid
    again = httpx.post(url + "/v1/audio/speech", json={"input": "Back again.", "response_format": "wav"},
                       timeout=120)
    audio, rate = decode(again.content)
    assert again.status_code == 200 and rate == 22050 and rms(audio) > 0.02


def stage_stub(stack, model: str) -> int:
    """The pid of a stage model's Python stub (its arguments name the model's folder)."""
    for pid in group_members(stack.tritonserver_pid()):
        try:
            args = open(f"/proc/{pid}/cmdline").read().split("\0")
        except OSError:
            continue
        if any(a.endswith(f"/{model}/1/model.py") for a in args):
            return pid
    raise AssertionError(f"no stub runs {model}")


def test_a_stage_that_dies_mid_stream_ends_the_stream_with_an_error_and_is_replaced(own_stack):
    """Triton never answers the requests a dead stub held, and the model stays unusable
    ("Stub process is not healthy"): the launcher sees the stage process gone and restarts
    tritonserver, which ends the stream with an error at once (the front's stall bound,
    --stall-timeout, 10 s here, would end it otherwise), and the server serves again."""
    url = own_stack.url
    stub = stage_stub(own_stack, "piper_vits")
    started = time.monotonic()
    events = sse_killing_after_the_first_event(url, stub)
    ended = time.monotonic() - started
    print(f"the stream ended {ended:.1f} s after it began; last event {events[-1]['type']}")
    assert events[-1]["type"] == "speech.audio.error", events[-1]
    assert ended < 60
    # The launcher sees the stage process gone and restarts tritonserver; it serves again.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        again = httpx.post(url + "/v1/audio/speech", json={"input": "Back again.", "response_format": "wav"},
                           timeout=120)
        if again.status_code == 200:
            break
        time.sleep(2)
    audio, rate = decode(again.content)
    assert again.status_code == 200 and rate == 22050 and rms(audio) > 0.02
    assert stage_stub(own_stack, "piper_vits") != stub
    # The launcher's log names the stage that died and how (here: our SIGKILL).
    assert (f"stage process {stub} (the stub of model piper_vits) was killed by signal 9 (SIGKILL"
            in own_stack.log.read_text()), own_stack.tail()
