"""In-process vLLM leaves nothing process-wide behind for the next test module
(tritontts.testing.engine). In one full run a CosyVoice3 talker engine was refused its KV
cache after its worker had set up torch.distributed and vLLM's model-parallel groups, and
the Fish fast-AR module after it then failed: "tensor model parallel group is already
initialized". Here an engine is refused its KV cache on purpose (1 TiB, more than any
node's memory), plainly (the control: the state leaks) and through in_process_llm (it
does not)."""
from __future__ import annotations

import json

import pytest
import torch

from tritontts.testing.engine import in_process_llm, release_vllm_process_state, vllm_parallel_state

TOO_LARGE = 1 << 40           # bytes of KV cache: refused after the worker's distributed init
ARGS = dict(skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_model_len=64,
            enable_prefix_caching=False)


def taken() -> bool:
    from vllm.distributed import model_parallel_is_initialized

    return model_parallel_is_initialized() or torch.distributed.is_initialized()


@pytest.fixture(scope="module")
def talker_dir(tiny_cosyvoice3, tmp_path_factory):
    from tritontts.families.cosyvoice3.checkpoint import open_checkpoint
    from tritontts.families.cosyvoice3.talker import convert_llm_checkpoint

    ckpt = open_checkpoint(tiny_cosyvoice3)
    out = tmp_path_factory.mktemp("talker")
    text_config = json.loads((ckpt.text_model_dir / "config.json").read_text())
    convert_llm_checkpoint(ckpt.state_dict("llm.pt"), text_config, out)
    return out


def test_nothing_is_left_by_earlier_modules():
    assert not taken(), "an earlier test module left vLLM's distributed / model-parallel state set"


def test_a_refused_engine_leaks_the_parallel_state_unless_built_by_in_process_llm(talker_dir):
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    # Control: vLLM's own LLM, refused, leaves the groups (and its thread patch) set.
    with pytest.raises(ValueError, match="less than requested memory for kv"):
        LLM(model=str(talker_dir), kv_cache_memory_bytes=TOO_LARGE, **ARGS)
    try:
        assert taken() and torch.set_num_threads is not torch._C.set_num_threads
    finally:
        release_vllm_process_state()
    assert not taken() and torch.set_num_threads is torch._C.set_num_threads

    with pytest.raises(ValueError, match="less than requested memory for kv"):
        in_process_llm(talker_dir, TOO_LARGE, **ARGS)
    assert not taken() and torch.set_num_threads is torch._C.set_num_threads


def test_a_test_engine_takes_a_fixed_kv_cache_only(talker_dir):
    for share in ({"gpu_memory_utilization": 0.1}, {"kv_cache_memory_bytes": 1 << 20}):
        with pytest.raises(ValueError, match="not a share of memory"):
            in_process_llm(talker_dir, 64 << 20, **ARGS, **share)


def test_parallel_state_for_vllm_layers_is_reused_where_set_and_released_by_its_owner():
    from vllm.config import VllmConfig
    from vllm.distributed import get_tensor_model_parallel_world_size, model_parallel_is_initialized

    with vllm_parallel_state(VllmConfig()):
        assert get_tensor_model_parallel_world_size() == 1
        with vllm_parallel_state(VllmConfig()):         # taken: reused, not refused
            assert model_parallel_is_initialized()
        assert model_parallel_is_initialized()          # the inner one left its owner's state
    assert not taken()
    with pytest.raises(RuntimeError, match="boom"):
        with vllm_parallel_state(VllmConfig()):
            raise RuntimeError("boom")
    assert not taken()                                  # released when the body failed too


def test_servers_started_after_an_in_process_engine_do_not_inherit_its_vllm_variables(
        monkeypatch, tmp_path):
    from tritontts.testing.stack import new_user_environment

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")     # what in_process_llm sets
    monkeypatch.setenv("TRITONTTS_SOME_SETTING", "kept")           # control: others are passed
    env = new_user_environment(tmp_path)
    assert not [k for k in env if k.startswith("VLLM_") and k != "VLLM_CACHE_ROOT"]
    assert env["TRITONTTS_SOME_SETTING"] == "kept"


