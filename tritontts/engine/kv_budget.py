"""A vLLM stage's KV cache sized from its checkpoint: room for a stated number of requests
of max_model_len positions, computed from the config.json vLLM loads (layers, KV heads,
head dim, per-layer types of hybrid models), never a fixed byte count that fits only one
checkpoint size. On the CPU this is the budget (`kv_cache_memory_bytes`); the launch is
refused before the engine loads when weights + KV exceed the memory available, with the
numbers. On a GPU the profile's share of the card sets it instead (tritontts.deploy.profiles).

vLLM's CPU backend allocates KV in blocks of CPU_BLOCK_TOKENS positions. A hybrid model's
linear-attention layers keep one state per request; vLLM raises the attention block until
one attention page holds that state, pads the state to the page, and groups the layers by the smaller type's count: a request
takes its attention blocks and one block per group of linear layers (measured against
vLLM's own count: tests/contract, and 4.00 of 4 at Gepard's released size, 3.87 before the
grouping was counted).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from .engine_dtype import DtypeError, normalized

CPU_BLOCK_TOKENS = 128
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}    # engine_dtype's names
DEFAULT_KV_REQUESTS = 4        # full-length requests a talker's KV cache holds by default
# What a vLLM engine process on the CPU holds beyond its weights and KV cache (loading a
# checkpoint's shards into the engine's dtype, the runtime, activations), as a share of its
# weights: measured on Voxtral TTS's released talker, whose process the kernel's OOM killer
# took at 19.77 GiB resident (at its first request) for 14.91 GiB of fp32 weights and 3.25 GiB
# of KV: 1.61 GiB more, 11 % of the weights (a lower bound: it was killed while growing).
CPU_RUNTIME_SHARE = 0.11
GIB = 2 ** 30


class SizingError(ValueError):
    """The KV cache cannot be sized or does not fit; the message names the file, field or
    numbers and what to change."""


def checkpoint_dtype(config: dict, source: str = "config.json") -> str:
    """The dtype the checkpoint's tensors are stored in (torch_dtype, else dtype; float32
    when it says neither), in engine_dtype's names."""
    try:
        name = normalized(str(config.get("torch_dtype") or config.get("dtype") or "float32"))
    except DtypeError as exc:
        raise SizingError(f"{source}: {exc}") from None
    return "float32" if name == "auto" else name


def dtype_bytes(dtype: str, config: dict, source: str) -> int:
    """Bytes per element of the engine's `dtype` ("auto": the checkpoint's own)."""
    try:
        name = normalized(dtype)
    except DtypeError as exc:
        raise SizingError(f"{source}: {exc}") from None
    return ELEMENT_BYTES[checkpoint_dtype(config, source) if name == "auto" else name]


