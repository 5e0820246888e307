"""Serving overhead at concurrency 1: the same request, in turn, (1) through the stage code in
this process (inprocess.py), (2) straight to tritonserver over gRPC streaming, (3) through
the OpenAI front over HTTP. Interleaved request by request, each path first in turn, so
this machine's noise (and any order effect) hits the three paths alike; time to first audio
and real-time factor per path, and the differences.
"""
from __future__ import annotations

import asyncio
import json
import queue
import time
from typing import Any, Sequence

import httpx

from ..family import Family
from ..testing.grpc import ensemble_inputs
from .inprocess import InProcessEnsemble
from .load import RequestResult, TEXTS, percentile, stream_one


def grpc_stream(url: str, model: str, text: str, params: dict[str, Any],
                timeout: float = 600.0) -> RequestResult:
    """One request straight to the ensemble over tritonclient gRPC streaming, timed like
    the HTTP client's (the stream is opened before the clock starts, as a client that
    keeps its stream would)."""
    import tritonclient.grpc as grpcclient

    result = RequestResult(chars=len(text))
    arrivals: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: arrivals.put((time.perf_counter(), result, error)))
    try:
        inputs = ensemble_inputs(text, "", params)
        start = time.perf_counter()
        client.async_stream_infer(model, inputs)
        while True:
            now, response, error = arrivals.get(timeout=timeout)
            if error is not None:
                result.error = str(error)
                break
            audio = response.as_numpy("audio")
            rate = int(response.as_numpy("sample_rate").reshape(-1)[0])
            if result.first_audio is None:
                result.first_audio = now - start
            result.pieces.append((now - start, audio.size / rate))
            if bool(response.as_numpy("is_final").reshape(-1)[0]):
                result.status = 200
                break
        result.wall = time.perf_counter() - start
    finally:
        client.stop_stream()
        client.close()
    return result


def _summary(results: Sequence[RequestResult]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    return {"requests": len(results), "ok": len(ok),
            "errors": sorted({r.error or f"HTTP {r.status}" for r in results if not r.ok})[:3],
            "ttfa_p50": percentile([r.first_audio for r in ok], 50),
            "rtf_p50": percentile([r.rtf for r in ok], 50)}


def measure(family: Family, model: str, inprocess: InProcessEnsemble, front_url: str,
            grpc_url: str, extra: dict[str, Any], rounds: int,
            texts: Sequence[str] = (TEXTS[0], TEXTS[3])) -> dict[str, Any]:
    """Per text (short and longer), `rounds` requests on each path, interleaved."""
    paths: dict[str, dict[str, list[RequestResult]]] = {}
    seeded = "seed" in family.fields.takes

    async def over_http(body):
        async with httpx.AsyncClient(timeout=600) as client:
            await client.get(front_url + "/health")            # connection open, as in (2)
            return await stream_one(client, front_url + "/v1/audio/speech", body,
                                    family.capabilities.sample_rate)

    for text in texts:
        label = f"{len(text.split('. '))} sentence(s)"
        runs = paths.setdefault(label, {"in-process": [], "triton gRPC": [], "front HTTP": []})
        for i in range(rounds + 1):          # round 0 warms every path up and is dropped
            params = {**extra, **({"seed": i} if seeded else {})}

            def local():
                start = time.perf_counter()
                timeline = inprocess.synthesize(text, json.dumps(params))
                return RequestResult(chars=len(text), status=200 if timeline.error is None else 500,
                                     error=timeline.error, pieces=timeline.pieces,
                                     first_audio=timeline.pieces[0][0] if timeline.pieces else None,
                                     wall=time.perf_counter() - start)

            body = {"model": model, "input": text, "response_format": "pcm",
                    "stream_format": "audio", **params}
            arms = [("in-process", local), ("triton gRPC", lambda: grpc_stream(grpc_url, model, text, params)),
                    ("front HTTP", lambda: asyncio.run(over_http(body)))]
            for name, run in arms[i % 3:] + arms[:i % 3]:    # each path goes first in turn
                result = run()
                if i:
                    runs[name].append(result)
    report = {}
    for label, runs in paths.items():
        summary = {path: _summary(results) for path, results in runs.items()}
        base = summary["in-process"]
        for path in ("triton gRPC", "front HTTP"):
            s = summary[path]
            if None not in (s["ttfa_p50"], base["ttfa_p50"], s["rtf_p50"], base["rtf_p50"]):
                s["ttfa_overhead_ms"] = (s["ttfa_p50"] - base["ttfa_p50"]) * 1000
                s["rtf_ratio"] = s["rtf_p50"] / base["rtf_p50"]
        report[label] = summary
    return report


def markdown(model: str, report: dict[str, Any]) -> list[str]:
    lines = [f"Serving overhead, {model}, concurrency 1 (median of interleaved requests):", "",
             "| input | path | TTFA (ms) | RTF | TTFA over in-process | RTF vs in-process |",
             "|---|---|---:|---:|---:|---:|"]
    for label, summary in report.items():
        for path, s in summary.items():
            ttfa = "–" if s["ttfa_p50"] is None else f"{s['ttfa_p50'] * 1000:.0f}"
            rtf = "–" if s["rtf_p50"] is None else f"{s['rtf_p50']:.3f}"
            extra = (f"{s['ttfa_overhead_ms']:+.0f} ms | ×{s['rtf_ratio']:.3f}"
                     if "rtf_ratio" in s else "– | –")
            lines.append(f"| {label} | {path} | {ttfa} | {rtf} | {extra} |")
    return lines
