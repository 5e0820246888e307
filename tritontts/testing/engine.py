"""In-process vLLM in tests: building an engine (a fixed KV cache), closing it, and vLLM's
process-wide state (distributed / model-parallel groups) that neither may leave behind for
the next test module; driving an engine step by step (tritontts.engine.vllm_frames talkers)."""
from __future__ import annotations

from contextlib import contextmanager


def run_releasing_one(core, gone: str, stays: str, release, steps_before: int = 3) -> None:
    """Step `core` (an LLMEngine with requests `gone` and `stays` added) a few times, then
    release `gone`'s stream without aborting it, as a stage does when its client leaves
    (the abort reaches the engine later): step until `stays` is finished, then abort
    `gone` and drain the engine."""
    for _ in range(steps_before):
        core.step()
    release(gone)
    finished: set[str] = set()
    while stays not in finished:
        finished |= {o.request_id for o in core.step() if o.finished}
    core.abort_request([gone])
    while core.has_unfinished_requests():
        core.step()


def close_engine(llm) -> None:
    """Shut an in-process engine down now (callers then drop it and run gc.collect()). Left
    to the garbage collector, its CPU matmul handles were freed at a random later moment,
    once inside another test's torch.export trace, which then failed. Closing one engine
    also tears down vLLM's process-wide parallel state: a module runs one engine at a time.
    The shutdown frees the KV cache even while the fixture still holds `llm` (pytest keeps
    a fixture's value until its teardown is over): 1.03 GB of RSS back from a 1 GiB cache."""
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        # Also where shutdown failed half-way: what it had not undone yet.
        release_vllm_process_state()


def release_vllm_process_state() -> None:
    """Undo what building an in-process engine (or vLLM layers outside one) leaves set for
    the whole process: torch.distributed and vLLM's world / model-parallel groups (the next
    module's initialize_model_parallel found them "already initialized"), the gc.freeze()
    of EngineCore's start, and vLLM's CPU worker's torch.set_num_threads. Safe to call when
    nothing is set (each step checks first) and after EngineCore.shutdown, which calls the
    same vLLM cleanup."""
    from ..engine.vllm_talker import release_vllm_parallel_state

    release_vllm_parallel_state()
    # vLLM's CPU worker replaces torch.set_num_threads for the whole process with a no-op
    # once it binds its threads; left so, every later test's stage (tests run stages in
    # process) silently kept vLLM's thread count, and a reference computed with other threads
    # than the served stage drifted past a parity tolerance (GLM-TTS's: 4e-4 at peak 0.19).
    import torch

    torch.set_num_threads = torch._C.set_num_threads


def in_process_llm(model, kv_cache_bytes: int, **llm_args):
    """vLLM's LLM for a test: its engine core in this process and a KV cache of exactly
    `kv_cache_bytes` (what every in-process test engine is built by). Never a share of
    memory: vLLM's CPU worker sizes a share from the NUMA node's memory as sysfs reports it
    (13.8 GB on one machine of 23 GiB, 12.5 GiB on another) less this process's RSS, so it
    depended on what earlier tests still held and was refused in a full run. If building
    fails (a KV cache refused happens after the worker's distributed init), vLLM's process
    state is released before the error propagates: a failed engine left the model-parallel
    groups taken for every later module in the run. Close the engine with close_engine."""
    import os

    if "gpu_memory_utilization" in llm_args or "kv_cache_memory_bytes" in llm_args:
        raise ValueError("a test engine's KV cache is kv_cache_bytes, not a share of memory")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"      # the engine core in this process
    from vllm import LLM

    try:
        return LLM(model=str(model), kv_cache_memory_bytes=int(kv_cache_bytes), **llm_args)
    except BaseException:
        release_vllm_process_state()
        raise


@contextmanager
def vllm_parallel_state(vllm_config):
    """vLLM's distributed and model-parallel state (one rank, gloo, parallel sizes 1) for
    vLLM layers built outside an engine, e.g. a vLLM-Omni reference model. Reused where it
    is already set up (ensure_model_parallel_initialized, not initialize_model_parallel,
    which refuses taken groups); set up here otherwise, and then released on exit, also when
    the body fails, so no later module finds it taken. Yields `vllm_config`."""
    from vllm.config.vllm import set_current_vllm_config
    from vllm.distributed import (ensure_model_parallel_initialized, init_distributed_environment,
                                  model_parallel_is_initialized)

    from .stack import free_port

    owned = not model_parallel_is_initialized()
    try:
        with set_current_vllm_config(vllm_config):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
            ensure_model_parallel_initialized(1, 1)
        yield vllm_config
    finally:
        if owned:
            release_vllm_process_state()


def frames_engine(model_dir, kv_cache_bytes: int, max_model_len: int = 512, **engine_args):
    """vLLM's LLM on a per-frame talker's model folder, its engine core in this process (the
    model and the test share the streams of tritontts.engine.vllm_frames), fp32, eager, the
    RowTracker installed: what every vLLM talker test runs; `engine_args` add to those."""
    from ..engine.vllm_frames import ROW_TRACKER

    return in_process_llm(model_dir, kv_cache_bytes, skip_tokenizer_init=True, enforce_eager=True,
                          enable_prefix_caching=False, max_model_len=max_model_len, seed=0,
                          logits_processors=[ROW_TRACKER],
                          **{"max_num_seqs": 8, "dtype": "float32", **engine_args})