@dataclass(frozen=True)
class KvShape:
    """What one position of KV cache costs, per attention layer, and what one request's
    state costs per linear-attention layer (hybrid models), in elements."""

    attention_layers: int
    kv_heads: int
    head_dim: int
    linear_layers: int = 0
    linear_state: int = 0          # elements of one request's state in one linear layer

    @classmethod
    def from_config(cls, config: dict, source: str = "config.json") -> "KvShape":
        def field(name: str, default=None):
            value = config.get(name, default)
            if value is None:
                raise SizingError(f"{source}: field {name!r} is missing; the KV cache is sized from it "
                                  f"(or give the stage's kv_cache_memory_bytes with --engine-arg)")
            return value

        layers = int(field("num_hidden_layers"))
        heads = int(field("num_attention_heads"))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(field("hidden_size")) // heads)
        types = config.get("layer_types")
        if types is None and config.get("full_attention_interval") and config.get("linear_num_value_heads"):
            interval = int(config["full_attention_interval"])
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
        if types is None:
            return cls(layers, kv_heads, head_dim)
        if len(types) != layers:
            raise SizingError(f"{source}: layer_types has {len(types)} entries for {layers} layers")
        linear = sum(1 for t in types if t == "linear_attention")
        unknown = sorted({t for t in types} - {"full_attention", "linear_attention", "attention"})
        if unknown:
            raise SizingError(f"{source}: layer_types {unknown} cannot be sized (known: full_attention, "
                              f"linear_attention); give kv_cache_memory_bytes with --engine-arg")
        state = 0
        if linear:
            k_heads, v_heads = int(field("linear_num_key_heads")), int(field("linear_num_value_heads"))
            k_dim, v_dim = int(field("linear_key_head_dim")), int(field("linear_value_head_dim"))
            kernel = int(field("linear_conv_kernel_dim"))
            # gated delta rule: a short convolution over q, k, v and the recurrent k x v state
            state = (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim) + v_heads * k_dim * v_dim
        return cls(layers - linear, kv_heads, head_dim, linear, state)

    def position_bytes(self, element: int) -> int:
        """One position of one attention layer: K and V."""
        return 2 * self.kv_heads * self.head_dim * element

    def block_tokens(self, element: int) -> int:
        """vLLM's attention block on the CPU: CPU_BLOCK_TOKENS, raised for a hybrid model
        until a page holds a linear layer's state."""
        if not self.linear_layers:
            return CPU_BLOCK_TOKENS
        need = math.ceil(self.linear_state * element / self.position_bytes(element))
        return max(CPU_BLOCK_TOKENS, math.ceil(need / CPU_BLOCK_TOKENS) * CPU_BLOCK_TOKENS)

    def block_bytes(self, element: int) -> int:
        """One block id of vLLM's pool: a page in each layer that shares block ids (every
        attention layer; a hybrid model's group). The pool keeps one such block aside as its
        null block, so a cache holds one block more than its requests use."""
        page = self.block_tokens(element) * self.position_bytes(element)
        if not self.linear_layers:
            return page * self.attention_layers
        return page * min(self.attention_layers, self.linear_layers)

    def request_bytes(self, max_model_len: int, element: int) -> int:
        """One request of max_model_len positions, in whole pages."""
        block = self.block_tokens(element)
        page = block * self.position_bytes(element)
        if not self.linear_layers:
            return page * self.attention_layers * math.ceil(max_model_len / block)
        # vLLM groups a hybrid model's layers in groups of the smaller type's count (a
        # group's layers share one block id); a request takes each group's blocks.
        group = min(self.attention_layers, self.linear_layers)
        blocks = (math.ceil(self.attention_layers / group) * math.ceil(max_model_len / block)
                  + math.ceil(self.linear_layers / group))
        return page * group * blocks


@dataclass(frozen=True)
class KvBudget:
    shape: KvShape
    requests: int
    max_model_len: int
    element: int
    weights: int = 0               # bytes of weights the engine holds beside the cache
    runtime: int = 0               # bytes its process needs beyond weights and cache (CPU_RUNTIME_SHARE)

    @property
    def request_bytes(self) -> int:
        return self.shape.request_bytes(self.max_model_len, self.element)

    @property
    def bytes(self) -> int:
        """The requests' full-length pages and vLLM's null block (without it the last
        request's last block is missing: vLLM refused a cache of exactly one request)."""
        return self.requests * self.request_bytes + self.shape.block_bytes(self.element)

    def describe(self) -> str:
        s = self.shape
        hybrid = f" + {s.linear_layers} linear-attention layers' state" if s.linear_layers else ""
        return (f"KV for {self.requests} requests of {self.max_model_len} positions: {self.bytes / GIB:.2f} GiB "
                f"({self.request_bytes / GIB:.3f} GiB each: {s.attention_layers} layers x {s.kv_heads} KV heads x "
                f"{s.head_dim} x 2 x {self.element} bytes{hybrid}; and vLLM's null block)")


def read_config(model_dir: str | Path) -> tuple[dict, str]:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text()), str(path)
    except (OSError, json.JSONDecodeError) as exc:
        raise SizingError(f"{path}: {exc}; the KV cache is sized from it") from None


