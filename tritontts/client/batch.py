"""tritontts-batch: every line of a text file spoken, many requests at once.

  tritontts-batch lines.txt --out-dir audio/ --concurrency 8
  tritontts-batch lines.txt --out-dir audio/ --model qwen3_tts --voice ryan --format mp3

One request per non-empty line (POST /v1/audio/speech), at most --concurrency in flight.
Audio goes to OUT_DIR/0001.<format>, ... (numbered by line), and OUT_DIR/summary.json lists
every line: status, file, bytes, seconds to the first byte and to the end, and the error
of a line that failed. A line refused for load (429/503) is retried after the front's
Retry-After, up to --retries times; a bad line (400) is not. Exit status 0 when every line
succeeded, 1 otherwise.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from .common import add_request_options, error_message, headers, progress, request_fields


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="tritontts-batch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("text_file", type=Path, help="one text per line ('-': standard input)")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--retries", type=int, default=3, help="per line, on 429/503")
    add_request_options(parser)
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    return args


async def one(http, url: str, index: int, text: str, fields: dict, out: Path, fmt: str,
              retries: int) -> dict:
    item = {"line": index, "text": text}
    for attempt in range(retries + 1):
        start = time.monotonic()
        first = None
        try:
            async with http.stream("POST", url, json={**fields, "input": text}) as r:
                if r.status_code in (429, 503) and attempt < retries:
                    await asyncio.sleep(float(r.headers.get("retry-after", 1)))
                    continue
                if r.status_code != 200:
                    return {**item, "status": r.status_code,
                            "error": error_message(r.status_code, await r.aread())}
                path = out / f"{index:04d}.{fmt}"
                size = 0
                with open(path, "wb") as sink:
                    async for piece in r.aiter_bytes():
                        first = first if first is not None else time.monotonic() - start
                        sink.write(piece)
                        size += len(piece)
                return {**item, "status": 200, "file": path.name, "bytes": size,
                        "first_byte_s": round(first or 0.0, 3),
                        "seconds": round(time.monotonic() - start, 3), "attempts": attempt + 1}
        except Exception as exc:      # noqa: BLE001 - recorded per line; the batch goes on
            return {**item, "status": None, "error": f"{type(exc).__name__}: {exc}"}
    return {**item, "status": 503, "error": f"still refused after {retries} retries"}


async def run(args) -> int:
    import httpx

    source = sys.stdin if str(args.text_file) == "-" else args.text_file.open(encoding="utf-8")
    lines = [(i, line.strip()) for i, line in enumerate(source, 1) if line.strip()]
    if not lines:
        print("tritontts-batch: no lines to speak", file=sys.stderr)
        return 2
    fmt = args.format or "wav"
    fields = request_fields(args, fmt)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    url = args.url.rstrip("/") + "/v1/audio/speech"
    gate = asyncio.Semaphore(args.concurrency)
    start = time.monotonic()
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), limits=limits,
                                 headers=headers(args)) as http:
        with progress(args.progress, total=len(lines), unit="line", desc="speaking") as bar:
            async def guarded(index, text):
                async with gate:
                    result = await one(http, url, index, text, fields, args.out_dir, fmt,
                                       args.retries)
                bar.update(1)
                return result

            results = await asyncio.gather(*(guarded(i, t) for i, t in lines))
    wall = time.monotonic() - start
    ok = [r for r in results if r["status"] == 200]
    summary = {"lines": len(results), "ok": len(ok), "failed": len(results) - len(ok),
               "seconds": round(wall, 3), "concurrency": args.concurrency, "format": fmt,
               "request": {k: v for k, v in fields.items() if k != "ref_audio"}, "items": results}
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    print(f"{len(ok)}/{len(results)} lines spoken in {wall:.1f} s -> {args.out_dir}"
          + (f"; failed lines: {[r['line'] for r in results if r['status'] != 200]}"
             if len(ok) < len(results) else ""), file=sys.stderr)
    return 0 if len(ok) == len(results) else 1


def main(argv=None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
