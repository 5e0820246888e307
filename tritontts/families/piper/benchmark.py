"""Side by side, in one run: our stack (tritonserver + front) vs piper-tts's own server
(`python -m piper.http_server`, flask), same voice, same machine, held-out text.

At concurrency 1, 4 and 8, for a 1-sentence and a 5-sentence input: time to first audio
(ours: first PCM byte of a streamed response; piper's server returns whole files only, so
its first byte comes with the whole file) and audio seconds produced per wall second.
Rounds alternate the arms (peer, ours, ours, peer, ...) so this machine's drift hits both.
Beside them, the compute ceiling: the same sentences' VITS alone, in this process, one
1-thread onnxruntime session call per core at a time (no phonemizing, no serving).

  .venv/bin/python -m tritontts.families.piper.benchmark [--rounds 4] [--json out.json]

(This checkout against another one, e.g. before a refactor: scripts/benchmark_checkouts.py;
every family at every load: python -m tritontts.benchmark.)
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import subprocess
import sys
import time
import wave
from pathlib import Path

import httpx

from tritontts.benchmark.load import stream_one
from tritontts.testing.stack import REPO, Stack, free_port

INPUTS = {   # Harvard sentences (list 2), used by no test
    "1 sentence": "The boy was there when the sun rose.",
    "5 sentences": ("The boy was there when the sun rose. A rod is used to catch pink salmon. "
                    "The source of the huge river is the clear spring. Kick the ball straight "
                    "and follow through. Help the woman get back to her feet."),
}
RATE = 22050


async def peer_one(client: httpx.AsyncClient, url: str, text: str) -> tuple[float, float]:
    start = time.perf_counter()
    r = await client.post(url, json={"text": text})
    r.raise_for_status()
    with wave.open(io.BytesIO(r.content)) as w:
        return time.perf_counter() - start, w.getnframes() / w.getframerate()


async def ours_one(client: httpx.AsyncClient, url: str, text: str) -> tuple[float, float]:
    body = {"input": text, "response_format": "pcm", "stream_format": "audio"}
    result = await stream_one(client, url, body, RATE)
    if not result.ok:
        raise RuntimeError(result.error or f"HTTP {result.status}")
    return result.first_audio, result.audio_seconds


async def batch(one, url: str, text: str, concurrency: int, per_client: int):
    """`concurrency` clients, `per_client` requests each: (TTFAs, audio s, wall s)."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency + 2)) as client:
        await one(client, url, text)                     # warm connection and caches
        outs = []

        async def worker():
            for _ in range(per_client):
                outs.append(await one(client, url, text))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return [o[0] for o in outs], sum(o[1] for o in outs), wall


def ceiling(texts: list[str], seconds: float = 6.0) -> float:
    """Audio seconds per second of VITS alone: one 1-thread session call per core."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from piper import PiperVoice

    from tritontts.families.piper.vits import PiperVits
    from tritontts.families.piper.voices import load_voice_table

    spec = load_voice_table().resolve("default")
    voice = PiperVoice.load(str(spec.model_path))
    ids = [voice.phonemes_to_ids(p) for text in texts for p in voice.phonemize(text)]
    vits = PiperVits(spec.model_path, RATE, 1)
    cores = os.cpu_count() or 1
    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(lambda i: vits.synthesize(i, [0.667, 1.0, 0.8], 1), ids[:cores]))
        start, audio = time.perf_counter(), 0.0
        while time.perf_counter() - start < seconds:
            audio += sum(a.size for a in pool.map(
                lambda i: vits.synthesize(i, [0.667, 1.0, 0.8], 1), ids * cores)) / RATE
        return audio / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from tritontts.families.piper.voices import load_voice_table

    model = load_voice_table().resolve("default").model_path
    tmp = Path(REPO / ".cache" / "bench")
    tmp.mkdir(parents=True, exist_ok=True)
    ours = Stack(tmp, ("piper",)).start()
    piper_port = free_port()
    piper = subprocess.Popen([sys.executable, "-m", "piper.http_server", "-m", str(model),
                              "--host", "127.0.0.1", "--port", str(piper_port)],
                             stdout=open(tmp / "piper.log", "wb"), stderr=subprocess.STDOUT)
    arms = {"piper.http_server": (peer_one, f"http://127.0.0.1:{piper_port}/synthesize"),
            "ours (streaming)": (ours_one, ours.url + "/v1/audio/speech")}
    rows = []
    try:
        for _ in range(120):
            try:
                httpx.get(f"http://127.0.0.1:{piper_port}/voices", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        for c in (int(v) for v in args.concurrency.split(",")):
            for label, text in INPUTS.items():
                got = {name: ([], 0.0, 0.0) for name in arms}
                for r in range(args.rounds):
                    order = list(arms) if r % 2 == 0 else list(reversed(arms))
                    for name in order:
                        one, url = arms[name]
                        ttfa, audio, wall = asyncio.run(batch(one, url, text, c, args.requests_per_client))
                        t, a, w = got[name]
                        got[name] = (t + ttfa, a + audio, w + wall)
                row = {"concurrency": c, "input": label}
                for name, (ttfa, audio, wall) in got.items():
                    row[name] = {"ttfa_p50": statistics.median(ttfa), "audio_s_per_s": audio / wall}
                peer, us = row["piper.http_server"], row["ours (streaming)"]
                row["ttfa_ratio"] = us["ttfa_p50"] / peer["ttfa_p50"]
                row["throughput_ratio"] = us["audio_s_per_s"] / peer["audio_s_per_s"]
                rows.append(row)
                print(f"c={c} {label:11s} TTFA ours {us['ttfa_p50']*1000:6.0f} ms, peer "
                      f"{peer['ttfa_p50']*1000:6.0f} ms (x{row['ttfa_ratio']:.2f}); audio-s/s ours "
                      f"{us['audio_s_per_s']:5.1f}, peer {peer['audio_s_per_s']:5.1f} "
                      f"(x{row['throughput_ratio']:.2f})", flush=True)
    finally:
        piper.terminate()
        ours.stop()
    limit = ceiling(list(INPUTS.values()))
    print(f"\ncompute ceiling (VITS alone, {limit:.1f} audio-s/s); piper.http_server reached "
          f"{max(r['piper.http_server']['audio_s_per_s'] for r in rows) / limit:.0%} of it, ours "
          f"{max(r['ours (streaming)']['audio_s_per_s'] for r in rows) / limit:.0%}")
    print("\n| c | input | TTFA ours | TTFA piper.http_server | ratio | audio-s/s ours | audio-s/s piper.http_server | ratio |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        us, peer = row["ours (streaming)"], row["piper.http_server"]
        print(f"| {row['concurrency']} | {row['input']} | {us['ttfa_p50']*1000:.0f} ms | "
              f"{peer['ttfa_p50']*1000:.0f} ms | {row['ttfa_ratio']:.2f} | {us['audio_s_per_s']:.1f} | "
              f"{peer['audio_s_per_s']:.1f} | {row['throughput_ratio']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ceiling_audio_s_per_s": limit}, indent=1))


if __name__ == "__main__":
    main()
