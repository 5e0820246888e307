"""bf16 against fp32 speed in each family's vLLM stage at released size, served: the
family's released-size random checkpoint served alone with `--dtype float32`, then with
`--dtype bfloat16` (one server at a time: two do not fit), the same seeded requests to
each. The vLLM stage is driven directly over gRPC (the ensemble's steps up to it, as
tritontts.benchmark.dtype_drift does), so the numbers are the stage's own:

  frames/s alone     one request (after a warm-up one), its frames / its stage time
  frames/s at 4      four requests at once, all their frames / first start to last end

A dtype the machine cannot fit (fp32 weights too large) is that arm's row, with the
launcher's refusal. One round per dtype: the two arms run minutes apart on a quiet
machine, not interleaved, because a released stack takes a minute to start.

  .venv/bin/python -m tritontts.benchmark.dtype_speed [--families A,B] [--json OUT]

Not a test. The drift side (what bf16 changes in the output): tritontts.benchmark.dtype_drift.
"""
from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..families import FAMILIES
from .dtype_drift import engine_stages, engine_stream, frames, request

DTYPES = ("float32", "bfloat16")
AT_ONCE = 4


def stage_frames(url: str, family, primary: str, k: int) -> tuple[int, float, float]:
    """(frames, stage start, stage end) of request k through the family's vLLM stage."""
    text, params = request(k, family.name)
    timed: list = []
    _, responses = engine_stream(url, family, text, params, timed=timed)
    return len(frames(responses, primary)), *timed[0]


def measure_dtype(name: str, checkpoint: Path, work: Path, dtype: str) -> dict[str, Any]:
    from ..deploy.repository import STAGE_REPOSITORY, read_config
    from ..testing.stack import Stack
    from .released import started

    family = FAMILIES[name]
    primary = read_config(STAGE_REPOSITORY / engine_stages(family)[0] / "config.pbtxt").output[0].name
    work.mkdir(parents=True, exist_ok=True)
    stack = Stack(work, (name,), {name: checkpoint}, work / "caches", extra_args=("--dtype", dtype))
    try:
        _, refused = started(stack, timeout=3600)
        if refused is not None:            # does not fit, or failed: the arm's row says why
            return {"dtype": dtype, "refused": refused}
        stage_frames(stack.grpc_url, family, primary, 0)                     # warm-up
        n, start, end = stage_frames(stack.grpc_url, family, primary, 1)
        alone = {"frames": n, "seconds": end - start, "frames_per_s": n / (end - start)}
        with ThreadPoolExecutor(AT_ONCE) as pool:
            runs = list(pool.map(lambda k: stage_frames(stack.grpc_url, family, primary, k),
                                 range(2, 2 + AT_ONCE)))
        span = max(e for _, _, e in runs) - min(s for _, s, _ in runs)
        total = sum(n for n, _, _ in runs)
        together = {"frames": total, "seconds": span, "frames_per_s": total / span}
        row = {"dtype": dtype, "refused": None, "alone": alone, "at_once": together}
        print(f"{name} {dtype}: {row}", flush=True)
        return row
    finally:
        stack.stop()


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| family | vLLM stage | fp32 frames/s alone / at 4 | bf16 frames/s alone / at 4 | "
             "bf16/fp32 alone | bf16/fp32 at 4 |", "|---|---|---|---|---|---|"]

    def rate(arm: dict) -> str:
        if arm.get("refused"):
            return "does not start: " + arm["refused"][:160]
        return f"{arm['alone']['frames_per_s']:.2f} / {arm['at_once']['frames_per_s']:.2f}"

    for r in results:
        fp32, bf16 = r["arms"]["float32"], r["arms"]["bfloat16"]
        both = not fp32.get("refused") and not bf16.get("refused")
        ratio = (lambda key: f"{bf16[key]['frames_per_s'] / fp32[key]['frames_per_s']:.2f}x") if both \
            else (lambda key: "-")
        lines.append(f"| {r['family']} | {r['stage']} | {rate(fp32)} | {rate(bf16)} | "
                     f"{ratio('alone')} | {ratio('at_once')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from .batching import checkpoint_at
    from .report import machine

    p = argparse.ArgumentParser(prog="python -m tritontts.benchmark.dtype_speed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(n for n, f in FAMILIES.items() if engine_stages(f)))
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "tritontts-released")
    p.add_argument("--size", default="released", help="the writers' size (tiny: a quick check of this script)")
    p.add_argument("--work", type=Path, default=Path(".cache/benchmarks/dtype-speed"))
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    results = []
    for name in [n.strip() for n in args.families.split(",") if n.strip()]:
        checkpoint = checkpoint_at(name, args.size, args.cache)
        arms = {dtype: measure_dtype(name, checkpoint, args.work / name / dtype, dtype) for dtype in DTYPES}
        results.append({"family": name, "stage": engine_stages(FAMILIES[name])[0], "size": args.size,
                        "machine": machine(), "arms": arms})
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    print("\n" + table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
