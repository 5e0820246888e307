"""The dtype a vLLM stage runs in (tritontts.engine.engine_dtype): the checkpoint's own where
the device runs it well, fp32 elsewhere and for fp32 checkpoints; refusals name what to use."""
import pytest

from tritontts.engine.engine_dtype import DtypeError, bf16_kind, check_dtype, cpu_bf16_flags, resolve_dtype

AMX = ["avx512_bf16", "amx_bf16"]


def test_cpu_bf16_flags_come_from_the_flags_line_of_cpuinfo():
    assert cpu_bf16_flags("processor : 0\nflags : fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\n") == \
        AMX + ["avx512f"]
    assert cpu_bf16_flags("processor : 0\nflags : fpu sse avx2 avx512f\n") == ["avx512f"]     # emulated
    assert cpu_bf16_flags("processor : 0\nflags : fpu sse avx2\n") == []
    assert isinstance(cpu_bf16_flags(), list)           # this machine's, whatever it has


def test_bf16_kind_is_native_with_bf16_kernels_emulated_with_avx512_alone_else_none():
    assert bf16_kind(["avx512_bf16", "avx512f"]) == "native" and bf16_kind(["amx_bf16"]) == "native"
    assert bf16_kind(["avx512f"]) == "emulated"
    assert bf16_kind([]) is None


@pytest.mark.parametrize("checkpoint,device,flags,expected", [
    ("bfloat16", "cpu", AMX, "bfloat16"),       # released weights, a CPU with bf16 kernels
    ("bfloat16", "cpu", [], "float32"),         # ... one without them
    ("bfloat16", "cpu", ["avx512f"], "float32"),  # ... one that only emulates them (asked for only)
    ("torch.bfloat16", "cuda:0", [], "bfloat16"),
    ("float16", "cuda", [], "float16"),
    ("float16", "cpu", AMX, "bfloat16"),        # no fp16 on the CPU backend
    ("float32", "cpu", AMX, "float32"),         # the tiny test checkpoints: parity stays fp32
    ("float32", "cuda", [], "float32"),
])
def test_auto_is_the_checkpoints_own_dtype_where_the_device_runs_it_well(checkpoint, device, flags, expected):
    dtype, why = resolve_dtype("auto", checkpoint, device, flags)
    assert dtype == expected and why.startswith("auto")


def test_a_given_dtype_wins_and_aliases_are_read():
    assert resolve_dtype("fp32", "bfloat16", "cuda", []) == ("float32", "as given")
    assert resolve_dtype("bf16", "float32", "cpu", AMX) == ("bfloat16", "as given")


@pytest.mark.parametrize("dtype,flags,needle", [
    ("float16", AMX, "float16 does not run on vLLM's CPU backend"),
    ("bfloat16", [], "bfloat16 needs a CPU with AVX512-BF16 or AMX, or at least AVX-512"),
    ("int4", AMX, "dtype 'int4' is not one of auto, float32, bfloat16, float16"),
])
def test_a_dtype_the_cpu_cannot_run_is_refused_saying_what_to_use(dtype, flags, needle):
    with pytest.raises(DtypeError, match=needle):
        check_dtype(dtype, "cpu", flags)


def test_bfloat16_asked_for_runs_on_an_avx512_cpu_without_bf16_kernels():
    """vLLM runs bf16 there (converted in AVX-512 registers; seen on a 2-core Xeon: the same
    greedy tokens as fp32 on a tiny talker): it halves the weights, so it is allowed when asked."""
    assert check_dtype("bfloat16", "cpu", ["avx512f"]) == "bfloat16"
    assert resolve_dtype("bfloat16", "bfloat16", "cpu", ["avx512f"]) == ("bfloat16", "as given")
    dtype, why = resolve_dtype("auto", "bfloat16", "cpu", ["avx512f"])
    assert dtype == "float32" and "--dtype bfloat16 runs here, emulated" in why