# Bytes per element of a safetensors dtype; the floating ones are held in the engine's dtype.
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                     "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOATING = {"F64", "F32", "F16", "BF16"}


def safetensors_tensors(path: Path) -> list[tuple[str, int]] | None:
    """(dtype, element count) of each tensor in a safetensors file, from its header; None if
    the header cannot be read."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= 100 * 2 ** 20:
                return None
            header = json.loads(f.read(size))
        return [(t["dtype"], math.prod(t["shape"])) for name, t in header.items() if name != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def safetensors_engine_bytes(path: Path, element: int) -> int | None:
    """A safetensors file's tensors as the engine holds them (floating tensors at `element`
    bytes, the others as stored); None if its header cannot be read."""
    tensors = safetensors_tensors(path)
    if tensors is None or any(d not in SAFETENSORS_BYTES for d, _ in tensors):
        return None
    return sum(n * (element if d in FLOATING else SAFETENSORS_BYTES[d]) for d, n in tensors)


SAFETENSORS_DTYPE = {"F64": "float32", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def stored_dtype(model_dir: str | Path, config: dict, source: str = "config.json") -> str:
    """The floating dtype most of the weights are stored in, from the safetensors headers of
    `model_dir` (links followed): a generated engine folder's config.json may say float32
    beside linked bf16 weights. The config's dtype when no header can be read."""
    counts: dict[str, int] = {}
    for path in Path(model_dir).glob("*.safetensors"):
        for dtype, n in safetensors_tensors(path) or ():
            if dtype in SAFETENSORS_DTYPE:
                counts[SAFETENSORS_DTYPE[dtype]] = counts.get(SAFETENSORS_DTYPE[dtype], 0) + n
    return max(counts, key=counts.get) if counts else checkpoint_dtype(config, source)


def weight_bytes(model_dir: str | Path, element: int, config: dict) -> int:
    """The weights as the engine holds them: the tensor files (links followed), each
    safetensors file from its header's own dtypes (a generated engine folder's config.json
    may name another dtype than the linked weights are stored in), other files rescaled
    from the config's dtype to the engine's."""
    stored = ELEMENT_BYTES[checkpoint_dtype(config)]
    total = 0
    for p in Path(model_dir).iterdir():
        if p.suffix not in (".safetensors", ".bin", ".pt", ".pth") or not p.is_file():
            continue
        exact = safetensors_engine_bytes(p, element) if p.suffix == ".safetensors" else None
        total += exact if exact is not None else int(p.stat().st_size * element / stored)
    return total


def available_memory() -> int:
    """MemAvailable of /proc/meminfo, in bytes (what can be taken without swapping)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise SizingError("/proc/meminfo has no MemAvailable")


def plan_kv(stage: str, model_dir: str | Path, engine_args: dict, requests: int,
            config: dict | None = None) -> KvBudget:
    """The KV cache for `requests` full-length requests and the weights beside it, from the
    checkpoint's config.json (`config`: already read)."""
    if requests < 1:
        raise SizingError(f"{stage}: kv_requests must be at least 1, got {requests}")
    source = str(Path(model_dir) / "config.json")
    if config is None:
        config, source = read_config(model_dir)
    element = dtype_bytes(str(engine_args.get("dtype", "auto")), config, source)
    return KvBudget(KvShape.from_config(config, source), requests, int(engine_args["max_model_len"]), element,
                    weight_bytes(model_dir, element, config))


