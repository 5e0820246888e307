"""Triton-level numbers: perf_analyzer `--streaming` on a family's ensemble and on each of
its stage models, with input-data files made from a real request.

A stage's input data is what the stage before it really sends: the ensemble's steps (read
from the served ensemble's config) are walked in order, each stage is called once over gRPC
streaming with the inputs its step maps, and its first response becomes the next stage's
inputs. Each data entry then gets its own stream_id and is_final = true, so every request
perf_analyzer sends is a whole (one-chunk) stream to a stage that keys per-stream state
by stream_id, and concurrent requests never share one.
"""
from __future__ import annotations

import base64
import csv
import json
import queue
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..protocol import IS_FINAL, STREAM_ID

# perf_analyzer's output columns we report, in microseconds. For a decoupled model 2.51
# measures a request until its last response (a 2-sentence piper request: both sentences),
# so time to first audio comes from the front-level load (load.py), not from here.
LATENCY_COLUMNS = {"p50": "p50 latency", "p95": "p95 latency", "p99": "p99 latency"}


def perf_analyzer_path() -> Path:
    exe = Path(sys.executable).with_name("perf_analyzer")
    if not exe.exists():
        raise FileNotFoundError(f"{exe} is missing: scripts/setup.sh installs perf_analyzer")
    return exe


def _config(client, model: str):
    return client.get_model_config(model).config


def ensemble_steps(client, ensemble: str) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """[(stage model, its input -> ensemble tensor, its output -> ensemble tensor)] in order."""
    config = _config(client, ensemble)
    return [(step.model_name, dict(step.input_map), dict(step.output_map))
            for step in config.ensemble_scheduling.step]


