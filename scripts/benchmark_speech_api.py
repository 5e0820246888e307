"""What the speech API's newer paths buy, measured side by side in one run (interleaved, so
this machine's noise hits both arms alike):

1. WebSocket, text arriving as an LLM writes it (words at --words-per-second): time from
   the first word to the first audio, sentence-by-sentence synthesis (ours, the default)
   vs buffering until input.done (split_granularity "none", vLLM-Omni's default).
2. A stored voice vs the same reference sent inline (CosyVoice3 on a tiny random
   checkpoint): time to first audio and request size, with a new recording per inline
   request (the prompt stage's content cache cannot help, as after a restart or for a
   client that cycles voices).

  .venv/bin/python scripts/benchmark_speech_api.py [--rounds 5] [--words-per-second 6]
"""
from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TEXT = ("The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. "
        "It is easy to tell the depth of a well. These days a chicken leg is a rare dish.")


def websocket_first_audio(url: str, granularity: str, words_per_second: float) -> float:
    """Seconds from the first word sent to the first audio frame received."""
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws") + "/v1/audio/speech/stream", max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "piper", "response_format": "pcm",
                            "split_granularity": granularity}))
        json.loads(ws.recv(timeout=60))
        first: list[float] = []

        def listen():
            while True:
                message = ws.recv(timeout=300)
                if isinstance(message, bytes) and not first:
                    first.append(time.perf_counter())
                elif not isinstance(message, bytes) and json.loads(message)["type"] == "session.done":
                    return

        listener = threading.Thread(target=listen)
        listener.start()
        start = time.perf_counter()
        for word in TEXT.split(" "):
            ws.send(json.dumps({"type": "input.text", "text": word + " "}))
            time.sleep(1.0 / words_per_second)
        ws.send(json.dumps({"type": "input.done"}))
        listener.join()
        ws.send(json.dumps({"type": "session.close"}))
    return first[0] - start


def reference(seed: int) -> bytes:
    import io

    import soundfile as sf

    rng = np.random.default_rng(seed)
    t = np.arange(3 * 24000) / 24000
    audio = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 200) * t) * (1 + np.sin(2 * np.pi * 2 * t))
    buf = io.BytesIO()
    sf.write(buf, audio.astype(np.float32), 24000, format="WAV")
    return buf.getvalue()


def first_audio(url: str, body: dict) -> tuple[float, int]:
    payload = json.dumps(body).encode()
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/audio/speech", content=payload, timeout=600,
                      headers={"content-type": "application/json"}) as r:
        assert r.status_code == 200, r.read()
        elapsed = None
        for _ in r.iter_bytes():
            if elapsed is None:
                elapsed = time.perf_counter() - start
    return elapsed, len(payload)


def main() -> int:
    from tritontts.families import FAMILIES
    from tritontts.testing.stack import Stack

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--words-per-second", type=float, default=6.0)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-speech-api-"))
    checkpoint = FAMILIES["cosyvoice3"].write_random_checkpoint(tmp / "cosyvoice3")
    stack = Stack(tmp, ("piper", "cosyvoice3"), {"cosyvoice3": checkpoint}).start()
    try:
        url = stack.url
        ws = {"sentence": [], "none": []}
        for _ in range(args.rounds):
            for granularity in ws:
                ws[granularity].append(websocket_first_audio(url, granularity, args.words_per_second))
        print(f"WebSocket, {len(TEXT.split())} words at {args.words_per_second:g}/s, first word -> first audio "
              f"(median of {args.rounds}):")
        for granularity, times in ws.items():
            print(f"  split_granularity {granularity:8s} {statistics.median(times):6.2f} s")
        print(f"  ratio sentence / none: {statistics.median(ws['sentence']) / statistics.median(ws['none']):.2f}")

        upload = httpx.post(url + "/v1/audio/voices", timeout=600,
                            data={"name": "bench", "consent": "bench", "ref_text": "The reference voice."},
                            files={"audio_sample": ("ref.wav", reference(0), "audio/wav")})
        assert upload.status_code == 200, upload.text
        common = {"model": "cosyvoice3", "input": "Hello there, friend.", "seed": 1,
                  "response_format": "pcm", "stream_format": "audio"}
        stored, inline = [], []
        for k in range(args.rounds):
            stored.append(first_audio(url, {**common, "voice": "bench"}))
            inline.append(first_audio(url, {**common, "ref_text": "The reference voice.",
                                            "ref_audio": base64.b64encode(reference(k + 1)).decode()}))
        print(f"CosyVoice3 (tiny), time to first audio (median of {args.rounds}) and request size:")
        for name, runs in (("stored voice", stored), ("inline reference", inline)):
            print(f"  {name:17s} {statistics.median(t for t, _ in runs):6.3f} s  {runs[0][1]:8d} bytes")
        print(f"  ratio stored / inline: {statistics.median(t for t, _ in stored) / statistics.median(t for t, _ in inline):.2f}")
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
