"""bf16 against fp32 in each family's vLLM stage, on its tiny random checkpoint, served: the
same checkpoint on two servers (every vLLM stage's dtype float32 on one, bfloat16 on the
other; every other stage fp32 on both), the same seeded requests to each. Per family:

  frames agreeing   how many of the vLLM stage's first frames (sampled codes or tokens)
                    are equal in both, of how many fp32 made; for a stage whose frames are
                    floats (latents, a condition) the largest difference instead
  audio             max-abs-diff of the whole audio (over the shorter), and the peak, where
                    every frame agreed

The vLLM stage's frames are read by running the ensemble's steps up to it over gRPC, each
step's inputs wired as the ensemble wires them, and reading the stage's own stream: its
first output, less each response's context frames (codes streamed with context), or, for a
stage that sends all of a segment so far, the response that ends each segment.

  .venv/bin/python -m tritontts.benchmark.dtype_drift [--families A,B] [--requests 4] [--json OUT]

Not a test. Drift it measures on any CPU that runs bfloat16 (tritontts.engine.engine_dtype);
speed is measured at released size (docs/triton-on-cpu.md, scripts/gpu_check.py on a GPU).
"""
from __future__ import annotations

import argparse
import json
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..families import FAMILIES

STREAM_FIELDS = {"stream_id", "chunk_index", "is_final", "left_context", "right_context", "first_frame",
                 "token_offset", "segment_end", "segment", "chunk_in_segment", "look_ahead", "whole"}


def engine_stages(family) -> list[str]:
    from ..deploy.profiles import engine_settings_path
    from ..deploy.repository import STAGE_REPOSITORY

    return [s for s in family.stages if engine_settings_path(STAGE_REPOSITORY / s)]


