"""The GPU check's PyTorch tier: every network our stages run in PyTorch, on a CUDA device
where only PyTorch and this package are installed (the research images we can borrow for a
few minutes: no vLLM, TensorRT or tritonserver, numpy 2).

  python3 scripts/gpu_check.py --tier torch [--out DIR] [--families A,B]
  .venv/bin/python scripts/gpu_check.py --tier torch --cpu-dry-run      (what CI runs)

Each family declares its networks (Family.torch_networks: Graphs with random weights at
"tiny" or "released" size). Per network, rows of one table:

  parity    tiny size, seeded inputs: the device's fp32 output against the CPU's fp32 output
            (max-abs-diff; MISMATCH above FP32_TOLERANCE x max(1, largest |output|), TF32
            off), and the bf16 and fp16 drift against fp32 on the device (reported; only a
            non-finite output is flagged)
  timing    released size (tiny in a dry run) at the streaming shape, batch 1 / 4 / 8:
            median ms of eager fp32 and bf16 calls, and of a CUDA graph replay of the fp32
            call where the network can be captured (on CUDA only)
  batching  the stages that compute Triton's batches together, batch 1 / 4 / 8, one call vs
            one by one (tritontts.benchmark.batching) on the tiny checkpoints

The dry run takes the same code paths on the CPU at tiny sizes (the CUDA-only rows say
"skipped: no GPU"), so CI proves the tier imports and runs with only what the image has.
"""
from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from ..families import FAMILIES
from ..nn.runtime import Graph

BATCHES = (1, 4, 8)
# fp32 on two devices differs by summation order only: 1e-4 of the output's scale is far
# above that and far below what a wrong placement or dtype makes (tests/test_gpu_torch.py).
FP32_TOLERANCE = 1e-4
# Codes a network samples greedily (a code predictor's frame): one near-tie argmax that
# flips between devices changes the rest of that frame, so agreement, not equality.
CODES_AGREE = 0.9
LOW_PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}

Row = dict[str, Any]


def batch_axis(graph: Graph) -> str | None:
    """The first input's first axis, when it is a dynamic one."""
    first = graph.inputs[0].shape[0] if graph.inputs and graph.inputs[0].shape else None
    return first if isinstance(first, str) else None


