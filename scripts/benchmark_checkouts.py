"""This checkout against another checkout of this repository (e.g. the commit before a
refactor), serving the default voice side by side, requests interleaved (A B, B A, ...)
so that drift in this noisy machine's speed hits both alike. Prints medians and ratios.

  .venv/bin/python scripts/benchmark_checkouts.py --baseline /path/to/other/checkout [--rounds 20]

The other checkout needs its own .venv (bash scripts/setup.sh there).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import httpx

from tritontts.testing.stack import REPO, Stack

TEXTS = {
    "1 sentence": "The birch canoe slid on the smooth planks of the old wooden dock.",
    "5 sentences": ("The birch canoe slid on the smooth planks. Glue the sheet to the dark blue "
                    "background. It's easy to tell the depth of a well. These days a chicken leg "
                    "is a rare dish. Rice is often served in round bowls."),
}


def timed(client: httpx.Client, url: str, text: str, stream: bool) -> tuple[float, float]:
    """(time to first audio, total time) of one request."""
    start, first = time.perf_counter(), None
    with client.stream("POST", url + "/v1/audio/speech", json={"input": text, "stream": stream}) as r:
        r.raise_for_status()
        for _ in r.iter_bytes():
            first = first or time.perf_counter() - start
    return first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    tmp = REPO / ".cache" / "bench-checkouts"
    for sub in ("ours", "baseline"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    stacks = {"ours": Stack(tmp / "ours", ("piper",)).start(),
              "baseline": Stack(tmp / "baseline", ("piper",), checkout=args.baseline).start()}
    print("| input | mode | TTFA ours | TTFA baseline | ratio | total ours | total baseline | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    try:
        with httpx.Client(timeout=300) as client:
            for label, text in TEXTS.items():
                for stream in (True, False):
                    times: dict[str, list] = {name: [] for name in stacks}
                    for stack in stacks.values():
                        timed(client, stack.url, text, stream)  # warm-up
                    for i in range(args.rounds):
                        order = list(stacks) if i % 2 == 0 else list(reversed(stacks))
                        for name in order:
                            times[name].append(timed(client, stacks[name].url, text, stream))
                    first = {n: statistics.median(t[0] for t in ts) for n, ts in times.items()}
                    total = {n: statistics.median(t[1] for t in ts) for n, ts in times.items()}
                    print(f"| {label} | {'stream' if stream else 'whole file'} | "
                          f"{first['ours']*1000:.0f} ms | {first['baseline']*1000:.0f} ms | "
                          f"{first['ours']/first['baseline']:.2f} | {total['ours']*1000:.0f} ms | "
                          f"{total['baseline']*1000:.0f} ms | {total['ours']/total['baseline']:.2f} |",
                          flush=True)
    finally:
        for stack in stacks.values():
            stack.stop()


if __name__ == "__main__":
    main()
