"""Talker benchmarks at equal CPU threads: each arm (vLLM, the reference's generate) runs in
a fresh process of its own with the same thread count.

Why a process each: vLLM's CPU worker picks its own threads. By default it reserves one
core for its scheduler and pins its compute threads to the rest (on 2 cores: 1 thread on
core 0, whatever OMP_NUM_THREADS says), and it makes torch.set_num_threads a no-op in its
process, so an arm run after it in the same process gets whatever vLLM left. An arm's
process gets OMP_NUM_THREADS=n and VLLM_CPU_OMP_THREADS_BIND=0-(n-1) (vLLM binds exactly
those cores), calls `enter_arm()` (torch's threads for a non-vLLM arm) and prints one JSON
line, which includes the threads torch really ran with.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


def arm_environment(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads),
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}"}


def enter_arm() -> int:
    """In an arm's process, before any work: torch's intra-op threads = OMP_NUM_THREADS."""
    import torch

    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    return threads


def report_arm(result: dict[str, Any]) -> None:
    """An arm's last output line: its numbers plus the threads torch ran with."""
    import torch

    print(json.dumps({**{str(k): v for k, v in result.items()},
                      "torch_threads": torch.get_num_threads()}), flush=True)


def run_arm(script: Path, arm: str, threads: int, args: list[str]) -> dict[str, Any]:
    """`python script --arm ARM *args` at `threads` threads; its JSON line."""
    out = subprocess.run([sys.executable, str(script), "--arm", arm, *args],
                         env=arm_environment(threads), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{arm} arm failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["torch_threads"] != threads:
        raise RuntimeError(f"{arm} ran with {result['torch_threads']} threads, not {threads}")
    return result


def compare_talker_arms(script: Path, arm_args: list[str], threads: str, unit: str) -> None:
    """The talker table every family benchmark prints: for each thread count, the vLLM arm
    and the reference arm (`script --arm vllm|reference *arm_args`), batch 1 and 8."""
    print(f"| threads | batch | vLLM {unit}/s | reference {unit}/s | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for n in (int(v) for v in threads.split(",")):
        got = {arm: run_arm(script, arm, n, arm_args) for arm in ("vllm", "reference")}
        for batch in ("1", "8"):
            v, r = got["vllm"][batch], got["reference"][batch]
            print(f"| {n} | {batch} | {v:.2f} | {r:.2f} | {v / r:.2f}× |", flush=True)


@dataclass(frozen=True)
class TalkerBenchmark:
    """What a family's talker benchmark script (scripts/benchmark_<family>.py) differs in; the
    command line, the arms in processes of their own, the table and the serving run are
    `talker_benchmark_main`'s."""
    script: Path                                  # the script itself (arms re-run it)
    doc: str
    open_checkpoint: Callable[[Path], Any]
    arms: dict[str, Callable[[Any, int], dict]]    # "vllm" / "reference": (checkpoint, work) -> {batch: rate}
    work: str                                     # the per-request work option: "tokens", "frames"
    work_default: int
    work_help: str
    unit: str                                     # the table's rate unit
    released: Callable[[], Path]                  # the released-size random checkpoint, written once
    serve: Callable[[Path, int], None]            # (checkpoint, work) -> the served measurement
    threads: str = "2"


def talker_benchmark_main(bench: TalkerBenchmark) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=bench.doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument(f"--{bench.work}", type=int, default=bench.work_default, help=bench.work_help)
    parser.add_argument("--skip-talker", action="store_true")
    parser.add_argument("--skip-serving", action="store_true")
    parser.add_argument("--threads", default=bench.threads, help="CPU threads per talker arm (comma-separated)")
    parser.add_argument("--arm", choices=tuple(bench.arms), help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = getattr(args, bench.work)
    if args.arm:                         # one arm, in a process of its own
        enter_arm()
        report_arm(bench.arms[args.arm](bench.open_checkpoint(args.checkpoint), work))
        return
    root = args.checkpoint or bench.released()
    if not args.skip_talker:
        print(f"talker, {work} {bench.work} per request")
        compare_talker_arms(bench.script, ["--checkpoint", str(root), f"--{bench.work}", str(work)],
                            args.threads, bench.unit)
    if not args.skip_serving:
        bench.serve(root, work)
