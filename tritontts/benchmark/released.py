"""Released-size smoke benchmark: each family's random checkpoint at its released size (the
family's writer, size "released"; written once into --cache and reused; a family with no
writer serves the released weights it ships), served alone with
default flags on this machine, as a user would start it. Per family: whether it starts (and
the launcher's message if not), start-up cold (the first start on a new cache: exports,
engine builds) and warm (the same caches again), the stack's peak proportional set size,
time to first audio and real-time factor of one request, and whether 4 requests at once are
all served, with the KV capacity the talkers logged (4 full-length requests hold, so vLLM
never preempts them). Where a family takes `max_new_tokens`, requests are capped at 100
frames: random weights rarely stop on their own. Not a test: hours on a 2-core machine for every family.
Disk: the cache holds each checkpoint as released (2-12 GB each, about 62 GB for all eleven,
plus about 3 GB of exports and logs under its work/); delete a family's folder to reclaim it.

  .venv/bin/python -m tritontts.benchmark.released --families FAMILY,FAMILY \\
      --cache ~/.cache/tritontts-released --out docs/benchmarks/released

Writes results.json and report.md (a row per family, and per family and --launcher-arg flags)
into --out, keeping the rows not run this time. Nothing here names a
family: each takes part through its Family descriptor.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from ..families import FAMILIES
from .load import MAX_NEW_TOKENS, capped_bodies
from .report import machine

GIB = 2 ** 30
CONCURRENT = 4


def pss_bytes(pids) -> int:
    """Proportional set size of `pids` together (/proc/PID/smaps_rollup)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def stack_pids(stack) -> set[int]:
    """The launcher and every process of its tritonserver's session (the stage stubs)."""
    pids = {stack.proc.pid} if stack.proc else set()
    try:
        session = os.getsid(stack.tritonserver_pid())
    except (RuntimeError, OSError):
        return pids
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


class PeakPss:
    """The stack's peak PSS, sampled every second while it runs."""

    def __init__(self, stack):
        self.stack, self.peak, self._stop = stack, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(1.0):
            self.peak = max(self.peak, pss_bytes(stack_pids(self.stack)))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()


def started(stack, timeout: float) -> tuple[float | None, str | None]:
    """(seconds to /health, None), or (None, the launcher's reason) when it did not start."""
    began = time.monotonic()
    try:
        stack.start(timeout=timeout)
    except (RuntimeError, TimeoutError) as exc:
        lines = str(exc).splitlines()
        for pattern in ("did not start", "does not fit", "Error|error"):     # the launcher's own line first
            found = [line for line in lines if re.search(pattern, line)]
            if found:
                return None, found[-1][-1500:]
        return None, str(exc)[-500:]
    return time.monotonic() - began, None


def speak(url: str, body: dict[str, Any], rate: int) -> dict[str, Any]:
    began, first, size = time.perf_counter(), None, 0
    try:
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=3600) as r:
            status = r.status_code
            for piece in r.iter_bytes():
                first = first or time.perf_counter() - began
                size += len(piece)
    except httpx.HTTPError as exc:          # a raw-audio stream that failed mid-way is cut
        status = f"cut after {size} bytes ({type(exc).__name__})"
    wall = time.perf_counter() - began
    audio = size / 2 / rate if status == 200 else 0.0
    return {"status": status, "first_audio_s": first, "audio_s": audio, "wall_s": wall,
            "rtf": wall / audio if audio else None}


def logged_capacity(stack) -> dict[str, float]:
    log = stack.triton_log.read_text() if stack.triton_log.exists() else ""
    return {stage: float(n) for stage, n in re.findall(r"(\w+): the KV cache holds ([\d.]+) requests", log)}


def logged_preemptions(stack) -> int:
    """Times vLLM preempted a request for KV room in this stack (the engine host logs each)."""
    log = stack.triton_log.read_text() if stack.triton_log.exists() else ""
    return log.count("vLLM preempted request")


