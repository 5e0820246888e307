"""A family served through tritonserver + the front on a checkpoint, measured the way every
family benchmark reports it: time to first audio (median) and real-time factor per stream
at each concurrency, streaming PCM (tritontts/families/<family>/benchmark.py)."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable


def measure_served(family: str, checkpoint_dir: Path, body: Callable[[int], dict[str, Any]],
                   concurrencies=(1, 4), stall_timeout: int | None = None,
                   warmup: dict[str, Any] | None = None,
                   request_timeout: int | None = None,
                   engine_args: dict[str, Any] | None = None) -> dict[int, dict[str, float]]:
    """Start a stack serving `family` on `checkpoint_dir`, send one warm-up request
    (`warmup` fields over body(0)), then at each concurrency n requests body(0..n-1) at
    once; prints and returns {n: {ttfa, audio_s, wall_s, rtf}}. `stall_timeout` raises
    the front's limit on a stage that sends nothing, `request_timeout` its limit on a whole
    request (a CPU at released size may need them); `engine_args` ({"STAGE.KEY": value})
    go to the launcher as --engine-arg (a released checkpoint's dtype or KV budget)."""
    import httpx

    from ..testing.stack import REPO, Stack

    tmp = REPO / ".cache" / f"bench-{family}"
    tmp.mkdir(parents=True, exist_ok=True)
    extra = (("--stall-timeout", str(stall_timeout)) if stall_timeout else ()) + (
        ("--request-timeout", str(request_timeout)) if request_timeout else ()) + tuple(
        part for key, value in (engine_args or {}).items()
        for part in ("--engine-arg", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"))
    stack = Stack(tmp, (family,), {family: checkpoint_dir}, extra_args=extra).start(timeout=1800)

    from ..families import FAMILIES

    # PCM comes at the family's own rate (the front resamples only when asked).
    rate = FAMILIES[family].capabilities.sample_rate

    def one(fields: dict[str, Any]):
        start, first, size = time.perf_counter(), None, 0
        request = {"model": family, "stream_format": "audio", "response_format": "pcm", **fields}
        with httpx.stream("POST", stack.url + "/v1/audio/speech", timeout=3600, json=request) as r:
            r.raise_for_status()
            for piece in r.iter_bytes():
                first = first or time.perf_counter() - start
                size += len(piece)
        return first, size / 2 / rate, time.perf_counter() - start

    results: dict[int, dict[str, float]] = {}
    try:
        one({**body(0), **(warmup or {})})
        for n in concurrencies:
            with ThreadPoolExecutor(n) as pool:
                start = time.perf_counter()
                runs = list(pool.map(lambda k: one(body(k)), range(n)))
                wall = time.perf_counter() - start
            audio = sum(r[1] for r in runs)
            ttfa = sorted(r[0] for r in runs)[len(runs) // 2]
            results[n] = {"ttfa": ttfa, "audio_s": audio, "wall_s": wall, "rtf": wall / audio * n}
            print(f"served, concurrency {n}: time to first audio (median) {ttfa:.2f} s, "
                  f"{audio:.1f} s of audio in {wall:.1f} s (RTF {wall / audio * n:.2f} "
                  f"per stream, {audio / wall:.2f} audio-s/s)", flush=True)
    finally:
        stack.stop()
    return results
