"""Where a stage's neural network runs: TensorRT, onnxruntime or PyTorch, chosen per stage.

A stage's heavy, non-autoregressive network is declared as a `Graph`: a module whose
forward takes and returns tensors only, its input/output names, and the range of each
dynamic axis (batch, frames, ...). From a Graph:

  export_onnx(graph, path)          ONNX with those axes dynamic (torch.export based)
  build_tensorrt_engine(...)        a TensorRT engine, one optimization profile over the
                                    axis ranges (min / opt / max), fp32 or fp16
  select_runner(graph, preference)  the first runtime of the preference list that works
                                    here, as a callable tensors -> tensors, exporting and
                                    building what is missing into the cache; each runtime
                                    passed over is one log line saying why

The PyTorch module itself is always the last resort, so a stage never fails to start for
want of an accelerator. Exports are cached under $TRITONTTS_CACHE/engines/<graph>/<key>,
the key being a hash of the weights and the graph's signature: another checkpoint, another
axis range or another torch gives another file, a restart reuses it.

Triton-free: stages call this from their __init__, tests call it directly.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import logging
import os
import shutil
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ..weights.checkpoint import cache_root
from .devices import onnxruntime_providers

log = logging.getLogger(__name__)

TENSORRT, ONNXRUNTIME, TORCH = "tensorrt", "onnxruntime", "torch"
RUNTIMES = (TENSORRT, ONNXRUNTIME, TORCH)
# A stage without a `runtime` parameter: see docs/benchmarks.md for the CPU measurements
# that chose it.
CPU_DEFAULT = TORCH
# Bump when the export changes in a way the weights and signature do not show.
EXPORT_VERSION = 2
ONNX_OPSET = 18
# Above this many bytes of weights the ONNX file keeps them beside it (protobuf's 2 GiB limit).
EXTERNAL_DATA_BYTES = 1 << 30


@dataclass(frozen=True)
class Axis:
    """A dynamic axis: the sizes a runtime must accept (min, max) and the one it should be
    fastest at (opt, TensorRT's profile optimum; also the size an export traces with)."""
    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise ValueError(f"need 1 <= min <= opt <= max, got {self}")


@dataclass(frozen=True)
class TensorSpec:
    """One input: its name, dtype and shape, each dimension an int or an axis name."""
    name: str
    dtype: torch.dtype
    shape: tuple[int | str, ...]
    # Integer inputs (codes, ids) are drawn from [0, high) when an example is made.
    high: int = 2

    def sized(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.shape)


@dataclass(frozen=True)
class Graph:
    """A network a stage may run outside PyTorch. `module.forward(*inputs)` returns a
    tensor or a tuple of them, in `outputs` order."""
    name: str
    module: nn.Module
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]
    axes: Mapping[str, Axis]
    # Output dims that are dynamic, by output name -> {dim index: axis name}. Only used to
    # label the ONNX outputs; runtimes read the actual shapes.
    output_axes: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    # Axes whose size follows from the others (an STFT's frames from the mel's): name ->
    # function of the independent sizes. Exported as axes of their own; examples and
    # TensorRT profiles size them by the function.
    derived: Mapping[str, Callable[[Mapping[str, int]], int]] = field(default_factory=dict)

    def sizes(self, given: Mapping[str, int] | None = None, at: str = "opt") -> dict[str, int]:
        """Every axis' size: `given`, else the axes' `at` (min, opt or max) value; derived
        axes computed from those unless given."""
        sizes = {name: getattr(axis, at) for name, axis in self.axes.items()} | dict(given or {})
        return {name: fn(sizes) for name, fn in self.derived.items()} | sizes

    def example(self, sizes: Mapping[str, int] | None = None, seed: int = 0,
                device: str | torch.device = "cpu") -> tuple[Tensor, ...]:
        """Inputs of the given axis sizes (default: every axis at opt), seeded random."""
        sizes = self.sizes(sizes)
        generator = torch.Generator().manual_seed(seed)
        out = []
        for spec in self.inputs:
            shape = spec.sized(sizes)
            if spec.dtype == torch.bool:
                value = torch.ones(shape, dtype=torch.bool)
            elif spec.dtype.is_floating_point:
                value = torch.randn(shape, generator=generator).to(spec.dtype)
            else:
                value = torch.randint(0, spec.high, shape, generator=generator, dtype=spec.dtype)
            out.append(value.to(device))
        return tuple(out)

    def signature(self) -> dict:
        return {"name": self.name, "version": EXPORT_VERSION, "torch": torch.__version__,
                "opset": ONNX_OPSET,
                "inputs": [[s.name, str(s.dtype), list(s.shape)] for s in self.inputs],
                "outputs": list(self.outputs),
                "axes": {k: [a.min, a.opt, a.max] for k, a in sorted(self.axes.items())},
                "derived": {k: [self.sizes(at=w)[k] for w in ("min", "opt", "max")]
                            for k in sorted(self.derived)}}

    def key(self) -> str:
        """Hash of the weights (names, shapes, dtypes, values) and the signature."""
        digest = hashlib.sha256(json.dumps(self.signature(), sort_keys=True).encode())
        for name, tensor in sorted(self.module.state_dict().items()):
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                          if tensor.numel() else b"")
        return digest.hexdigest()[:20]

    def torch_call(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        out = self.module(*inputs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class Method(nn.Module):
    """`owner.<method>` as a module of its own, so a Graph can be one method of a larger
    model (the network part of a step whose pre- and post-processing stay in torch). The
    owner is a submodule: its weights are the graph's weights."""

    def __init__(self, owner: nn.Module, method: str) -> None:
        super().__init__()
        self.owner = owner
        self.method = method

    def forward(self, *inputs: Tensor):
        return getattr(self.owner, self.method)(*inputs)


def parse_preference(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """"tensorrt,onnxruntime,torch" (or a list) -> the runtimes in order; torch is always
    appended as the last resort. Unknown names are a ValueError naming the valid ones."""
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value or ()) if n.strip()]
    unknown = [n for n in names if n not in RUNTIMES]
    if unknown:
        raise ValueError(f"unknown runtime(s) {unknown}; choose from {', '.join(RUNTIMES)}")
    ordered = list(dict.fromkeys(names))
    return tuple(ordered if TORCH in ordered else ordered + [TORCH])


# ------------------------------------------------------------------------------ export

def export_onnx(graph: Graph, path: str | Path) -> Path:
    """Write graph as ONNX to `path` (dynamic axes as declared); returns the path."""
    from torch.export import Dim

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    low, high = graph.sizes(at="min"), graph.sizes(at="max")
    dims = {name: Dim(name, min=low[name], max=high[name]) for name in low}
    dynamic_shapes = tuple({i: dims[d] for i, d in enumerate(spec.shape) if isinstance(d, str)} or None
                           for spec in graph.inputs)
    if isinstance(graph.module, Method):      # forward(*inputs): one varargs argument
        dynamic_shapes = (dynamic_shapes,)
    weight_bytes = sum(t.numel() * t.element_size() for t in graph.module.state_dict().values())
    module = graph.module.eval()
    # The exporter narrates every pass on stdout and warns about things we accept (e.g.
    # the opset it picks for a sub-function): keep the stage's log to our one line.
    chatty = [logging.getLogger(name) for name in ("torch.onnx", "onnx_ir", "onnxscript")]
    levels = [logger.level for logger in chatty]
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for logger in chatty:
            logger.setLevel(logging.ERROR)
        program = torch.onnx.export(
            module, graph.example(), dynamo=True, opset_version=ONNX_OPSET,
            input_names=[s.name for s in graph.inputs], output_names=list(graph.outputs),
            # onnxscript's optimizer passes: slower export, no faster run (onnxruntime and
            # TensorRT optimize the graph themselves; measured on the tiny flow and HiFT).
            dynamic_shapes=dynamic_shapes, optimize=False)
        for logger, level in zip(chatty, levels):
            logger.setLevel(level)
    program.save(str(path), external_data=weight_bytes > EXTERNAL_DATA_BYTES)
    return path


def engine_dir(graph: Graph, root: str | Path | None = None) -> Path:
    """$TRITONTTS_CACHE/engines/<graph name>/<key>: the graph's exports for these weights."""
    base = Path(root) if root else cache_root() / "engines"
    return base / graph.name / graph.key()


def ensure_onnx(graph: Graph, root: str | Path | None = None) -> Path:
    """The graph's cached ONNX file, exported first if missing. Written to a temporary
    folder and renamed, so an instance starting beside another never reads half a file."""
    folder = engine_dir(graph, root)
    onnx_path = folder / "model.onnx"
    if onnx_path.is_file():
        return onnx_path
    with _exclusive(folder):
        return _export_into(graph, folder, onnx_path)


@contextlib.contextmanager
def _exclusive(folder: Path):
    """One exporter per graph at a time: a stage's instances start together, and the
    second should wait for the first's file rather than export it again."""
    import fcntl

    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _export_into(graph: Graph, folder: Path, onnx_path: Path) -> Path:
    if onnx_path.is_file():          # exported while this one waited for the lock
        return onnx_path
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        export_onnx(graph, tmp / "model.onnx")
        (tmp / "graph.json").write_text(json.dumps(graph.signature(), indent=2))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(folder)
    except OSError:      # another instance exported it first
        shutil.rmtree(tmp, ignore_errors=True)
    return onnx_path


# ------------------------------------------------------------------------------ runners

class Runner:
    """tensors in -> tuple of tensors out, on the first input's device."""
    runtime: str
    detail: str = ""

    def __call__(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.runtime} ({self.detail})" if self.detail else self.runtime


class TorchRunner(Runner):
    runtime = TORCH

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.detail = "eager"

    def __call__(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        return self.graph.torch_call(*inputs)


class OnnxRuntimeRunner(Runner):
    """onnxruntime with the CUDA provider when the inputs live on a GPU and it is there,
    else the CPU provider. `threads` sets the CPU provider's intra-op pool."""
    runtime = ONNXRUNTIME

    def __init__(self, onnx_path: str | Path, graph: Graph, device: str = "cpu",
                 threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(onnx_path), options,
                                            providers=onnxruntime_providers(device))
        self.device = torch.device(device)
        self.graph = graph
        self.input_names = [s.name for s in graph.inputs]
        self.detail = self.session.get_providers()[0]

    def __call__(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        # onnxruntime copies numpy inputs into its own buffers; on a GPU, IO binding would
        # save the host round trip (a measured follow-up, not done: no GPU to measure on).
        feeds = {name: value.detach().cpu().numpy() for name, value in zip(self.input_names, inputs)}
        outs = self.session.run(list(self.graph.outputs), feeds)
        return tuple(torch.from_numpy(o).to(self.device) for o in outs)


class TensorRTRunner(Runner):
    """A serialized TensorRT engine run on the inputs' CUDA stream (TensorRT 10 API:
    named tensors, set_input_shape, execute_async_v3)."""
    runtime = TENSORRT

    def __init__(self, engine_path: str | Path, graph: Graph, device: str) -> None:
        import tensorrt as trt

        self.trt = trt
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{engine_path}: TensorRT could not deserialize the engine")
        self.context = self.engine.create_execution_context()
        self.graph = graph
        self.device = torch.device(device)
        self.detail = f"TensorRT {trt.__version__}"
        self.bounds = {name: (shapes[0], shapes[2]) for name, shapes in profile_shapes(graph).items()}
        self.warned = False

    def fits(self, inputs: Sequence[Tensor]) -> bool:
        """Whether every input lies inside the engine's optimization profile."""
        return all(all(lo <= n <= hi for n, lo, hi in zip(value.shape, *self.bounds[spec.name]))
                   for spec, value in zip(self.graph.inputs, inputs))

    def __call__(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        if not self.fits(inputs):
            # Longer than the profile (a very long prompt): correct but slower, said once.
            if not self.warned:
                log.warning(f"{self.graph.name}: shapes {[tuple(v.shape) for v in inputs]} "
                            "outside the TensorRT profile; such calls run on PyTorch")
                self.warned = True
            return self.graph.torch_call(*inputs)
        trt, ctx = self.trt, self.context
        stream = torch.cuda.current_stream(self.device)
        keep = []
        for spec, value in zip(self.graph.inputs, inputs):
            value = value.to(self.device).contiguous()
            keep.append(value)
            ctx.set_input_shape(spec.name, tuple(value.shape))
            ctx.set_tensor_address(spec.name, value.data_ptr())
        outs = []
        for name in self.graph.outputs:
            shape = tuple(ctx.get_tensor_shape(name))
            dtype = _TRT_TO_TORCH[trt.nptype(self.engine.get_tensor_dtype(name))]
            out = torch.empty(shape, dtype=dtype, device=self.device)
            ctx.set_tensor_address(name, out.data_ptr())
            outs.append(out)
        if not ctx.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"{self.graph.name}: TensorRT execution failed")
        stream.synchronize()
        return tuple(outs)


def _numpy_to_torch() -> dict:
    import numpy as np
    return {np.float32: torch.float32, np.float16: torch.float16, np.int32: torch.int32,
            np.int64: torch.int64, np.bool_: torch.bool}


_TRT_TO_TORCH = _numpy_to_torch()


def build_tensorrt_engine(onnx_path: str | Path, graph: Graph, engine_path: str | Path,
                          fp16: bool = False, workspace_bytes: int = 4 << 30) -> Path:
    """Build and serialize a TensorRT engine for the ONNX file: one optimization profile
    with every dynamic axis at the graph's (min, opt, max); fp16 lets TensorRT pick half
    precision kernels where it is faster (inputs and outputs stay as declared)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)     # TensorRT 10: explicit batch is the only mode
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"{onnx_path}: TensorRT cannot parse it: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    for spec, (low, best, high) in profile_shapes(graph).items():
        profile.set_shape(spec, low, best, high)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"{graph.name}: TensorRT failed to build an engine (see its log)")
    engine_path = Path(engine_path)
    engine_path.write_bytes(bytes(serialized))
    return engine_path


def profile_shapes(graph: Graph) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Per input: (min, opt, max) shapes of the optimization profile."""
    pick = {which: graph.sizes(at=which) for which in ("min", "opt", "max")}
    return {spec.name: tuple(spec.sized(pick[w]) for w in ("min", "opt", "max"))
            for spec in graph.inputs}


def engine_name(fp16: bool) -> str:
    """Engines are specific to the GPU model and TensorRT version: both are in the name."""
    import tensorrt as trt

    gpu = torch.cuda.get_device_name().replace(" ", "_").replace("/", "_")
    return f"{gpu}-trt{trt.__version__}-{'fp16' if fp16 else 'fp32'}.plan"


def ensure_tensorrt_engine(graph: Graph, root: str | Path | None = None,
                           fp16: bool = False) -> Path:
    onnx_path = ensure_onnx(graph, root)
    path = onnx_path.parent / engine_name(fp16)
    if path.is_file():
        return path
    with _exclusive(path):
        if not path.is_file():
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            build_tensorrt_engine(onnx_path, graph, tmp, fp16=fp16)
            tmp.replace(path)
    return path


# ------------------------------------------------------------------------------ selection

def _try(runtime: str, graph: Graph, device: str, threads: int, precision: str,
         root: str | Path | None) -> Runner:
    if runtime == TORCH:
        return TorchRunner(graph)
    if runtime == TENSORRT:
        if not device.startswith("cuda") or not torch.cuda.is_available():
            raise RuntimeError("needs a CUDA device (this instance runs on "
                               f"{device}{'' if torch.cuda.is_available() else ', no CUDA here'})")
        if importlib.util.find_spec("tensorrt") is None:
            raise RuntimeError("the tensorrt package is not installed (pip install .[gpu])")
        return TensorRTRunner(ensure_tensorrt_engine(graph, root, fp16=precision == "fp16"),
                              graph, device)
    if importlib.util.find_spec("onnxruntime") is None:
        raise RuntimeError("onnxruntime is not installed")
    return OnnxRuntimeRunner(ensure_onnx(graph, root), graph, device, threads)


def select_runner(graph: Graph, preference: str | Sequence[str] | None = TORCH,
                  device: str = "cpu", threads: int = 1, precision: str = "fp32",
                  root: str | Path | None = None,
                  report: Callable[[str], None] | None = None) -> Runner:
    """The first runtime in `preference` that loads here (torch last, always). Every
    runtime passed over is reported in one line with the reason; so is the choice."""
    if precision not in ("fp32", "fp16"):
        raise ValueError(f"precision must be fp32 or fp16, not {precision!r}")
    skipped = []
    for runtime in parse_preference(preference):
        try:
            runner = _try(runtime, graph, device, threads, precision, root)
        except Exception as exc:   # any failure means: fall back to the next runtime
            if runtime == TORCH:
                raise
            # The first line: exporters and providers explain at length.
            skipped.append(f"{runtime}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
            continue
        reasons = f" (skipped {'; '.join(skipped)})" if skipped else ""
        (report or (log.warning if skipped else log.info))(
            f"{graph.name}: running on {runner.describe()}{reasons}")
        return runner
    raise AssertionError("torch is always in the preference")  # pragma: no cover


def stage_runner(graph: Graph, context) -> Runner:
    """select_runner as a stage configures it (config.pbtxt parameters): `runtime` (the
    preference list, default CPU_DEFAULT), `precision` (fp32 or fp16, TensorRT only),
    `torch_threads` (also onnxruntime's CPU threads); the device is the instance's."""
    parameters = context.parameters
    return select_runner(graph, parameters.get("runtime", CPU_DEFAULT), device=context.device,
                         threads=int(parameters.get("torch_threads", 1)),
                         precision=parameters.get("precision", "fp32"))


def compare(graph: Graph, runner: Runner, sizes: Mapping[str, int] | None = None,
            seed: int = 0) -> tuple[float, float]:
    """(max-abs-diff of runner vs the torch module, largest |output|) on seeded inputs."""
    device = getattr(runner, "device", torch.device("cpu"))
    inputs = graph.example(sizes, seed=seed, device=device)
    with torch.inference_mode():
        expected = graph.torch_call(*inputs)
        got = runner(*inputs)
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, expected))
    return diff, max(float(t.abs().max()) for t in expected)
