"""The benchmark command: streaming load through the OpenAI front at each concurrency level,
plus perf_analyzer on each ensemble and stage; results.json, report.md and PNG plots.

  # start a server for the families (tiny random checkpoints where a family needs one):
  .venv/bin/python -m tritontts.benchmark --families piper,cosyvoice3 --random-checkpoints
  # or a server that is already running (its front and its Triton gRPC port):
  .venv/bin/python -m tritontts.benchmark --url http://127.0.0.1:8091 --grpc-url localhost:8001

Every served family takes part through its Family descriptor (its sample rate, the extra
request fields its example needs, whether it takes a seed): nothing here names a family.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx

from ..families import DEFAULT_FAMILY, FAMILIES, family_of
from .load import TEXTS, RequestResult, request_bodies, run_level
from .perf import profile_family
from .report import machine, write


def _levels(value: str) -> list[int]:
    levels = sorted({int(v) for v in value.split(",") if v.strip()})
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError("concurrency levels are positive integers, e.g. 1,4,8")
    return levels


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tritontts.benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_argument_group("which server")
    where.add_argument("--url", help="a running front (default: start one for --families)")
    where.add_argument("--grpc-url", help="its tritonserver's gRPC address, for perf_analyzer")
    where.add_argument("--families", default=DEFAULT_FAMILY,
                       help="families to serve when starting a server (comma-separated)")
    where.add_argument("--checkpoint", action="append", default=[], metavar="NAME=PATH",
                       help="a family's checkpoint when starting a server")
    where.add_argument("--random-checkpoints", action="store_true",
                       help="write a tiny random checkpoint for each family that needs one "
                            "and has no --checkpoint")
    what = p.add_argument_group("what to measure")
    what.add_argument("--models", help="models to drive (default: every one the front serves)")
    what.add_argument("--concurrency", type=_levels, default=_levels("1,4,8,16,32,64"))
    what.add_argument("--seconds", type=float, default=20.0,
                      help="per level: clients send requests until this much time has passed")
    what.add_argument("--extra", default="{}",
                      help="JSON object of request fields added to every request "
                           "(default: the family's example fields, e.g. a reference clip)")
    what.add_argument("--no-perf-analyzer", dest="perf", action="store_false")
    what.add_argument("--perf-concurrency", type=_levels, default=_levels("1,4"))
    what.add_argument("--perf-requests", type=int, default=8,
                      help="requests per perf_analyzer measurement window")
    what.add_argument("--no-stages", dest="stages", action="store_false",
                      help="perf_analyzer on ensembles only")
    what.add_argument("--overhead-rounds", type=int, default=0,
                      help="also measure serving overhead at concurrency 1: this many requests "
                           "per input on each of in-process stage code, Triton gRPC and the "
                           "front, interleaved (needs the family's checkpoint here)")
    p.add_argument("--out", type=Path, help="report folder (default .cache/benchmarks/<time>)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p.parse_args(argv)


def _checkpoints(args) -> dict[str, Path]:
    checkpoints = {}
    for item in args.checkpoint:
        name, _, path = item.partition("=")
        checkpoints[name] = Path(path)
    return checkpoints


def _start_server(args, workdir: Path, checkpoints: dict[str, Path]):
    from ..testing.stack import Stack

    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    for name in families:
        family = FAMILIES[name]
        if name not in checkpoints and family.checkpoint_required:
            if not args.random_checkpoints:
                sys.exit(f"{name} needs --checkpoint {name}=PATH or --random-checkpoints")
            checkpoints[name] = family.write_random_checkpoint(workdir / "checkpoints" / name)
    print(f"[benchmark] starting a server for {', '.join(families)} ...", file=sys.stderr)
    (workdir / "server").mkdir(parents=True, exist_ok=True)
    return Stack(workdir / "server", families, checkpoints).start()


def _progress(enabled: bool, total: float, label: str):
    """A progress bar over the level's seconds, with requests done and errors."""
    from tqdm import tqdm

    return tqdm(total=round(total), desc=label, unit="s", disable=not enabled, leave=True,
                file=sys.stderr, bar_format="{desc} {bar} {n:.0f}/{total:.0f} s {postfix}")


