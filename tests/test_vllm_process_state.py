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
    from tritontts.cosyvoice3.checkpoint import open_checkpoint
    from tritontts.cosyvoice3.talker import convert_llm_checkpoint

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