def _call(url: str, model: str, tensors: dict[str, np.ndarray], outputs: list[str],
          timeout: float) -> dict[str, np.ndarray]:
    """One streaming request to a stage; its first response's outputs."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        inputs = []
        for name, value in tensors.items():
            tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        client.async_stream_infer(model, inputs,
                                  outputs=[grpcclient.InferRequestedOutput(o) for o in outputs])
        result, error = results.get(timeout=timeout)
        if error is not None:
            raise RuntimeError(f"{model}: {error}")
        return {o: result.as_numpy(o) for o in outputs}
    finally:
        client.stop_stream()
        client.close()


def capture_stage_inputs(url: str, ensemble: str, text: str, params: dict[str, Any],
                         timeout: float = 300.0) -> dict[str, dict[str, np.ndarray]]:
    """{stage model: the input tensors it receives on a real request's first chunk}."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        steps = ensemble_steps(client, ensemble)
        batched = {model: _config(client, model).max_batch_size > 0 for model, _, _ in steps}
    finally:
        client.close()
    shape = lambda model: [1, 1] if batched[model] else [1]   # noqa: E731
    first = steps[0][0]
    tensors = {"text": np.array([text.encode()], dtype=np.object_).reshape(shape(first)),
               "voice": np.array([b""], dtype=np.object_).reshape(shape(first)),
               "params": np.array([json.dumps(params).encode()], dtype=np.object_).reshape(shape(first))}
    captured = {}
    for model, input_map, output_map in steps:
        inputs = {name: tensors[source] for name, source in input_map.items()}
        captured[model] = inputs
        outputs = _call(url, model, inputs, list(output_map), timeout)
        tensors.update({output_map[name]: value for name, value in outputs.items()})
    return captured


def _json_tensor(value: np.ndarray, batched: bool) -> dict[str, Any]:
    shape = list(value.shape[1:] if batched else value.shape)
    if value.dtype == np.object_:
        items = [v if isinstance(v, bytes) else str(v).encode() for v in value.reshape(-1)]
        try:
            return {"content": [v.decode("utf-8") for v in items], "shape": shape}
        except UnicodeDecodeError:   # perf_analyzer takes raw BYTES as length-prefixed b64
            raw = b"".join(len(v).to_bytes(4, "little") + v for v in items)
            return {"b64": base64.b64encode(raw).decode(), "shape": shape}
    return {"content": value.reshape(-1).tolist(), "shape": shape}


def input_data(tensors: dict[str, np.ndarray], batched: bool, entries: int = 16) -> dict[str, Any]:
    """perf_analyzer's --input-data JSON: `entries` copies, each its own whole stream."""
    data = []
    for i in range(entries):
        entry = {}
        for name, value in tensors.items():
            if name == STREAM_ID:
                value = np.full_like(value, 7_000_000 + i)
            elif name == IS_FINAL:
                value = np.ones_like(value)
            entry[name] = _json_tensor(value, batched)
        data.append(entry)
    return {"data": data}


def run_perf_analyzer(grpc_url: str, model: str, data_file: Path, concurrency: list[int],
                      requests_per_window: int, workdir: Path, timeout: float = 900.0
                      ) -> list[dict[str, Any]]:
    """perf_analyzer --streaming at each concurrency level (one run per level: its ranges
    step linearly); one row per level: requests/s, responses/s, latencies in ms (request
    sent -> its last response)."""
    rows = []
    for level in concurrency:
        csv_file = workdir / f"{model}.c{level}.csv"
        cmd = [str(perf_analyzer_path()), "-m", model, "-u", grpc_url, "-i", "grpc",
               "--streaming", "--input-data", str(data_file),
               "--concurrency-range", f"{level}:{level}",
               "--measurement-mode", "count_windows",
               "--measurement-request-count", str(max(requests_per_window, level)),
               # A stage whose requests take seconds on a shared CPU rarely meets
               # perf_analyzer's 10 % stability rule; take the windows it measured rather
               # than fail (numbers are reported with the machine, never asserted).
               "--stability-percentage", "1000", "--max-trials", "3", "-f", str(csv_file)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"perf_analyzer on {model} at concurrency {level} failed "
                               f"({out.returncode}): {(out.stdout + out.stderr)[-1500:]}")
        with open(csv_file) as f:
            for row in csv.DictReader(f):
                rows.append({"concurrency": int(row["Concurrency"]),
                             "throughput": float(row["Inferences/Second"]),
                             "responses_per_s": float(row.get("Response Throughput") or 0.0),
                             **{k: float(row[c]) / 1000.0 for k, c in LATENCY_COLUMNS.items()}})
    return rows


def ensemble_input_data(text: str, params: dict[str, Any]) -> dict[str, Any]:
    """perf_analyzer's --input-data for a family's ensemble: one request's text and params."""
    return {"data": [{"text": {"content": [text], "shape": [1]},
                      "voice": {"content": [""], "shape": [1]},
                      "params": {"content": [json.dumps(params)], "shape": [1]}}]}


def profile_family(grpc_url: str, ensemble: str, text: str, params: dict[str, Any],
                   workdir: Path, concurrency: list[int], requests_per_window: int,
                   stages: bool = True) -> dict[str, Any]:
    """perf_analyzer on the ensemble (its own text input) and on each stage (captured
    inputs). A stage perf_analyzer cannot drive is reported with its error, not hidden."""
    import tritonclient.grpc as grpcclient

    workdir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    ensemble_data = workdir / f"{ensemble}.json"
    ensemble_data.write_text(json.dumps(ensemble_input_data(text, params)))
    targets = [(ensemble, ensemble_data)]
    if stages:
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            captured = capture_stage_inputs(grpc_url, ensemble, text, params)
            for model, tensors in captured.items():
                batched = _config(client, model).max_batch_size > 0
                path = workdir / f"{model}.json"
                path.write_text(json.dumps(input_data(tensors, batched)))
                targets.append((model, path))
        finally:
            client.close()
    for model, path in targets:
        try:
            report[model] = run_perf_analyzer(grpc_url, model, path, concurrency,
                                              requests_per_window, workdir)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            report[model] = {"error": str(exc)}
    return report
