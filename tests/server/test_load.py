"""Load: 64 concurrent streaming clients for a bounded time, on Piper (real voice) and on a
tiny talker family (Qwen3-TTS): no stream lost or cut, every stream's audio complete and
decodable, and the memory of every server process reported before and after.

Piper is deterministic for a seed, so each stream must equal the same request served
alone, byte for byte. A talker's sampled frames may differ under batching, so there each
stream must hold exactly the frames it asked for (random weights never stop early)."""
from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tritontts.testing.audio import pcm16, rms

CONCURRENCY = 64
SECONDS = float(os.environ.get("TRITONTTS_LOAD_SECONDS", "10"))

CASES = {
    "piper": {"model": "piper", "input": "Every stream must arrive whole. Nothing may be lost.",
              "seed": 4},
    "qwen3_tts": {"model": "qwen3_tts", "input": "Every stream must arrive whole.",
                  "max_new_tokens": 8, "seed": 4},
}


def rss_by_process(stack) -> dict[str, int]:
    """Resident memory (bytes) of the launcher/front and every process of tritonserver's group."""
    pids = {"front": stack.proc.pid}
    group = subprocess.run(["pgrep", "-g", str(stack.tritonserver_pid())], capture_output=True, text=True)
    for pid in group.stdout.split():
        try:
            args = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        except OSError:
            continue
        # A stub's arguments name its model's folder; else the program.
        model = next((Path(a).parent.parent.name for a in args if a.endswith("/model.py")), None)
        pids[f"{pid} {model or Path(args[0]).name}"] = int(pid)
    out = {}
    for name, pid in pids.items():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        out[name] = kb * 1024
    return out


def stack_for(params):
    """The stack a test of this module runs on (tests/conftest.py groups tests by it)."""
    return (params["family"],), None


@pytest.mark.parametrize("family", list(CASES))
def test_64_streams_for_a_while_lose_nothing(stacks, family):
    stack = stacks.get((family,))
    body = {**CASES[family], "response_format": "pcm", "stream_format": "audio"}
    alone = httpx.post(stack.url + "/v1/audio/speech", json={**body, "stream_format": None},
                       timeout=300)
    assert alone.status_code == 200, alone.text
    before = rss_by_process(stack)
    deadline = time.monotonic() + SECONDS

    def client(_):
        results = []
        with httpx.Client(timeout=600) as http:
            while time.monotonic() < deadline:
                with http.stream("POST", stack.url + "/v1/audio/speech", json=body) as r:
                    results.append((r.status_code, b"".join(r.iter_bytes())))
        return results

    start = time.monotonic()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = [item for batch in pool.map(client, range(CONCURRENCY)) for item in batch]
    wall = time.monotonic() - start
    after = rss_by_process(stack)
    statuses = {}
    for status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    print(f"\n{family}: {len(results)} streams at c={CONCURRENCY} in {wall:.0f} s; statuses {statuses}")
    for name in sorted(before):
        if name in after:
            print(f"  RSS {name[:60]:60s} {before[name] / 2**20:8.1f} -> {after[name] / 2**20:8.1f} MiB")
    assert statuses == {200: len(results)} and len(results) >= CONCURRENCY
    for _, audio in results:
        if family == "piper":
            assert audio == alone.content, "a stream under load differs from the same request alone"
        else:
            assert len(audio) == len(alone.content) and rms(pcm16(audio)) > 0
    assert httpx.get(stack.url + "/health").status_code == 200
