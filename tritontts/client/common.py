"""What both clients share: the request body from the command line, errors, progress."""
from __future__ import annotations

import argparse
import base64
import json
import mimetypes
import os
import sys
from pathlib import Path

from ..families import DEFAULT_FAMILY, FAMILIES
from ..voice import VOICE_FEATURES

DEFAULT_URL = "http://localhost:8091"


def add_request_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("TRITONTTS_URL", DEFAULT_URL),
                        help="the front (default: $TRITONTTS_URL or %(default)s)")
    parser.add_argument("--api-key", default=os.environ.get("TRITONTTS_API_KEY"),
                        help="Bearer key if the front requires one (default: $TRITONTTS_API_KEY)")
    parser.add_argument("--model", default=DEFAULT_FAMILY, help="served model (default: %(default)s)")
    parser.add_argument("--voice", default="default")
    parser.add_argument("--format", default=None,
                        choices=["wav", "mp3", "opus", "aac", "flac", "pcm"],
                        help="audio format (default: from the output file's extension, else wav)")
    parser.add_argument("--speed", type=float)
    parser.add_argument("--seed", type=int, help="same seed, same audio (families that sample)")
    parser.add_argument("--language")
    parser.add_argument("--instructions", help="style instructions (families that take them)")
    parser.add_argument("--ref-audio", type=Path, metavar="FILE",
                        help="a local reference recording, sent as a data URL (voice cloning)")
    parser.add_argument("--ref-text", help="what the reference recording says")
    parser.add_argument("--extra", default="{}", metavar="JSON",
                        help="more request fields as a JSON object, e.g. '{\"max_new_tokens\": 200}'")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar (default: shown when stderr is a terminal)")
    parser.epilog = "\n".join(filter(None, [parser.epilog, fields_help()]))


def fields_help() -> str:
    """What each family's requests take, from its declaration (tritontts.protocol.RequestFields)."""
    lines = ["request fields each model takes (--extra, or the options above):"]
    for name, family in FAMILIES.items():
        taken = sorted(set(family.fields.takes) - {VOICE_FEATURES})     # the front sends those
        lines.append(f"  {name}: {', '.join(taken) or 'none'}")
    return "\n".join(lines)


def data_url(path: Path) -> str:
    """A local file as a data: URL (what the front accepts for ref_audio)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SystemExit(f"--ref-audio {path}: {exc.strerror or exc}") from None
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if mime == "audio/x-wav":
        mime = "audio/wav"
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def request_fields(args, audio_format: str) -> dict:
    """The speech fields (without `input`) the options ask for."""
    try:
        extra = json.loads(args.extra)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--extra is not JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise SystemExit("--extra must be a JSON object")
    body = {"model": args.model, "voice": args.voice, "response_format": audio_format,
            "speed": args.speed, "seed": args.seed, "language": args.language,
            "instructions": args.instructions, "ref_text": args.ref_text,
            "ref_audio": data_url(args.ref_audio) if args.ref_audio else None}
    return {**{k: v for k, v in body.items() if v is not None}, **extra}


def audio_format(given: str | None, output: str | None) -> str:
    if given:
        return given
    suffix = Path(output).suffix.lstrip(".").lower() if output and output != "-" else ""
    return suffix if suffix in ("wav", "mp3", "opus", "aac", "flac", "pcm") else "wav"


def headers(args) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def error_message(status: int, body: bytes) -> str:
    """The front's error JSON as one line: status, message, and which field."""
    try:
        error = json.loads(body)["error"]
        where = f" ({error['param']})" if error.get("param") else ""
        return f"HTTP {status}{where}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {body[:300].decode(errors='replace')}"


def progress(enabled: bool, **options):
    from tqdm import tqdm

    return tqdm(disable=not (enabled and sys.stderr.isatty()), file=sys.stderr, **options)
