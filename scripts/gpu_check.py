"""The prepared GPU check: a few minutes on a CUDA machine, one summary table at the end.
Two tiers (docs/gpu.md, "The prepared check"):

  python3 scripts/gpu_check.py --tier torch [--families A,B] [--out DIR]
      needs only PyTorch and this package (numpy 2 is fine): every network our stages run
      in PyTorch, device vs CPU fp32, bf16/fp16 drift, batch 1/4/8 timings at released
      sizes (tritontts.benchmark.gpu_torch). For the research images we can borrow.
  .venv/bin/python scripts/gpu_check.py [--tier full] [--out DIR] [--skip-contract] [--skip-serving]
      the whole stack (the Dockerfile's image: tritonserver, CUDA vLLM, TensorRT); a step
      whose component is missing is one row saying so ("skipped: ... not installed").

Never needed by CI (tests pass on the CPU); `--cpu-dry-run` runs either tier's code here at
tiny sizes (CI runs the torch tier's). Full tier steps, each a block of rows in the table:

  1. environment   GPU, CUDA, TensorRT and onnxruntime providers found
  2. engines       every exportable network of the tiny random checkpoints: TensorRT fp32
                   and fp16 engines built (seconds), their max-abs-diff against PyTorch on
                   the GPU, and onnxruntime's CUDA provider the same way (fp16 drift is
                   what decides whether the gpu profile's precision=fp16 stands)
  3. networks      released sizes, random weights: PyTorch eager vs TensorRT fp16 vs
                   onnxruntime CUDA per network at streaming shapes (median ms)
  4. batching      released sizes, random weights: each stage that computes Triton's
                   batches together, batch 1 / 4 / 8, one call vs one by one
                   (tritontts.benchmark.batching; docs/benchmarks.md, "Batched compute")
  5. contract      the family contract suite (tests/contract) with the gpu profile
  6. serving       released-size random checkpoints served with --profile gpu: time to
                   first audio and real-time factor at concurrency 1 and 8

--cpu-dry-run runs the same code on this CPU at tiny sizes with the TensorRT rows marked
as skipped (what CI machines can check of this script).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from tritontts.benchmark.gpu_torch import median_ms  # noqa: E402
from tritontts.families import FAMILIES  # noqa: E402
from tritontts.nn.runtime import (
    OnnxRuntimeRunner, TensorRTRunner, TorchRunner, compare, ensure_onnx, ensure_tensorrt_engine)

ROWS: list[dict] = []


def row(step: str, what: str, result: str, **numbers) -> None:
    ROWS.append({"step": step, "what": what, "result": result, **numbers})
    extra = "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items())
    print(f"[{step}] {what}: {result}  {extra}", flush=True)


def step(name: str, fn, *args) -> None:
    """A failing step is a row saying why; the check goes on with the next one."""
    try:
        fn(*args)
    except Exception as exc:      # noqa: BLE001 - the table must still come out
        traceback.print_exc()
        row(name, "step failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def missing(*modules: str) -> str | None:
    """'skipped: X not installed' for the first module this Python cannot import, else None."""
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            return f"skipped: {module} not installed"
    return None


def tritonserver_missing() -> str | None:
    try:
        from tritontts.deploy.tritonserver import pytriton_root
        return None if (pytriton_root() / "bin" / "tritonserver").is_file() else "skipped: no tritonserver"
    except Exception as exc:      # noqa: BLE001
        return f"skipped: no tritonserver ({type(exc).__name__})"


def environment(device: str) -> None:

    if device.startswith("cuda"):
        row("environment", "GPU", torch.cuda.get_device_name(device),
            memory_gib=torch.cuda.get_device_properties(device).total_memory / 2 ** 30)
        row("environment", "torch", f"{torch.__version__} CUDA {torch.version.cuda}")
    else:
        row("environment", "device", "cpu (dry run)")
    import numpy
    row("environment", "python", sys.version.split()[0])
    row("environment", "numpy", numpy.__version__)
    try:
        import tensorrt
        row("environment", "TensorRT", tensorrt.__version__)
    except ImportError:
        row("environment", "TensorRT", "not installed")
    if missing("onnxruntime"):
        row("environment", "onnxruntime", "not installed")
    else:
        import onnxruntime as ort
        row("environment", "onnxruntime", f"{ort.__version__} {','.join(ort.get_available_providers())}")
    for module in ("vllm", "tritonclient"):
        row("environment", module, "not installed" if missing(module) else "installed")
    row("environment", "tritonserver", tritonserver_missing() or "installed")


def tiny_graphs(work: Path) -> list:
    graphs = []
    for name, family in FAMILIES.items():
        if family.graphs and family.write_random_checkpoint:
            checkpoint = family.write_random_checkpoint(work / "tiny" / name)
            graphs += family.export_graphs(checkpoint)
    return graphs


def engines(work: Path, device: str) -> None:
    root = work / "engines"
    for graph in tiny_graphs(work):
        graph.module.to(device)
        for precision in ("fp32", "fp16"):
            skip = "skipped: no GPU" if not device.startswith("cuda") else missing("tensorrt")
            if skip:
                row("engines", f"{graph.name} TensorRT {precision}", skip)
                continue
            start = time.perf_counter()
            engine = ensure_tensorrt_engine(graph, root, fp16=precision == "fp16")
            built = time.perf_counter() - start
            diff, scale = compare(graph, TensorRTRunner(engine, graph, device))
            row("engines", f"{graph.name} TensorRT {precision}",
                "ok" if diff <= (1e-4 if precision == "fp32" else 2e-2) * max(scale, 1) else "DRIFT",
                build_s=built, max_abs_diff=diff, scale=scale)
        if missing("onnxruntime"):
            row("engines", f"{graph.name} onnxruntime", missing("onnxruntime"))
            continue
        runner = OnnxRuntimeRunner(ensure_onnx(graph, root), graph, device)
        diff, scale = compare(graph, runner)
        row("engines", f"{graph.name} onnxruntime {runner.detail}",
            "ok" if diff <= 1e-4 * max(scale, 1) else "DRIFT", max_abs_diff=diff, scale=scale)


def networks(work: Path, device: str, released: bool) -> None:
    from benchmark_runtimes import SHAPES, released_graphs

    graphs = released_graphs() if released else tiny_graphs(work)
    for graph in graphs:
        graph.module.to(device)
        runners = {"torch": TorchRunner(graph)}
        if not missing("onnxruntime"):
            runners["onnxruntime"] = OnnxRuntimeRunner(ensure_onnx(graph, work / "engines-released"),
                                                       graph, device)
        if device.startswith("cuda") and not missing("tensorrt"):
            engine = ensure_tensorrt_engine(graph, work / "engines-released", fp16=True)
            runners["tensorrt fp16"] = TensorRTRunner(engine, graph, device)
        for shape in SHAPES[graph.name]:
            sizes = graph.sizes() if shape == "opt" else graph.sizes(
                {k: min(v, graph.axes[k].max) for k, v in shape.items() if k in graph.axes})
            inputs = graph.example(sizes, seed=1, device=device)
            with torch.inference_mode():
                timings = {name: median_ms(lambda r=r: r(*inputs), device, 5) for name, r in runners.items()}
            shown = {k: v for k, v in sizes.items() if k in graph.axes and k != "batch"}
            row("networks", f"{graph.name} {shown}", "ms: " + ", ".join(
                f"{name} {ms:.1f}" for name, ms in timings.items()),
                **{f"torch_over_{name.replace(' ', '_')}": timings["torch"] / ms
                   for name, ms in timings.items() if name != "torch"})


def batching(work: Path, device: str, released: bool) -> None:
    """Batched compute on vs off per stage (tritontts.benchmark.batching), batch 1 / 4 / 8."""
    from tritontts.benchmark.batching import checkpoint_at, measure_family

    for name, family in FAMILIES.items():
        if not family.batch_cases:
            continue
        path = checkpoint_at(name, "released" if released else "tiny", work / "batching")
        for r in measure_family(name, path, device, rounds=3 if released else 1):
            row("batching", f"{r['stage']} batch {r['batch']} ({r['shape']})",
                f"req/s on {r['on']['requests_per_s']:.2f}, off {r['off']['requests_per_s']:.2f}",
                on_over_off=r["ratio"], audio_s_per_s_on=r["on"]["audio_s_per_s"])


def contract(device: str) -> None:
    skip = missing("vllm", "tritonclient", "pytest") or tritonserver_missing()
    if skip:
        row("contract", "tests/contract", skip)
        return
    env = {**os.environ, "TRITONTTS_PROFILE": "gpu" if device.startswith("cuda") else "cpu"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           "tests/contract"], cwd=REPO, env=env, capture_output=True, text=True)
    summary = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    row("contract", f"tests/contract with the {env['TRITONTTS_PROFILE']} profile",
        "passed" if proc.returncode == 0 else f"FAILED: {summary}", seconds=time.perf_counter() - start)
    if proc.returncode:
        print(proc.stdout[-6000:], proc.stderr[-3000:], sep="\n")


def serving(work: Path, device: str, released: bool) -> None:
    skip = missing("vllm", "tritonclient", "fastapi") or tritonserver_missing()
    if skip:
        row("serving", "benchmark", skip)
        return
    sizes = {"cosyvoice3": "released", "qwen3_tts": "0.6b", "omnivoice": "released"} if released else {}
    checkpoints = []
    for name, family in FAMILIES.items():
        if not family.write_random_checkpoint:
            continue
        options = {"size": sizes[name]} if name in sizes else {}
        path = family.write_random_checkpoint(work / "serving" / name, **options)
        checkpoints += ["--checkpoint", f"{name}={path}"]
    out = work / "serving-report"
    env = {**os.environ, "TRITONTTS_PROFILE": "gpu" if device.startswith("cuda") else "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "tritontts.benchmark", "--families", ",".join(FAMILIES),
         *checkpoints, "--concurrency", "1,8", "--seconds", "20" if released else "5",
         "--no-perf-analyzer", "--no-progress", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        row("serving", "benchmark", f"FAILED (exit {proc.returncode})")
        return
    report = json.loads((out / "results.json").read_text())
    for model, result in report["models"].items():
        for level in result["levels"]:
            row("serving", f"{model} concurrency {level['concurrency']}",
                f"{level['ok']} ok, {level['errors']} errors, {level['rejected']} rejected",
                ttfa_p50_s=level["ttfa_p50"] or float("nan"),
                rtf_p50=level["rtf_p50"] or float("nan"),
                audio_s_per_s=level["audio_s_per_s"] or float("nan"))


def torch_tier(work: Path, device: str, released: bool, families: list[str] | None, start: float) -> int:
    from tritontts.benchmark import gpu_torch

    environment(device)
    rows = gpu_torch.run(device, released, families, work)
    seconds = time.perf_counter() - start
    text = (table() + "\n" + gpu_torch.table(rows)
            + f"\n{seconds:.0f} s in all on {device}; work files in {work}\n")
    (work / "gpu_torch.md").write_text(text)
    (work / "gpu_torch.json").write_text(json.dumps(
        {"device": device, "released": released, "seconds": seconds, "environment": ROWS, "rows": rows,
         "imported": gpu_torch.imported_modules()}, indent=1))
    print("\n" + text)
    return 1 if gpu_torch.failed(rows) else 0


def table() -> str:
    lines = ["| step | what | result | numbers |", "|---|---|---|---|"]
    for r in ROWS:
        numbers = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in r.items() if k not in ("step", "what", "result"))
        lines.append(f"| {r['step']} | {r['what']} | {r['result']} | {numbers} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", choices=("full", "torch"), default="full")
    parser.add_argument("--families", help="the torch tier's families, comma-separated (default: all)")
    parser.add_argument("--out", type=Path, help="folder for the table and work files")
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument("--skip-contract", action="store_true")
    parser.add_argument("--skip-serving", action="store_true")
    args = parser.parse_args(argv)
    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("no CUDA device: this check is for a GPU machine (--cpu-dry-run to try it here)")
        return 2
    device = "cpu" if args.cpu_dry_run else "cuda:0"
    released = not args.cpu_dry_run
    work = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRITONTTS_CACHE", str(work / "cache"))
    start = time.perf_counter()
    if args.tier == "torch":
        return torch_tier(work, device, released, args.families.split(",") if args.families else None, start)
    step("environment", environment, device)
    step("engines", engines, work, device)
    step("networks", networks, work, device, released)
    step("batching", batching, work, device, released)
    if not args.skip_contract:
        step("contract", contract, device)
    if not args.skip_serving:
        step("serving", serving, work, device, released)
    text = table() + f"\n\n{time.perf_counter() - start:.0f} s in all; work files in {work}\n"
    (work / "gpu_check.md").write_text(text)
    (work / "gpu_check.json").write_text(json.dumps(ROWS, indent=1))
    print("\n" + text)
    return 1 if any(str(r["result"]).startswith(("FAILED", "DRIFT", "step failed")) for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
