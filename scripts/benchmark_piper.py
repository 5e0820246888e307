"""Side by side, in one run: our stack (tritonserver + front) vs piper-tts's own server
(`python -m piper.http_server`, flask), same voice, same machine.

Measures time to first audio (first response bytes) and audio seconds produced per
wall-clock second, at concurrency 1 and 8, for a 1-sentence and a 5-sentence input.
Ours is measured streaming (stream: true, raw WAV) and whole-file; piper's server only
returns whole files.

  .venv/bin/python scripts/benchmark_piper.py [--rounds 3]

(This checkout against another one, e.g. before a refactor: scripts/benchmark_checkouts.py.)
"""
from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tritontts.testing.stack import REPO, Stack, free_port

INPUTS = {
    "1 sentence": "The birch canoe slid on the smooth planks of the old wooden dock.",
    "5 sentences": ("The birch canoe slid on the smooth planks. Glue the sheet to the dark blue "
                    "background. It's easy to tell the depth of a well. These days a chicken leg "
                    "is a rare dish. Rice is often served in round bowls."),
}


def pcm_seconds(data: bytes, streamed_wav: bool) -> float:
    if streamed_wav:  # 44-byte header with unknown length, then 16-bit mono PCM
        return (len(data) - 44) / 2 / 22050
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes() / w.getframerate()


def one(client: httpx.Client, url: str, body: dict, streamed: bool):
    start = time.perf_counter()
    first = None
    data = bytearray()
    with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for piece in r.iter_bytes():
            if first is None:
                first = time.perf_counter() - start
            data += piece
    return first, pcm_seconds(bytes(data), streamed)


def run(name, url, make_body, streamed, concurrency, rounds):
    results = {}
    with httpx.Client(timeout=300) as client:
        for label, text in INPUTS.items():
            one(client, url, make_body(text), streamed)  # warm-up
            n = concurrency * rounds
            start = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                outs = list(pool.map(lambda _, text=text: one(client, url, make_body(text), streamed), range(n)))
            wall = time.perf_counter() - start
            ttfa = statistics.median(o[0] for o in outs)
            rate = sum(o[1] for o in outs) / wall
            results[label] = (ttfa, rate)
            print(f"{name:28s} c={concurrency} {label:12s} TTFA(median) {ttfa*1000:7.0f} ms   "
                  f"{rate:6.1f} audio-s/s", flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from tritontts.piper.voices import load_voice_table

    model = load_voice_table().resolve("default").model_path
    tmp = Path(REPO / ".cache" / "bench")
    tmp.mkdir(parents=True, exist_ok=True)
    ours = Stack(tmp, ("piper",)).start()
    piper_port = free_port()
    piper = subprocess.Popen([sys.executable, "-m", "piper.http_server", "-m", str(model),
                              "--host", "127.0.0.1", "--port", str(piper_port)],
                             stdout=open(tmp / "piper.log", "wb"), stderr=subprocess.STDOUT)
    try:
        for _ in range(120):
            try:
                httpx.get(f"http://127.0.0.1:{piper_port}/voices", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        table = {}
        for c in (1, 8):
            table[("piper.http_server (whole file)", c)] = run(
                "piper.http_server", f"http://127.0.0.1:{piper_port}/synthesize",
                lambda t: {"text": t}, False, c, args.rounds)
            table[("ours, stream=true", c)] = run(
                "ours stream=true", ours.url + "/v1/audio/speech",
                lambda t: {"input": t, "stream_format": "audio"}, True, c, args.rounds)
            table[("ours, whole file", c)] = run(
                "ours whole file", ours.url + "/v1/audio/speech",
                lambda t: {"input": t}, False, c, args.rounds)
        print("\n| server | c | input | time to first audio | audio-s/s |")
        print("|---|---|---|---|---|")
        for (name, c), res in table.items():
            for label, (ttfa, rate) in res.items():
                print(f"| {name} | {c} | {label} | {ttfa*1000:.0f} ms | {rate:.1f} |")
        base = table[("piper.http_server (whole file)", 8)]
        ours8 = table[("ours, stream=true", 8)]
        base1 = table[("piper.http_server (whole file)", 1)]
        ours1 = table[("ours, stream=true", 1)]
        print("\nratios (ours streaming / piper.http_server):")
        for label in INPUTS:
            print(f"  {label}: TTFA c=1 x{ours1[label][0]/base1[label][0]:.2f}, "
                  f"c=8 x{ours8[label][0]/base[label][0]:.2f}; throughput c=8 x{ours8[label][1]/base[label][1]:.2f}")
    finally:
        piper.terminate()
        ours.stop()


if __name__ == "__main__":
    main()
