"""The dtype a vLLM stage runs in. "auto" (every model.json's default, and the launcher's
--dtype default) is the checkpoint's own dtype where the device runs it well: on CUDA, and on
CPUs with AVX512-BF16 or AMX (bf16 kernels); fp32 elsewhere, and always for an fp32
checkpoint (the tiny test checkpoints: parity stays fp32). vLLM's own "auto" would run fp32
weights in bf16. An explicit dtype the device cannot run is refused before anything loads.

On an AVX-512 CPU without those (bf16 converted to fp32 in AVX-512 registers), vLLM runs
bfloat16 when asked: half the weights' memory, so a checkpoint too large for fp32 can fit;
measured served on a 2-core Xeon at released size (docs/benchmarks.md, "bfloat16 against
fp32: speed"), each talker made 0.31-0.63x fp32's frames/s four at once and 0.48-1.17x
alone, so "auto" stays fp32 there.
"""
from __future__ import annotations

from pathlib import Path

DTYPES = ("auto", "float32", "bfloat16", "float16")
ALIASES = {"float": "float32", "fp32": "float32", "bf16": "bfloat16", "half": "float16", "fp16": "float16"}
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")        # bf16 kernels
CPU_BF16_EMULATED_FLAGS = ("avx512f",)             # bf16 runs, converted to fp32: asked for only
# The launcher's --dtype: every vLLM stage's dtype over its model.json (--engine-arg wins).
DTYPE_ENV = "TRITONTTS_DTYPE"


class DtypeError(ValueError):
    """A dtype that is unknown or that the device cannot run; the message says what to use."""


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The instruction sets this CPU runs bf16 with (of CPU_BF16_FLAGS, then
    CPU_BF16_EMULATED_FLAGS), from /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    return [f for f in CPU_BF16_FLAGS + CPU_BF16_EMULATED_FLAGS if f in flags]


def native_bf16(bf16_flags: list[str]) -> list[str]:
    """Those of `bf16_flags` that are bf16 kernels (not an emulation)."""
    return [f for f in bf16_flags if f in CPU_BF16_FLAGS]


def bf16_kind(bf16_flags: list[str]) -> str | None:
    """How a CPU with these flags runs bfloat16: "native" (bf16 kernels), "emulated"
    (converted to fp32 in AVX-512 registers), or None (not at all)."""
    return "native" if native_bf16(bf16_flags) else "emulated" if bf16_flags else None


def normalized(dtype: str) -> str:
    name = str(dtype).removeprefix("torch.")
    name = ALIASES.get(name, name)
    if name not in DTYPES:
        raise DtypeError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return name


def check_dtype(dtype: str, device: str, bf16_flags: list[str]) -> str:
    """An explicit dtype the device runs (normalized), else DtypeError."""
    name = normalized(dtype)
    if device.startswith("cuda") or name in ("auto", "float32"):
        return name
    if name == "float16":
        raise DtypeError("float16 does not run on vLLM's CPU backend: use float32, or bfloat16 on a CPU "
                         "with AVX512-BF16 or AMX")
    if not bf16_flags:
        raise DtypeError("bfloat16 needs a CPU with AVX512-BF16 or AMX, or at least AVX-512 (this one has "
                         "none: unverified with vLLM's CPU backend): use float32 or auto")
    return name


def resolve_dtype(given: str, checkpoint_dtype: str, device: str,
                  bf16_flags: list[str]) -> tuple[str, str]:
    """(the dtype the engine runs, why) for a stage asked for `given`."""
    name = check_dtype(given, device, bf16_flags)
    if name != "auto":
        return name, "as given"
    own = normalized(checkpoint_dtype or "float32")
    own = "float32" if own == "auto" else own
    if own == "float32":
        return "float32", "auto: the checkpoint's own"
    if device.startswith("cuda"):
        return own, "auto: the checkpoint's own, on CUDA"
    if native_bf16(bf16_flags):
        return "bfloat16", f"auto: the checkpoint is {own} and this CPU has {', '.join(native_bf16(bf16_flags))}"
    if bf16_flags:
        return "float32", (f"auto: the checkpoint is {own} but this CPU has no AVX512-BF16 or AMX (--dtype "
                           "bfloat16 runs here, emulated: half the memory, slower, most with several requests at once)")
    return "float32", f"auto: the checkpoint is {own} but this CPU has no AVX512-BF16 or AMX"
