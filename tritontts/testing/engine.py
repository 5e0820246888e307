"""Driving an in-process vLLM engine step by step in tests (tritontts.vllm_frames talkers)."""
from __future__ import annotations


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
    also tears down vLLM's process-wide parallel state: a module runs one engine at a time."""
    llm.llm_engine.engine_core.shutdown()
    # vLLM's CPU worker replaces torch.set_num_threads for the whole process with a no-op
    # once it binds its threads; left so, every later test's stage (tests run stages in
    # process) silently kept vLLM's thread count, and a reference computed with other threads
    # than the served stage drifted past a parity tolerance (GLM-TTS's: 4e-4 at peak 0.19).
    import torch

    torch.set_num_threads = torch._C.set_num_threads


def frames_engine(model_dir, kv_cache_bytes: int, max_model_len: int = 512, **engine_args):
    """vLLM's LLM on a per-frame talker's model folder, its engine core in this process (the
    model and the test share the streams of tritontts.vllm_frames), fp32, eager, the
    RowTracker installed: what every vLLM talker test runs; `engine_args` add to those."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    from ..vllm_frames import ROW_TRACKER

    return LLM(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True,
               enable_prefix_caching=False, max_model_len=max_model_len, seed=0,
               logits_processors=[ROW_TRACKER], kv_cache_memory_bytes=kv_cache_bytes,
               **{"max_num_seqs": 8, "dtype": "float32", **engine_args})
