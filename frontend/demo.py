"""tritontts-demo: the demo page for a front elsewhere (the front itself serves it at /demo/).

  tritontts-demo                                   # the front on localhost:8091, page on :7860
  tritontts-demo --url http://tts.internal:8091 --port 7860 --share-host 0.0.0.0

Serves the page (frontend/demo_page) at http://HOST:PORT/demo/ and passes its API calls
(/v1/..., /health) through to --url as they are, streamed both ways, so the page and the
API share an origin (no CORS on the front). --api-key is added to calls that carry none.
The page builds its form from the front's GET /v1/audio/models, plays the raw PCM stream
from its first chunk in an AudioWorklet, and offers the whole audio as a WAV.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.staticfiles import StaticFiles

from .demo_page import DEMO_PAGE

DEFAULT_URL = "http://localhost:8091"
# Hop-by-hop and length headers are the proxy's own to set.
SKIPPED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                   "accept-encoding", "content-encoding"}


def create_demo_app(front_url: str, api_key: str | None = None) -> FastAPI:
    front_url = front_url.rstrip("/")

    @asynccontextmanager
    async def lifespan(app):
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10)) as client:
            app.state.client = client
            yield

    app = FastAPI(title="tritontts demo", lifespan=lifespan)

    async def passed_through(request: Request, path: str):
        headers = {k: v for k, v in request.headers.items() if k.lower() not in SKIPPED_HEADERS}
        if api_key and "authorization" not in {k.lower() for k in headers}:
            headers["Authorization"] = f"Bearer {api_key}"
        outgoing = app.state.client.build_request(
            request.method, f"{front_url}/{path}", params=request.query_params, headers=headers,
            content=await request.body())
        try:
            answer = await app.state.client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            return JSONResponse({"error": {"message": f"the front at {front_url} cannot be reached: {exc}",
                                           "type": "server_error", "param": None, "code": "502"}},
                                status_code=502)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in SKIPPED_HEADERS}
        return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code, headers=kept,
                                 background=BackgroundTask(answer.aclose))

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "DELETE"])
    async def api(request: Request, path: str):
        return await passed_through(request, "v1/" + path)

    @app.get("/health")
    async def health(request: Request):
        return await passed_through(request, "health")

    @app.get("/")
    async def root():
        return RedirectResponse("/demo/")

    app.mount("/demo", StaticFiles(directory=DEMO_PAGE, html=True), name="demo")
    return app


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tritontts-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=DEFAULT_URL, help="the front (default: %(default)s)")
    parser.add_argument("--api-key", help="Bearer key if the front requires one (added to the page's calls)")
    parser.add_argument("--port", type=int, default=7860, help="the page's port (default: %(default)s)")
    parser.add_argument("--share-host", default="127.0.0.1",
                        help="address the page listens on (default: %(default)s; 0.0.0.0 for others)")
    args = parser.parse_args(argv)
    try:
        httpx.get(args.url.rstrip("/") + "/health", timeout=10)
    except httpx.HTTPError as exc:
        print(f"tritontts-demo: cannot reach the front at {args.url}: {exc}", file=sys.stderr)
        return 1
    import uvicorn

    print(f"tritontts-demo: the page is at http://{args.share_host}:{args.port}/demo/ (front: {args.url})",
          flush=True)
    uvicorn.run(create_demo_app(args.url, args.api_key), host=args.share_host, port=args.port,
                log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
