"""`python -m frontend`: start tritonserver with the chosen families and the OpenAI front.

  python -m frontend                       # tritonserver (piper) + front on :8091
  python -m frontend --families piper --port 8091
  python -m frontend --triton-url host:8001 # front only, for a tritonserver run elsewhere

Ctrl-C / SIGTERM stops the front, then tritonserver.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

import uvicorn

from .app import create_app
from .families import FAMILIES


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m frontend", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=os.environ.get("TRITONTTS_FAMILIES", "piper"),
                        help="comma-separated families to load (default: piper); "
                             f"known: {', '.join(FAMILIES)}")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--triton-url", help="gRPC address of a running tritonserver; "
                        "when given, no tritonserver is started")
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--piper-voices", help="Piper voice table JSON (tritontts/piper/voices.py)")
    parser.add_argument("--cosyvoice3-checkpoint",
                        help="CosyVoice3 checkpoint directory (cosyvoice3.yaml, llm.pt, flow.pt, ...)")
    parser.add_argument("--max-in-flight", type=int, default=64,
                        help="requests served at once; more get 429")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds a request may take end to end before it fails (503)")
    parser.add_argument("--triton-log", help="file for tritonserver's log (default: stdout)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        print(f"unknown families {unknown}; known: {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    if "cosyvoice3" in families and args.triton_url is None:
        # Fail here, naming the file, rather than in a stage log a minute later.
        from tritontts.cosyvoice3.checkpoint import CheckpointError, open_checkpoint

        if not args.cosyvoice3_checkpoint:
            print("--families cosyvoice3 needs --cosyvoice3-checkpoint DIR", file=sys.stderr)
            return 2
        try:
            open_checkpoint(args.cosyvoice3_checkpoint)
        except CheckpointError as exc:
            print(f"cosyvoice3 checkpoint: {exc}", file=sys.stderr)
            return 2

    # SIGTERM (also re-raised by uvicorn after its graceful shutdown) is a normal stop:
    # unwind through the finally below so tritonserver is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    triton = None
    triton_url = args.triton_url
    if triton_url is None:
        from tritontts.tritonserver import TritonServer

        env = {}
        if args.piper_voices:
            env["TRITONTTS_PIPER_VOICES"] = str(Path(args.piper_voices).resolve())
        if args.cosyvoice3_checkpoint:
            env["TRITONTTS_COSYVOICE3_CHECKPOINT"] = str(Path(args.cosyvoice3_checkpoint).resolve())
        triton = TritonServer(families, args.http_port, args.grpc_port, args.metrics_port,
                              env=env, log_path=Path(args.triton_log) if args.triton_log else None)
    try:
        if triton is not None:
            print(f"starting tritonserver ({', '.join(families)}) ...", flush=True)
            triton.start().wait_ready()
            triton_url = triton.grpc_url
        app = create_app(triton_url, families, args.max_in_flight, args.request_timeout)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info")
        server = uvicorn.Server(config)
        shown = "localhost" if args.host in ("0.0.0.0", "::") else args.host
        print(f"\nServing {', '.join(families)} at http://{shown}:{args.port}  (Triton gRPC {triton_url})\n"
              f"  curl -X POST http://{shown}:{args.port}/v1/audio/speech "
              "-H 'Content-Type: application/json' \\\n"
              "       -d '{\"input\":\"Hello there.\",\"voice\":\"default\"}' --output out.wav\n",
              flush=True)
        server.run()  # returns on Ctrl-C / SIGTERM (uvicorn handles both)
    except KeyboardInterrupt:
        pass
    finally:
        if triton is not None:
            triton.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
