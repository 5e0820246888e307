"""Overload gives 429 and an unreachable Triton gives 503: never a hang, never a crash."""
from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from fastapi.testclient import TestClient

from tritontts.testing.stack import REPO, free_port
from frontend.app import create_app

STACK_FAMILIES = ("piper",)


def test_triton_unreachable_is_503():
    dead = f"localhost:{free_port()}"  # nothing listens there
    with TestClient(create_app(dead, ["piper"])) as client:
        r = client.post("/v1/audio/speech", json={"input": "Hello."})
        assert r.status_code == 503 and "unavailable" in r.json()["error"]["message"]
        assert client.get("/health").status_code == 503
        assert client.get("/v1/models").json()["data"] == []


def test_overload_is_429_and_the_rest_complete(stack, tmp_path):
    """A second front on the same Triton, admitting one request at a time."""
    port = free_port()
    log = open(tmp_path / "front.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "frontend", "--triton-url", stack.grpc_url,
                             "--host", "127.0.0.1", "--port", str(port), "--max-in-flight", "1"],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        text = " ".join(["Every request here takes a little while to finish."] * 6)

        def post(_):
            return httpx.post(url + "/v1/audio/speech", json={"input": text}, timeout=120)

        with ThreadPoolExecutor(6) as pool:
            codes = [r.status_code for r in pool.map(post, range(6))]
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}, codes
        assert post(0).status_code == 200  # alone again, a request is served
        assert httpx.get(url + "/health").status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