def measure(name: str, checkpoint: Path | None, work: Path, timeout: float,
            flags: tuple[str, ...] = ()) -> dict[str, Any]:
    """One family's row; `flags`: launcher flags beyond the defaults (recorded in the row)."""
    from ..testing.stack import Stack

    family = FAMILIES[name]
    rate = family.capabilities.sample_rate
    body = capped_bodies(name)
    caches = work / "caches"
    result: dict[str, Any] = {"family": name, "checkpoint": str(checkpoint) if checkpoint else "shipped",
                              "flags": list(flags), "machine": machine()}
    checkpoints = {name: checkpoint} if checkpoint else {}
    shutil.rmtree(work, ignore_errors=True)          # a cold start: no cache of an earlier run
    for folder in ("cold", "warm", "caches"):
        (work / folder).mkdir(parents=True, exist_ok=True)
    stack = Stack(work / "cold", (name,), checkpoints, caches, extra_args=flags)
    with PeakPss(stack) as peak:
        result["cold_start_s"], result["refused"] = started(stack, timeout)
        if result["refused"] is None:
            try:
                result["one"] = speak(stack.url, body(0), rate)
                with ThreadPoolExecutor(CONCURRENT) as pool:
                    runs = list(pool.map(lambda k: speak(stack.url, body(k), rate), range(1, CONCURRENT + 1)))
                result["concurrent"] = {"requests": CONCURRENT, "served": sum(r["status"] == 200 for r in runs),
                                        "wall_s": max(r["wall_s"] for r in runs)}
                result["kv_capacity"] = logged_capacity(stack)
                result["preemptions"] = logged_preemptions(stack)
            finally:
                stack.stop()
    result["peak_pss_gib"] = round(peak.peak / GIB, 2)
    if result["refused"] is None:
        warm = Stack(work / "warm", (name,), checkpoints, caches, extra_args=flags)
        result["warm_start_s"], again = started(warm, timeout)
        warm.stop()
        if again:
            result["warm_refused"] = again
    return result


def report(results: list[dict[str, Any]]) -> str:
    lines = ["# Released-size random checkpoints, each served alone with default flags", "",
             f"Requests: the load benchmark's texts, seeded, streamed as PCM; capped at {MAX_NEW_TOKENS} frames "
             "(max_new_tokens) where the family takes it. A family's row is from its own run, on the machine "
             "it names (2 cores, 24 GiB each).", "",
             "| family | measured | starts | cold start | warm start | peak PSS | first audio | RTF (1) | "
             f"{CONCURRENT} at once | KV holds (requests) | preempted |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        family = r["family"] + (f" (`{' '.join(r['flags'])}`)" if r.get("flags") else "")
        on = r.get("machine") or {}
        family += f" | {on.get('date', '?')}, {on.get('cpu', '?')}, {on.get('commit', '?')}"
        if r["refused"]:
            lines.append(f"| {family} | no: {r['refused'].replace('|', '/')} | | | {r['peak_pss_gib']} GiB "
                         "| | | | | |")
            continue
        one, many = r["one"], r["concurrent"]
        first = f"{one['first_audio_s']:.2f} s" if one["first_audio_s"] else "-"
        rtf = f"{one['rtf']:.2f}" if one["rtf"] else f"HTTP {one['status']}"
        kv = ", ".join(f"{s}: {c:.2f}" for s, c in sorted(r["kv_capacity"].items())) or "-"
        warm = f"{r['warm_start_s']:.0f} s" if r.get("warm_start_s") else r.get("warm_refused", "-")
        preempted = r.get("preemptions", "-")
        lines.append(f"| {family} | yes | {r['cold_start_s']:.0f} s | {warm} | {r['peak_pss_gib']} GiB | "
                     f"{first} | {rtf} | {many['served']}/{many['requests']} in {many['wall_s']:.1f} s | {kv} | "
                     f"{preempted} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tritontts.benchmark.released", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES),
                   help="a family without a random checkpoint writer is served from the checkpoint it ships")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "tritontts-released",
                   help="where the released-size checkpoints are written once and reused")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks/released"))
    p.add_argument("--size", default="released", help="the writers' size (tiny: a quick check of this script)")
    p.add_argument("--start-timeout", type=float, default=3600.0)
    p.add_argument("--launcher-arg", action="append", default=[], metavar="ARG",
                   help="a launcher flag beyond the defaults (repeatable; the row says so), e.g. "
                        "--launcher-arg=--request-timeout --launcher-arg=3600")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.families.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        p.error(f"unknown families: {', '.join(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    # Earlier rows are kept until this run measures their family again (a run stopped half-way
    # keeps the rows it did not reach): one report for runs made family by family.
    kept = args.out / "results.json"
    results = json.loads(kept.read_text()) if kept.exists() else []
    from .batching import checkpoint_at

    for name in names:
        # a family without a writer serves the released weights it ships
        checkpoint = checkpoint_at(name, args.size, args.cache) if FAMILIES[name].write_random_checkpoint else None
        print(f"{name}: serving {checkpoint or 'the checkpoint it ships'}", flush=True)
        row = measure(name, checkpoint, args.cache / "work" / name, args.start_timeout, tuple(args.launcher_arg))
        # one row per family and flags: a run with extra flags keeps the default-flags row
        results = [r for r in results if (r["family"], r.get("flags", [])) != (name, row["flags"])] + [row]
        print(json.dumps(results[-1]), flush=True)
        results.sort(key=lambda r: (list(FAMILIES).index(r["family"]), len(r.get("flags", []))))
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        (args.out / "report.md").write_text(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