def cast_inputs(inputs: Iterable[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)


def call(graph: Graph, inputs) -> tuple[torch.Tensor, ...]:
    """The graph's module on `inputs` (wherever and in whatever dtype it is now)."""
    with torch.inference_mode():
        return graph.torch_call(*inputs)


def compare(got: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> Row:
    """max_abs_diff over the float outputs; codes_agree (the fraction of equal entries)
    over the integer ones (sampled codes: one flipped argmax changes the rest of a frame)."""
    if len(got) != len(expected):
        raise ValueError(f"{len(got)} outputs against {len(expected)}")
    diffs, agree = [], []
    for a, b in zip(got, expected):
        if a.shape != b.shape:
            raise ValueError(f"output shape {tuple(a.shape)} against {tuple(b.shape)}")
        a, b = a.detach().cpu(), b.detach().cpu()
        if not a.numel():
            continue
        if a.is_floating_point():
            diffs.append(float((a.double() - b.double()).abs().max()))
        else:
            agree.append(float((a == b).double().mean()))
    out: Row = {}
    if diffs:
        out["max_abs_diff"] = max(diffs)
    if agree:
        out["codes_agree"] = min(agree)
    return out


def finite(outputs: tuple[torch.Tensor, ...]) -> bool:
    return all(bool(torch.isfinite(t.float()).all()) for t in outputs if t.is_floating_point())


def fp32_verdict(numbers: Row, scale: float) -> str:
    """ok when two fp32 runs agree as two devices' summation orders allow, else MISMATCH."""
    good = (numbers.get("max_abs_diff", 0.0) <= FP32_TOLERANCE * max(1.0, scale)
            and numbers.get("codes_agree", 1.0) >= CODES_AGREE)
    return "ok" if good else "MISMATCH"


def scale_of(outputs: tuple[torch.Tensor, ...]) -> float:
    return max((float(t.detach().abs().max()) for t in outputs if t.is_floating_point() and t.numel()),
               default=1.0)


@contextlib.contextmanager
def cast(module: torch.nn.Module, dtype: torch.dtype):
    """The module's floating weights and buffers as `dtype` inside the block, their exact
    fp32 values back after it (no copy of the module: some hold objects deepcopy refuses)."""
    saved = {id(t): (t, t.data) for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()}
    try:
        for tensor, data in saved.values():
            tensor.data = data.to(dtype)
        yield module
    finally:
        for tensor, data in saved.values():
            tensor.data = data


def parity(graph: Graph, device: str, precisions: tuple[str, ...] = tuple(LOW_PRECISIONS)) -> list[Row]:
    """Device fp32 vs CPU fp32, then bf16 / fp16 vs fp32 on the device, at tiny size."""
    rows = []
    module = graph.module.eval().to("cpu")
    inputs = graph.example(seed=0)
    expected = call(graph, inputs)
    scale = scale_of(expected)
    reference = expected
    if not finite(expected):
        return [{"what": f"{graph.name} cpu fp32", "result": "NON-FINITE"}]
    if not device.startswith("cuda"):
        rows.append({"what": f"{graph.name} {device} vs cpu fp32", "result": "skipped: no GPU"})
    else:
        module.to(device)
        reference = call(graph, tuple(t.to(device) for t in inputs))
        numbers = compare(reference, expected)
        rows.append({"what": f"{graph.name} {device} vs cpu fp32", "result": fp32_verdict(numbers, scale),
                     **numbers, "scale": scale})
    device_inputs = tuple(t.to(device) for t in inputs)
    for label in precisions:
        dtype = LOW_PRECISIONS[label]
        try:
            with cast(module, dtype):
                got = call(graph, cast_inputs(device_inputs, dtype))
        except Exception as exc:        # noqa: BLE001 - e.g. a CPU kernel with no fp16 build
            rows.append({"what": f"{graph.name} {label} vs fp32", "result": f"unsupported: {first_line(exc)}"})
            continue
        numbers = compare(tuple(t.float() if t.is_floating_point() else t for t in got), reference)
        if "max_abs_diff" in numbers:
            numbers["relative"] = numbers["max_abs_diff"] / max(scale, 1e-12)
        rows.append({"what": f"{graph.name} {label} vs fp32", "result": "ok" if finite(got) else "NON-FINITE",
                     **numbers})
    return rows


def median_ms(fn: Callable[[], Any], device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):                 # the first call sets up (kernels, caches)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[1:])


def cuda_graph_ms(module: torch.nn.Module, inputs, device: str, repeats: int) -> float:
    """Median ms of replaying one captured fp32 call (static inputs, static shapes)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(2):                       # warm up outside the capture
            module(*inputs)
    torch.cuda.current_stream(device).wait_stream(stream)
    captured = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(captured):
        module(*inputs)
    return median_ms(captured.replay, device, repeats)


def timing(graph: Graph, device: str, batches=BATCHES, repeats: int = 5) -> list[Row]:
    rows = []
    module = graph.module.eval().to(device)
    axis = batch_axis(graph)
    for batch in (batches if axis else (1,)):
        sizes = graph.sizes({axis: min(batch, graph.axes[axis].max)} if axis else None)
        inputs = graph.example(sizes, seed=1, device=device)
        shown = {k: v for k, v in sizes.items() if k in graph.axes}
        numbers: Row = {"fp32_ms": median_ms(lambda: call(graph, inputs), device, repeats)}
        try:
            low_inputs = cast_inputs(inputs, torch.bfloat16)
            with cast(module, torch.bfloat16):
                numbers["bf16_ms"] = median_ms(lambda: call(graph, low_inputs), device, repeats)
        except Exception as exc:        # noqa: BLE001
            numbers["bf16"] = f"unsupported: {first_line(exc)}"
        result = "ok"
        if device.startswith("cuda"):
            try:
                numbers["cuda_graph_ms"] = cuda_graph_ms(module, inputs, device, repeats)
            except Exception as exc:    # noqa: BLE001 - a network that syncs with the host
                result = f"no CUDA graph: {first_line(exc)}"
        rows.append({"what": f"{graph.name} {shown}", "result": result, **numbers})
    return rows


def parameters(graph: Graph) -> int:
    return sum(p.numel() for p in graph.module.parameters())


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def networks(name: str, size: str) -> list[Graph]:
    family = FAMILIES[name]
    torch.manual_seed(0)
    return list(family.torch_networks(size)) if family.torch_networks else []


def run(device: str, released: bool, families: list[str] | None = None, work: Path | None = None,
        batching_step: bool = True) -> list[Row]:
    """Every row of the tier, each with its step and family; a failure is a row saying why."""
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False      # fp32 means fp32 here
        torch.backends.cudnn.allow_tf32 = False
    names = families or [n for n, f in FAMILIES.items() if f.torch_networks]
    rows: list[Row] = []

    def add(step: str, family: str, new: list[Row]) -> None:
        for r in new:
            r = {"step": step, "family": family, **r}
            rows.append(r)
            extra = "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in r.items() if k not in ("step", "family", "what", "result"))
            print(f"[{step}] {r['what']}: {r['result']}  {extra}", flush=True)

    def guarded(step: str, family: str, what: str, fn: Callable[[], list[Row]]) -> None:
        try:
            add(step, family, fn())
        except Exception as exc:        # noqa: BLE001 - the table must still come out
            traceback.print_exc()
            add(step, family, [{"what": what, "result": f"FAILED: {first_line(exc)}"}])

    def built(step: str, family: str, size: str, on: str) -> list[Graph]:
        out: list[Graph] = []
        with torch.device(on):
            guarded(step, family, f"{family} networks ({size})", lambda: out.extend(networks(family, size)) or [])
        return out

    # A dry run (tiny sizes on the CPU, what CI runs) takes every code path once, cheaply:
    # the tiny networks timed as built for parity, batch 1 and 8, bf16 drift only (fp16 is
    # the same path with another dtype, and slow on a CPU).
    dry = not released and not device.startswith("cuda")
    for name in names:
        began = time.perf_counter()
        tiny = built("parity", name, "tiny", "cpu")
        for graph in tiny:
            guarded("parity", name, graph.name,
                    lambda g=graph: parity(g, device, ("bf16",) if dry else tuple(LOW_PRECISIONS)))
        size = "released" if released else "tiny"
        # Released modules are made on the device itself: random init of ~1e9 weights is
        # seconds there and minutes on the host.
        for graph in (built("timing", name, size, device) if released else tiny):
            add("timing", name, [{"what": f"{graph.name} parameters", "result": size,
                                  "parameters": parameters(graph)}])
            guarded("timing", name, graph.name, lambda g=graph: timing(
                g, device, (1, 8) if dry else BATCHES, repeats=1 if dry else 5))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        add("family", name, [{"what": f"{name} done", "result": "ok", "seconds": time.perf_counter() - began}])
    if batching_step:
        # A dry run measures one family's batched stages: every family's cases run the same
        # code (tritontts.benchmark.batching), and its checkpoints and stages are what cost.
        batched = [n for n in names if FAMILIES[n].batch_cases][:1] if dry else names
        guarded("batching", "all", "batched stages", lambda: batching(device, batched, work, dry))
    return rows


def batching(device: str, names: list[str], work: Path | None, dry: bool = False) -> list[Row]:
    """The batched stages on the tiny checkpoints, one call vs one by one."""
    from .batching import checkpoint_at, measure_family

    cache = (work or Path(tempfile.mkdtemp(prefix="gpu-torch-"))) / "batching"
    rows = []
    for name in names:
        if not FAMILIES[name].batch_cases:
            continue
        for r in measure_family(name, checkpoint_at(name, "tiny", cache), device,
                                batches=(1, 4) if dry else (1, 4, 8), rounds=1 if dry else 3):
            rows.append({"what": f"{r['stage']} batch {r['batch']} ({r['shape']})",
                         "result": f"req/s on {r['on']['requests_per_s']:.3g}, off {r['off']['requests_per_s']:.3g}",
                         "on_over_off": r["ratio"]})
    return rows


FAILED = ("FAILED", "MISMATCH", "NON-FINITE")


def failed(rows: list[Row]) -> list[Row]:
    return [r for r in rows if str(r["result"]).startswith(FAILED)]


def table(rows: list[Row]) -> str:
    lines = ["| step | family | what | result | numbers |", "|---|---|---|---|---|"]
    for r in rows:
        numbers = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in r.items() if k not in ("step", "family", "what", "result"))
        lines.append(f"| {r['step']} | {r['family']} | {r['what']} | {r['result']} | {numbers} |")
    return "\n".join(lines) + "\n"


def imported_modules() -> list[str]:
    """Top-level modules outside the standard library that this process imported."""
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    names = {m.split(".")[0] for m in list(sys.modules)}
    return sorted(n for n in names if n not in stdlib and not n.startswith("_") and n != "tritontts")