def check_fits(stage: str, budget: KvBudget, free: int, room: str, remedy: str,
               weights_remedy: str | None = None) -> KvBudget:
    """`budget` when its weights and KV fit in `free` bytes (`room` says what they are);
    SizingError with the numbers and the requests that would fit otherwise (`weights_remedy`
    where the weights alone do not fit, else `remedy`)."""
    if budget.weights + budget.runtime + budget.bytes <= free:
        return budget
    fit = max(0, (free - budget.weights - budget.runtime - budget.shape.block_bytes(budget.element))
              // budget.request_bytes)
    runtime = f" + runtime {budget.runtime / GIB:.2f} GiB" if budget.runtime else ""
    head = (f"{stage}: does not fit: weights {budget.weights / GIB:.2f} GiB{runtime} + {budget.describe()} > "
            f"{free / GIB:.2f} GiB {room}")
    if fit:
        raise SizingError(f"{head}; {fit} request(s) would fit: serve with --kv-requests {fit}")
    if weights_remedy and budget.weights + budget.runtime >= free:
        raise SizingError(f"{head}: the weights alone do not fit: {weights_remedy}")
    raise SizingError(f"{head}, not even one request: {remedy}")


def size_cpu_kv(stage: str, model_dir: str | Path, engine_args: dict, requests: int,
                available: int | None = None, config: dict | None = None, asked: bool = True,
                bf16: str | None = None) -> KvBudget:
    """The CPU KV budget for `requests` full-length requests; SizingError, before the engine
    loads, when the weights, the engine's runtime and that KV do not fit in the memory
    available now (the launcher starts each engine after every other stage has loaded:
    tritontts.deploy.tritonserver.LoadOrder). When the requests were not `asked` for (the
    default count), as many as fit are taken instead, down to one."""
    budget = plan_kv(stage, model_dir, engine_args, requests, config)
    budget = dataclasses.replace(budget, runtime=int(CPU_RUNTIME_SHARE * budget.weights))
    free = available_memory() if available is None else available
    fit = (free - budget.weights - budget.runtime - budget.shape.block_bytes(budget.element)) // budget.request_bytes
    if not asked and 1 <= fit < requests:
        return dataclasses.replace(budget, requests=int(fit))
    # bf16: how this CPU runs bfloat16 (engine_dtype.bf16_kind): "native" kernels, "emulated"
    # on AVX-512 (half the memory, slower), None: not at all
    halve = ""
    if bf16 and budget.element == 4:
        halve = f"--dtype bfloat16 (or --engine-arg {stage}.dtype=bfloat16{'' if bf16 == 'native' else '; emulated on this CPU: half the weights, slower, most with several requests at once'}), "
    more = "a machine with more memory" + ("" if bf16 else ", or a CPU with AVX512-BF16 or AMX (a bfloat16 "
                                             "checkpoint's weights run there at half the size)")
    return check_fits(stage, budget, free, "available",
                      f"use a lower --engine-arg {stage}.max_model_len, {halve}or {more}",
                      f"use {halve.removesuffix(', ')} or {more}" if halve else f"use {more}")


def size_gpu_share(stage: str, model_dir: str | Path, engine_args: dict, requests: int, card_bytes: int,
                   config: dict | None = None) -> KvBudget:
    """On a GPU the profile's gpu_memory_utilization of a `card_bytes` card is the engine's
    room (tritontts.deploy.profiles shares the card among the engines served): SizingError
    before loading when the checkpoint's weights and `requests` full-length requests do not
    fit in it, so a share computed from declared sizes never meets a bigger checkpoint
    unchecked."""
    budget = plan_kv(stage, model_dir, engine_args, requests, config)
    share = float(engine_args["gpu_memory_utilization"])
    return check_fits(stage, budget, int(share * card_bytes),
                      f"(gpu_memory_utilization {share} of a {card_bytes / GIB:g} GiB card)",
                      "serve fewer families on the card, give its memory with --gpu-memory-gib, or lower "
                      f"--engine-arg {stage}.max_model_len")


def engine_capacity(vllm_config) -> float | None:
    """Full-length requests the built engine's KV cache holds, as vLLM computed it (set in
    the process of the engine core), else from its block count (a plain-attention model)."""
    cache = vllm_config.cache_config
    concurrency = getattr(cache, "kv_cache_max_concurrency", None)
    if concurrency:
        return float(concurrency)
    if not cache.num_gpu_blocks or not cache.block_size:
        return None
    length = vllm_config.model_config.max_model_len
    return cache.num_gpu_blocks * cache.block_size / (math.ceil(length / cache.block_size) * cache.block_size)