def test_tiny_servers_size_every_vllm_stage_for_its_max_num_seqs_full_length_requests():
    from tritontts.families import FAMILIES
    from tritontts.deploy.profiles import engine_settings_path
    from tritontts.deploy.repository import STAGE_REPOSITORY
    from tritontts.testing.stack import TINY_KV_REQUESTS, tiny_engine_args

    args = tiny_engine_args(tuple(FAMILIES))
    assert args[args.index("--kv-requests") + 1] == str(TINY_KV_REQUESTS)
    seqs = {}
    for family in FAMILIES.values():
        for stage in family.stages:
            path = engine_settings_path(STAGE_REPOSITORY / stage)
            if path:
                engine_args = json.loads(path.read_text())["engine_args"]
                seqs[stage] = engine_args["max_num_seqs"]
                # sized from the checkpoint, not a byte count fitting one size
                assert "kv_cache_memory_bytes" not in engine_args, stage
    assert len(seqs) >= 9 and max(seqs.values()) == TINY_KV_REQUESTS


def test_the_served_in_process_engine_releases_vllm_state_after_a_refused_start_and_a_shutdown(
        talker_dir):
    import asyncio

    from tritontts.engine.vllm_talker import InprocEngine

    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(RuntimeError, match="failed to start"):
            InprocEngine(str(talker_dir), {**ARGS, "kv_cache_memory_bytes": TOO_LARGE}, loop)
        assert not taken(), "a refused start left vLLM's parallel state set"
        engine = InprocEngine(str(talker_dir), {**ARGS, "kv_cache_memory_bytes": 64 * 2**20}, loop)
        assert taken()            # control: a running engine holds the state
        engine.shutdown()
        assert not engine.thread.is_alive() and not taken()
    finally:
        release_vllm_process_state()          # vLLM's thread patch, for the modules after
        loop.close()


def test_the_served_in_process_engine_logs_each_preemption_of_a_full_kv_cache(talker_dir, caplog):
    """vLLM preempts a running request when the KV cache cannot hold its next block, and
    says so only in its metrics; the engine host counts and logs each (the released-size
    benchmark reads them). Two requests of 200 tokens in a cache of one 256-position request
    (two 128-position blocks, and the null block vLLM keeps aside): one must be preempted.
    Control: a cache of both, none."""
    import asyncio
    import logging

    from vllm import SamplingParams, TokensPrompt

    from tritontts.engine.kv_budget import KvShape
    from tritontts.engine.vllm_talker import InprocEngine

    shape = KvShape.from_config(json.loads((talker_dir / "config.json").read_text()))
    one = shape.request_bytes(256, 4) + shape.block_bytes(4)       # and vLLM's null block
    args = {**ARGS, "max_model_len": 256}

    async def run(kv_bytes: int) -> int:
        engine = InprocEngine(str(talker_dir), {**args, "kv_cache_memory_bytes": kv_bytes},
                              asyncio.get_running_loop())
        try:
            params = SamplingParams(max_tokens=200, min_tokens=200, ignore_eos=True, temperature=0)

            async def one_request(name):
                async for output in engine.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]), params, name):
                    last = output
                return len(last.outputs[0].token_ids)

            assert await asyncio.gather(one_request("a"), one_request("b")) == [200, 200]
            return engine.preemptions
        finally:
            engine.shutdown()

    try:
        with caplog.at_level(logging.WARNING, logger="tritontts.talker"):
            assert asyncio.run(run(one)) >= 1
        assert "vLLM preempted request" in caplog.text and "the KV cache is full" in caplog.text
        caplog.clear()
        assert asyncio.run(run(one + shape.request_bytes(256, 4))) == 0
        assert "vLLM preempted request" not in caplog.text
    finally:
        release_vllm_process_state()
