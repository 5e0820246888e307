"""Batched compute on vs off, per stage, at each family's sizes (random weights): for
batch sizes 1 / 4 / 8 the same requests run as one `run_batch` call (what the stage does
with a batch Triton's dynamic batcher hands it) and one `run` after another (what it did
before it computed batches together), side by side, rounds alternating the arms so the
machine's drift hits both. Requests/s and audio-s/s per arm and their ratio.

  .venv/bin/python -m tritontts.benchmark.batching [--families A,B] [--size released]
      [--cache ~/.cache/tritontts-released] [--device cpu] [--json OUT]
  .venv/bin/python -m tritontts.benchmark.batching --served [--families A,B] [--size tiny]
      [--concurrency 8] [--seconds 30] [--rounds 2] [--one-at-a-time] [--json OUT]

--served: the same checkpoint served twice, every batched stage computing Triton's batches
whole (on: max_rows_per_call 0) and row by row (off: 1), the same closed-loop load at
--concurrency through the front on each in turn, arms alternating per round; audio-s/s and
time to first audio per arm. Side by side (both servers up, idle while the other is
measured) unless --one-at-a-time (released sizes that do not fit twice: each arm started in
turn).

A family takes part through its descriptor's `batch_cases`: each BatchCase names a stage,
loads it with its config.pbtxt's parameters (the served threads) and makes its k-th request
at streaming shapes. The released-size checkpoints are the ones tritontts.benchmark.released
writes (written here too if missing). scripts/gpu_check.py runs the same table on a GPU.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from ..families import FAMILIES
from ..family import BatchCase
from ..serving.stage import Stage, StageContext

BATCHES = (1, 4, 8)


# One `parameters { key: "K" value: { string_value: "V" } }` entry of a config.pbtxt.
PARAMETER = re.compile(r'parameters\s*\{\s*key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}\s*\}')


def config_parameters(config_pbtxt: Path) -> dict[str, str]:
    """A config.pbtxt's parameters, read without tritonclient's protobuf classes (the GPU
    images the PyTorch tier runs on have none; tests check it reads what read_config reads)."""
    return dict(PARAMETER.findall(config_pbtxt.read_text()))


def stage_context(stage: str, checkpoint_root: Path, device: str = "cpu") -> StageContext:
    """The stage's context as Triton gives it: config.pbtxt's parameters (threads, runtime),
    with no cap on the rows of one call."""
    from ..deploy.tritonserver import STAGE_REPOSITORY

    parameters = config_parameters(STAGE_REPOSITORY / stage / "config.pbtxt")
    parameters["max_rows_per_call"] = "0"     # "on" computes the whole batch whatever the config caps
    return StageContext(stage, STAGE_REPOSITORY / stage, parameters=parameters, device=device)


def timed(fn: Callable[[], Any], device: str) -> float:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure_case(case: BatchCase, stage: Stage, device: str = "cpu", batches=BATCHES,
                 rounds: int = 3) -> list[dict[str, Any]]:
    """Rows per batch size: seconds per batch on (run_batch) and off (run one by one)."""
    stage.run(case.request(0))                      # the first call sets up (and raises if it fails)
    rows = []

    def together(requests):
        failed = [r for r in stage.run_batch(requests) if isinstance(r, Exception)]
        if failed:
            raise RuntimeError(f"{case.stage}: a benchmark request failed: {failed[0]}")

    for size in batches:
        requests = [case.request(k) for k in range(size)]
        arms = {"on": lambda: together(requests), "off": lambda: [stage.run(r) for r in requests]}
        seconds: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(rounds):
            for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
                seconds[name].append(timed(arms[name], device))
        row = {"stage": case.stage, "shape": case.shape, "batch": size}
        for name, values in seconds.items():
            wall = statistics.median(values)
            row[name] = {"s_per_batch": wall, "requests_per_s": size / wall,
                         "audio_s_per_s": size * case.audio_seconds / wall}
        row["ratio"] = row["off"]["s_per_batch"] / row["on"]["s_per_batch"]
        rows.append(row)
        print(f"{case.stage} batch {size}: on {row['on']['requests_per_s']:.2f} req/s, off "
              f"{row['off']['requests_per_s']:.2f} req/s (x{row['ratio']:.2f})", flush=True)
    return rows


def checkpoint_at(name: str, size: str, cache: Path) -> Path:
    """`name`'s random checkpoint at `size` in `cache`, written once (in a child process:
    a writer leaves GBs of freed tensors in the process's heap, which at released size took
    5 GB from the stacks a benchmark then measured) and reused."""
    import os
    import subprocess
    import sys

    path, written = cache / f"{name}-{size}", cache / f"{name}-{size}.written"
    if not written.exists():
        began = time.monotonic()
        code = ("import sys; from tritontts.families import FAMILIES; "
                "FAMILIES[sys.argv[1]].write_random_checkpoint(sys.argv[2], size=sys.argv[3])")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        subprocess.run([sys.executable, *(["-S"] if sys.flags.no_site else []), "-c", code, name, str(path), size],
                       check=True, env=env)
        written.write_text(f"{time.monotonic() - began:.0f} s\n")
    return path


def measure_family(name: str, checkpoint_path: Path, device: str = "cpu", batches=BATCHES,
                   rounds: int = 3) -> list[dict[str, Any]]:
    family = FAMILIES[name]
    checkpoint = family.open_checkpoint(checkpoint_path)
    rows = []
    for case in family.batch_cases(checkpoint):
        stage = case.load(stage_context(case.stage, checkpoint_path, device))
        rows += [{"family": name, **row} for row in measure_case(case, stage, device, batches, rounds)]
        del stage
    return rows


def served_arm(name: str, checkpoint: Path, rows_per_call: int, work: Path, size: str):
    """A stack serving `name` on `checkpoint` with every GroupedStage computing at most
    `rows_per_call` rows per call (0: a batch whole)."""
    from ..serving.stage import MAX_ROWS_PER_CALL_ENV
    from ..testing.stack import TINY_KV_REQUESTS, Stack

    work.mkdir(parents=True, exist_ok=True)
    # tiny talkers' KV holds every request at once; released ones take the launcher's default
    kv = ("--kv-requests", str(TINY_KV_REQUESTS)) if size == "tiny" else ()
    stack = Stack(work, (name,), {name: checkpoint}, work / "caches",
                  extra_args=("--request-timeout", "3600", *kv))
    stack.env[MAX_ROWS_PER_CALL_ENV] = str(rows_per_call)
    return stack


def measure_served_family(name: str, checkpoint: Path, work: Path, size: str, concurrency: int,
                          seconds: float, rounds: int, one_at_a_time: bool) -> dict[str, Any]:
    """{arm: [level summaries]} for batching on and off, the arms alternating per round."""
    import asyncio

    from .load import run_level
    from .load import capped_bodies

    rate = FAMILIES[name].capabilities.sample_rate
    body = capped_bodies(name)
    arms = {"on": served_arm(name, checkpoint, 0, work / "on", size),
            "off": served_arm(name, checkpoint, 1, work / "off", size)}
    results: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    try:
        if not one_at_a_time:
            for stack in arms.values():
                stack.start(timeout=3600)
        for r in range(rounds):
            for arm in (("on", "off") if r % 2 == 0 else ("off", "on")):
                stack = arms[arm]
                if one_at_a_time:
                    stack.start(timeout=3600)
                try:
                    asyncio.run(run_level(stack.url + "/v1/audio/speech", body, rate, 1, 1.0))   # warm-up
                    level = asyncio.run(run_level(stack.url + "/v1/audio/speech", body, rate, concurrency,
                                                  seconds, timeout=3600)).summary()
                finally:
                    if one_at_a_time:
                        stack.stop()
                results[arm].append(level)
                print(f"{name} {arm} round {r}: {level['audio_s_per_s']:.3f} audio-s/s, TTFA p50 "
                      f"{level['ttfa_p50']:.2f} s, {level['ok']}/{level['requests']} ok", flush=True)
    finally:
        for stack in arms.values():
            stack.stop()
    return {"family": name, "size": size, "concurrency": concurrency, "seconds": seconds, **results}


def served_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| family | size | c | on: audio-s/s | off: audio-s/s | on / off | on: TTFA p50 | off: TTFA p50 | "
             "requests ok (on, off) |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        def mean(arm, key):
            return statistics.mean(level[key] for level in r[arm])

        def ok(arm):
            return f"{sum(lv['ok'] for lv in r[arm])}/{sum(lv['requests'] for lv in r[arm])}"

        lines.append(f"| {r['family']} | {r['size']} | {r['concurrency']} | {mean('on', 'audio_s_per_s'):.3g} | "
                     f"{mean('off', 'audio_s_per_s'):.3g} | "
                     f"{mean('on', 'audio_s_per_s') / mean('off', 'audio_s_per_s'):.2f} | "
                     f"{mean('on', 'ttfa_p50'):.2f} s | {mean('off', 'ttfa_p50'):.2f} s | {ok('on')}, {ok('off')} |")
    return "\n".join(lines) + "\n"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| stage | request | batch | on: req/s | on: audio-s/s | off: req/s | off: audio-s/s | on / off |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['shape']} | {r['batch']} | {r['on']['requests_per_s']:.3g} | "
                     f"{r['on']['audio_s_per_s']:.3g} | {r['off']['requests_per_s']:.3g} | "
                     f"{r['off']['audio_s_per_s']:.3g} | {r['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tritontts.benchmark.batching", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(n for n, f in FAMILIES.items() if f.batch_cases))
    p.add_argument("--size", default="released")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "tritontts-released")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--json", type=Path)
    p.add_argument("--served", action="store_true", help="served on vs off through the front (see above)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--one-at-a-time", action="store_true")
    p.add_argument("--work", type=Path, default=Path(".cache/benchmarks/batching-served"))
    args = p.parse_args(argv)
    names = [n.strip() for n in args.families.split(",") if n.strip()]
    missing = [n for n in names if n not in FAMILIES or not FAMILIES[n].batch_cases]
    if missing:
        p.error(f"no batch cases for {', '.join(missing)}")
    batches = tuple(int(b) for b in args.batches.split(","))
    rows = []
    if args.served:
        for name in names:
            rows.append(measure_served_family(name, checkpoint_at(name, args.size, args.cache),
                                              args.work / name, args.size, args.concurrency, args.seconds,
                                              args.rounds, args.one_at_a_time))
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
        print("\n" + served_table(rows))
        return 0
    for name in names:
        rows += measure_family(name, checkpoint_at(name, args.size, args.cache), args.device, batches, args.rounds)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    print("\n" + table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