def stream(client, model: str, tensors: dict[str, np.ndarray], timeout: float) -> list[dict[str, np.ndarray]]:
    """Every response of one request to `model` (decoupled or not), as {output: array}."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    from ..deploy.repository import STAGE_REPOSITORY, read_config

    config = read_config(STAGE_REPOSITORY / model / "config.pbtxt")
    names = [o.name for o in config.output]
    results: queue.Queue = queue.Queue()
    inputs = []
    for name, array in tensors.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    responses, ended = [], False
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=timeout)
            if error is not None:
                ended = True
                raise RuntimeError(f"{model}: {error}")
            outputs = {n: result.as_numpy(n) for n in names if result.as_numpy(n) is not None}
            if outputs:
                responses.append(outputs)
            if result.get_response().parameters["triton_final_response"].bool_param:
                ended = True
                return responses
    finally:
        client.stop_stream(cancel_requests=not ended)


def engine_stream(url: str, family, text: str, params: dict, timeout: float = 600.0, timed=None):
    """(the vLLM stage's name, its responses) for one request: the ensemble's steps up to
    it run over gRPC, each fed as the ensemble feeds it. `timed`, a list, gets the vLLM
    step's (start, end) in time.monotonic() seconds."""
    import tritonclient.grpc as grpcclient

    from ..deploy.repository import ENSEMBLE_REPOSITORY, read_config

    steps = read_config(ENSEMBLE_REPOSITORY / family.name / "config.pbtxt").ensemble_scheduling.step
    engine = engine_stages(family)[0]
    tensors = {"text": np.array([[text.encode()]], np.object_), "voice": np.array([[b""]], np.object_),
               "params": np.array([[json.dumps(params).encode()]], np.object_)}
    client = grpcclient.InferenceServerClient(url)
    try:
        for step in steps:
            given = {model_input: tensors[name] for model_input, name in step.input_map.items()}
            began = time.monotonic()
            responses = stream(client, step.model_name, given, timeout)
            if step.model_name == engine:
                if timed is not None:
                    timed.append((began, time.monotonic()))
                return engine, responses
            (outputs,) = responses
            tensors.update({name: outputs[model_output] for model_output, name in step.output_map.items()})
    finally:
        client.close()
    raise ValueError(f"{family.name}: no vLLM stage among its steps")


def frames(responses: list[dict[str, np.ndarray]], primary: str) -> np.ndarray:
    """The stage's frames in order, from its responses (see the module's docstring)."""
    rows = []
    for k, r in enumerate(responses):
        out = r[primary][0]                                           # the batch's one row
        if "left_context" in r:
            right = int(r["right_context"].reshape(-1)[0]) if "right_context" in r else 0
            rows.append(out[int(r["left_context"].reshape(-1)[0]):len(out) - right])
        elif "segment_end" in r:
            if bool(r["segment_end"].reshape(-1)[0]) or k == len(responses) - 1:
                rows.append(out)
        else:
            rows.append(out)
    return np.concatenate(rows) if rows else np.zeros(0)


def compare(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    if a.dtype.kind in "iub":
        n = min(len(a), len(b))
        same = np.all((a[:n] == b[:n]).reshape(n, -1), axis=1)
        agree = int(n if same.all() else np.argmin(same))
        return {"frames_fp32": len(a), "frames_bf16": len(b), "frames_agreeing": agree,
                "all_agree": agree == len(a) == len(b)}
    n = min(len(a), len(b))
    diff = float(np.abs(a[:n].astype(np.float64) - b[:n]).max()) if n else 0.0
    return {"frames_fp32": len(a), "frames_bf16": len(b), "max_abs_diff": diff,
            "peak": float(np.abs(a).max()) if len(a) else 0.0, "all_agree": False}


def audio_of(url: str, family: str, text: str, params: dict) -> np.ndarray:
    from ..testing.grpc import stream_model

    chunks, error = stream_model(url, family, text, params=params, timeout=600)
    if error is not None:
        raise RuntimeError(f"{family}: {error}")
    return np.concatenate([c.as_numpy("audio").reshape(-1) for c in chunks] or [np.zeros(0, np.float32)])


def request(k: int, name: str) -> tuple[str, dict]:
    """The k-th seeded request of the family's capped load (tritontts.benchmark.load) as
    (text, params): the text and the fields the ensemble's params input carries."""
    from .load import TEXTS, capped_bodies

    body = capped_bodies(name)(k)
    return TEXTS[k % len(TEXTS)], {key: value for key, value in body.items()
                                   if key not in ("model", "input", "response_format", "stream_format")}


def measure_family(name: str, checkpoint: Path, work: Path, requests: int) -> dict[str, Any]:
    from ..deploy.repository import STAGE_REPOSITORY, read_config
    from ..testing.stack import TINY_KV_REQUESTS, Stack

    family = FAMILIES[name]
    engine = engine_stages(family)[0]
    primary = read_config(STAGE_REPOSITORY / engine / "config.pbtxt").output[0].name
    for dtype in ("float32", "bfloat16"):
        (work / dtype).mkdir(parents=True, exist_ok=True)
    stacks = {dtype: Stack(work / dtype, (name,), {name: checkpoint}, work / dtype / "caches",
                           extra_args=("--dtype", dtype, "--kv-requests", str(TINY_KV_REQUESTS)))
              for dtype in ("float32", "bfloat16")}
    rows = []
    try:
        for stack in stacks.values():
            stack.start(timeout=1800)
        for k in range(requests):
            text, params = request(k, name)
            got = {dtype: frames(engine_stream(stack.grpc_url, family, text, params)[1], primary)
                   for dtype, stack in stacks.items()}
            row = {"request": k, **compare(got["float32"], got["bfloat16"])}
            if row["all_agree"] or "max_abs_diff" in row:
                a, b = (audio_of(stacks[d].grpc_url, name, text, params) for d in ("float32", "bfloat16"))
                n = min(a.size, b.size)
                row["audio_max_abs_diff"] = float(np.abs(a[:n] - b[:n]).max()) if n else 0.0
                row["audio_peak"] = float(np.abs(a).max()) if a.size else 0.0
                row["audio_samples"] = [int(a.size), int(b.size)]
            rows.append(row)
            print(f"{name} request {k}: {row}", flush=True)
    finally:
        for stack in stacks.values():
            stack.stop()
    return {"family": name, "stage": engine, "output": primary, "requests": rows}


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| family | vLLM stage (output) | frames agreeing (fp32 made) per request | "
             "audio max-abs-diff where all agree (peak) |", "|---|---|---|---|"]
    for r in results:
        reqs = r["requests"]
        if reqs and "max_abs_diff" in reqs[0]:
            agreeing = "floats: max-abs-diff " + ", ".join(f"{q['max_abs_diff']:.2e} (peak {q['peak']:.2f})"
                                                          for q in reqs)
        else:
            agreeing = ", ".join(f"{q['frames_agreeing']}/{q['frames_fp32']}" for q in reqs)
        audio = ", ".join(f"{q['audio_max_abs_diff']:.1e} ({q['audio_peak']:.2f})"
                          for q in reqs if "audio_max_abs_diff" in q) or "-"
        lines.append(f"| {r['family']} | {r['stage']} ({r['output']}) | {agreeing} | {audio} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from .batching import checkpoint_at

    p = argparse.ArgumentParser(prog="python -m tritontts.benchmark.dtype_drift", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(n for n, f in FAMILIES.items() if engine_stages(f)))
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "tritontts-released")
    p.add_argument("--work", type=Path, default=Path(".cache/benchmarks/dtype-drift"))
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    results = []
    for name in [n.strip() for n in args.families.split(",") if n.strip()]:
        results.append(measure_family(name, checkpoint_at(name, "tiny", args.cache), args.work / name,
                                      args.requests))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    print("\n" + table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