async def _drive(url: str, body, rate: int, level: int, seconds: float, bar):
    done = {"ok": 0, "failed": 0}

    def on_result(result: RequestResult):
        done["ok" if result.ok else "failed"] += 1
        bar.set_postfix_str(f"{done['ok']} ok, {done['failed']} failed", refresh=False)

    async def tick():
        start = time.perf_counter()
        while True:
            await asyncio.sleep(0.5)
            bar.n = min(seconds, time.perf_counter() - start)
            bar.refresh()

    ticker = asyncio.ensure_future(tick())
    try:
        return await run_level(url, body, rate, level, seconds, on_result=on_result)
    finally:
        ticker.cancel()


def _overhead(family, model, checkpoint, url, grpc_url, extra, rounds):
    from .inprocess import InProcessEnsemble
    from .overhead import measure

    if family.checkpoint_required and checkpoint is None:
        sys.exit(f"--overhead-rounds needs {family.name}'s checkpoint: --checkpoint {family.name}=PATH")
    print(f"[benchmark] serving overhead of {model} ...", file=sys.stderr)
    inprocess = InProcessEnsemble(family, checkpoint)
    try:
        return measure(family, model, inprocess, url, grpc_url, extra, rounds)
    finally:
        inprocess.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or Path(".cache/benchmarks") / stamp
    out.mkdir(parents=True, exist_ok=True)
    # Checkpoints, server logs and perf_analyzer's input files stay out of the report folder
    # (which may be committed, as docs/benchmarks/ is).
    work = Path(".cache/benchmarks/work") / stamp
    work.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        checkpoints = _checkpoints(args)
        if args.url:
            url, grpc_url = args.url.rstrip("/"), args.grpc_url
        else:
            server = _start_server(args, work, checkpoints)
            url, grpc_url = server.url, server.grpc_url
        served = [m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]]
        models = [m.strip() for m in args.models.split(",")] if args.models else served
        extra_override = json.loads(args.extra)
        report = {"machine": machine(), "seconds_per_level": args.seconds,
                  "concurrency": args.concurrency, "texts": list(TEXTS), "models": {}}
        for model in models:
            family = family_of(model)
            if family is None or model not in served:
                sys.exit(f"{model} is not served here (served: {', '.join(served)})")
            extra = extra_override or family.example_params()
            body = request_bodies(model, extra, seeded="seed" in family.fields.takes)
            result = report["models"][model] = {"family": family.name, "levels": [],
                                                "extra_fields": sorted(extra)}
            for level in args.concurrency:
                with _progress(args.progress, args.seconds, f"{model} c={level}") as bar:
                    outcome = asyncio.run(_drive(url + "/v1/audio/speech", body,
                                                 family.capabilities.sample_rate, level,
                                                 args.seconds, bar))
                result["levels"].append(outcome.summary())
                write(report, out)      # a report even if a later level is interrupted
            if args.perf and grpc_url:
                print(f"[benchmark] perf_analyzer on {model} ...", file=sys.stderr)
                result["perf"] = profile_family(grpc_url, model, TEXTS[1],
                                                {**extra, **({"seed": 1} if "seed" in family.fields.takes else {})},
                                                work / "perf_analyzer" / model,
                                                args.perf_concurrency, args.perf_requests, args.stages)
            if args.overhead_rounds and grpc_url:
                result["overhead"] = _overhead(family, model, checkpoints.get(family.name),
                                               url, grpc_url, extra, args.overhead_rounds)
            write(report, out)
        paths = write(report, out)
        print(paths["markdown"].read_text())
        print(f"[benchmark] {paths['json']}, {paths['markdown']} and plots in {out}", file=sys.stderr)
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
