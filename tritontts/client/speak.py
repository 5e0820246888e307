"""tritontts-speak: text to speech through the front.

  tritontts-speak "Hello there." -o hello.wav
  echo "Piped text." | tritontts-speak -o - --format mp3 | mpv -
  tritontts-speak --stream -o - --format pcm "Long text ..." | aplay -r 22050 -f S16_LE
  tritontts-speak --model cosyvoice3 --ref-audio me.wav --ref-text "What I said." "Hi."
  tritontts-speak --ws -o live.wav        # type lines; each sentence is spoken as it ends

--stream asks the front to send audio as it is synthesized (`stream_format: audio`), so
the first sentence plays while the rest is made. --ws opens /v1/audio/speech/stream and
sends standard input line by line as it arrives (an LLM piping its answer in is heard
while it writes); Ctrl-D ends the utterance.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
import wave
from pathlib import Path

from .common import (add_request_options, audio_format, error_message, headers, progress,
                     request_fields)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="tritontts-speak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("text", nargs="?", help="text to speak; '-' or omitted: standard input")
    parser.add_argument("-f", "--text-file", type=Path, help="read the text from this file")
    parser.add_argument("-o", "--output", default=None,
                        help="audio file, '-' for standard output (default: speech.<format>)")
    parser.add_argument("--stream", action="store_true",
                        help="receive audio as it is synthesized (lower latency)")
    parser.add_argument("--ws", action="store_true",
                        help="WebSocket session: speak standard input line by line as it arrives")
    add_request_options(parser)
    return parser.parse_args(argv)


def read_text(args) -> str:
    if args.text_file:
        return args.text_file.read_text(encoding="utf-8")
    if args.text is not None and args.text != "-":
        return args.text        # "" too: an instruction-only request (its whole ask in --instructions)
    return sys.stdin.read()


def open_output(path: str):
    return sys.stdout.buffer if path == "-" else open(path, "wb")


def speak_http(args, fmt: str, output: str) -> int:
    import httpx

    text = read_text(args).strip()
    if not text and not getattr(args, "instructions", None):
        print("tritontts-speak: no text to speak (an instruction-only request: '' --instructions ...)",
              file=sys.stderr)
        return 2
    body = {**request_fields(args, fmt), "input": text}
    if args.stream:
        body["stream_format"] = "audio"
    start = time.monotonic()
    first = None
    received = 0
    with httpx.Client(timeout=httpx.Timeout(600, connect=10), headers=headers(args)) as http:
        try:
            with http.stream("POST", args.url.rstrip("/") + "/v1/audio/speech", json=body) as r:
                if r.status_code != 200:
                    print(f"tritontts-speak: {error_message(r.status_code, r.read())}", file=sys.stderr)
                    return 1
                sink = open_output(output)
                try:
                    with progress(args.progress, unit="B", unit_scale=True, desc="audio") as bar:
                        for piece in r.iter_bytes():
                            first = first if first is not None else time.monotonic() - start
                            sink.write(piece)
                            sink.flush()
                            received += len(piece)
                            bar.update(len(piece))
                finally:
                    if sink is not sys.stdout.buffer:
                        sink.close()
        except httpx.HTTPError as exc:
            print(f"tritontts-speak: {args.url}: {exc}", file=sys.stderr)
            return 1
    if output != "-":
        print(f"{output}: {received} bytes, first audio after {first or 0:.2f} s, "
              f"done in {time.monotonic() - start:.2f} s", file=sys.stderr)
    return 0


async def speak_ws(args, fmt: str, output: str) -> int:
    """pcm from the session; written as WAV when the output asks for it (each sentence
    of a WebSocket session is its own encoded stream, so other formats are per sentence
    and are not joined here)."""
    import websockets

    url = args.url.rstrip("/").replace("http", "ws", 1) + "/v1/audio/speech/stream"
    # Lines are spoken as their sentences complete (the server's default waits for input.done).
    config = {"type": "session.config", **request_fields(args, "pcm"), "split_granularity": "sentence"}
    pcm = io.BytesIO()
    rate = None
    loop = asyncio.get_running_loop()
    try:
        async with websockets.connect(url, additional_headers=headers(args),
                                      max_size=None) as ws:
            await ws.send(json.dumps(config))

            async def feed():
                while True:
                    line = await loop.run_in_executor(None, sys.stdin.readline)
                    if not line:
                        break
                    await ws.send(json.dumps({"type": "input.text", "text": line}))
                await ws.send(json.dumps({"type": "input.done"}))

            feeder = asyncio.ensure_future(feed())
            sentences = 0
            async for message in ws:
                if isinstance(message, bytes):
                    pcm.write(message)
                    if output == "-" and fmt == "pcm":
                        sys.stdout.buffer.write(message)
                        sys.stdout.buffer.flush()
                    continue
                event = json.loads(message)
                if event["type"] == "audio.start":
                    rate = event["sample_rate"]
                    print(f"[{event['sentence_index']}] {event['sentence_text']}", file=sys.stderr)
                elif event["type"] == "audio.done":
                    sentences += 1
                    if event.get("error"):
                        print(f"tritontts-speak: sentence failed: {event['error']}", file=sys.stderr)
                elif event["type"] == "error":
                    print(f"tritontts-speak: HTTP {event.get('status')}: {event['message']}",
                          file=sys.stderr)
                    feeder.cancel()
                    return 1
                elif event["type"] == "session.done":
                    await ws.send(json.dumps({"type": "session.close"}))
                    break
            await asyncio.gather(feeder, return_exceptions=True)
    except (OSError, websockets.exceptions.WebSocketException) as exc:
        print(f"tritontts-speak: {url}: {exc}", file=sys.stderr)
        return 1
    if output != "-" or fmt != "pcm":
        data = pcm.getvalue()
        with (open(output, "wb") if output != "-" else _Stdout()) as sink:
            if fmt == "wav":
                with wave.open(sink, "wb") as w:
                    w.setnchannels(1)
                    w.setsampwidth(2)
                    w.setframerate(rate or 22050)
                    w.writeframes(data)
            else:
                sink.write(data)
        print(f"{output}: {sentences} sentences, {len(data) / 2 / (rate or 22050):.2f} s of audio",
              file=sys.stderr)
    return 0


class _Stdout:
    def __enter__(self):
        return sys.stdout.buffer

    def __exit__(self, *exc):
        sys.stdout.buffer.flush()


def main(argv=None) -> int:
    args = parse_args(argv)
    output = args.output or f"speech.{audio_format(args.format, None)}"
    fmt = audio_format(args.format, output)
    if args.ws:
        if fmt not in ("wav", "pcm"):
            print("tritontts-speak: --ws writes wav or pcm (each sentence of a session is "
                  "encoded on its own)", file=sys.stderr)
            return 2
        return asyncio.run(speak_ws(args, fmt, output))
    return speak_http(args, fmt, output)


if __name__ == "__main__":
    sys.exit(main())
