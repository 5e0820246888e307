"""The KV cache sized from a checkpoint's config (tritontts.engine.kv_budget). vLLM's own count
of what the sized cache holds is checked on every family's served talker
(tests/contract: test_every_vllm_stage_holds_the_full_length_requests_its_kv_cache_was_sized_for);
here the arithmetic, the config fields it reads and the refusals."""
import json

import pytest

from tritontts.engine.kv_budget import GIB, KvShape, SizingError, checkpoint_dtype, size_cpu_kv, size_gpu_share

# A 3.4 B backbone of 26 layers, 8 KV heads of 128 (the shape of a released 4 B talker)
RELEASED = {"num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_size": 3072, "torch_dtype": "bfloat16"}
HYBRID = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
          "hidden_size": 64, "full_attention_interval": 4, "linear_num_key_heads": 2,
          "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
          "linear_conv_kernel_dim": 4, "torch_dtype": "float32"}


def model_dir(tmp_path, config, weights_bytes=0):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if weights_bytes:
        with open(tmp_path / "model.safetensors", "wb") as f:
            f.truncate(weights_bytes)
    return tmp_path


def test_a_full_length_request_costs_layers_x_kv_heads_x_head_dim_x_2_per_position():
    shape = KvShape.from_config(RELEASED)
    # 26 x 8 x 128 x 2 x 4 bytes = 208 KiB per position in fp32; 4096 positions: 0.8125 GiB
    assert shape.request_bytes(4096, 4) == 26 * 8 * 128 * 2 * 4 * 4096
    assert shape.request_bytes(4096, 4) / GIB == pytest.approx(0.8125)
    assert shape.request_bytes(4096, 2) * 2 == shape.request_bytes(4096, 4)
    # whole 128-position blocks: 4097 positions take a 33rd block
    assert shape.request_bytes(4097, 4) == 26 * 8 * 128 * 2 * 4 * 4096 * 33 // 32


def test_missing_kv_heads_and_head_dim_follow_the_attention_heads_and_hidden_size():
    shape = KvShape.from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256})
    assert (shape.kv_heads, shape.head_dim) == (4, 64)


def test_a_hybrid_request_takes_its_attention_blocks_and_one_block_of_state_per_group_of_linear_layers():
    shape = KvShape.from_config(HYBRID)
    assert (shape.attention_layers, shape.linear_layers) == (1, 3)
    # state: 3 x (2x2x64 + 4x64) conv + 4x64x64 recurrent = 17 920 floats = 140 positions
    # of 512 bytes: the block is raised to 256 positions, a page 128 KiB
    assert shape.block_tokens(4) == 256
    assert shape.request_bytes(4096, 4) == (16 + 3) * 256 * 512
    # released-like: 3 attention and 11 linear layers group by 3: 11 + 4 blocks of 3 pages
    released = KvShape(attention_layers=3, kv_heads=2, head_dim=256, linear_layers=11, linear_state=300_000)
    block = released.block_tokens(4)
    assert block == 384
    assert released.request_bytes(4096, 4) == 3 * (11 + 4) * block * released.position_bytes(4)
    # the control: without full_attention_interval every layer is read as attention
    plain = KvShape.from_config({k: v for k, v in HYBRID.items() if k != "full_attention_interval"})
    assert plain.request_bytes(4096, 4) == 4 * 4096 * 512 and plain.linear_layers == 0


def test_layer_types_count_the_attention_layers_and_unknown_types_are_refused():
    config = {**HYBRID, "layer_types": ["linear_attention", "full_attention"] * 2}
    config.pop("full_attention_interval")
    assert KvShape.from_config(config).attention_layers == 2
    with pytest.raises(SizingError, match=r"layer_types \['sliding_attention'\] cannot be sized"):
        KvShape.from_config({**config, "layer_types": ["sliding_attention"] * 4})


def test_a_config_without_what_sizing_needs_names_the_file_and_the_field(tmp_path):
    path = model_dir(tmp_path, {"num_attention_heads": 4, "hidden_size": 64})
    with pytest.raises(SizingError, match=rf"{tmp_path}/config.json: field 'num_hidden_layers' is missing"):
        size_cpu_kv("x_talker", path, {"dtype": "float32", "max_model_len": 64}, 4, available=GIB)
    with pytest.raises(SizingError, match=r"config.json: .*No such file"):
        size_cpu_kv("x_talker", tmp_path / "nowhere", {"max_model_len": 64}, 4, available=GIB)


def test_the_budget_is_the_requests_times_a_full_length_request_in_the_engines_dtype(tmp_path):
    path = model_dir(tmp_path, RELEASED)
    budget = size_cpu_kv("x_talker", path, {"dtype": "auto", "max_model_len": 4096}, 4, available=64 * GIB)
    shape = KvShape.from_config(RELEASED)
    # and vLLM's null block: 128 positions of every layer (26 x 8 x 128 x 2 x 2 bytes each)
    assert shape.block_bytes(2) == 128 * 26 * 8 * 128 * 2 * 2
    assert budget.element == 2 and budget.bytes == 4 * shape.request_bytes(4096, 2) + shape.block_bytes(2)
    assert "KV for 4 requests of 4096 positions: 1.64 GiB (0.406 GiB each" in budget.describe()
    with pytest.raises(SizingError, match="dtype 'int3' is not one of"):
        size_cpu_kv("x_talker", path, {"dtype": "int3", "max_model_len": 4096}, 4, available=64 * GIB)


def test_a_launch_that_cannot_fit_is_refused_with_weights_kv_and_the_requests_that_fit(tmp_path):
    # 8 GiB of bf16 weights served in fp32 hold 16 GiB, the engine's runtime 11 % of that
    # (1.76 GiB); 4 requests of KV 3.25 GiB: 21.01 GiB (Voxtral TTS's released talker's sizes)
    path = model_dir(tmp_path, RELEASED, weights_bytes=8 * GIB)
    args = {"dtype": "float32", "max_model_len": 4096}
    null_block = KvShape.from_config(RELEASED).block_bytes(4)
    assert size_cpu_kv("x_talker", path, args, 4, available=22 * GIB).bytes == int(3.25 * GIB) + null_block
    with pytest.raises(SizingError) as refused:
        size_cpu_kv("x_talker", path, args, 4, available=20 * GIB)
    message = str(refused.value)
    assert "x_talker: does not fit: weights 16.00 GiB + runtime 1.76 GiB + KV for 4 requests" in message
    assert "> 20.00 GiB available; 2 request(s) would fit: serve with --kv-requests 2" in message
    with pytest.raises(SizingError, match="not even one request: use a lower --engine-arg x_talker.max_model_len"):
        size_cpu_kv("x_talker", path, args, 1, available=18 * GIB)
    # bfloat16 is offered only where the CPU runs it (the launcher refuses it elsewhere)
    with pytest.raises(SizingError) as here:
        size_cpu_kv("x_talker", path, args, 1, available=18 * GIB, bf16=None)
    assert "dtype=bfloat16" not in str(here.value) and "a CPU with AVX512-BF16 or AMX" in str(here.value)
    with pytest.raises(SizingError, match=r"--dtype bfloat16 \(or --engine-arg x_talker.dtype=bfloat16\), or a "
                                          "machine with more memory"):
        size_cpu_kv("x_talker", path, args, 1, available=18 * GIB, bf16="native")
    with pytest.raises(SizingError, match="dtype=bfloat16; emulated on this CPU: half the weights, slower"):
        size_cpu_kv("x_talker", path, args, 1, available=18 * GIB, bf16="emulated")
    # weights (16 GiB) and their runtime alone over what is free: no max_model_len advice
    with pytest.raises(SizingError) as weights:
        size_cpu_kv("x_talker", path, args, 1, available=10 * GIB)
    assert "the weights alone do not fit: use a machine with more memory" in str(weights.value)
    assert "max_model_len" not in str(weights.value)


def test_the_default_count_not_asked_for_is_bounded_by_what_fits_and_refused_only_below_one(tmp_path):
    path = model_dir(tmp_path, RELEASED, weights_bytes=8 * GIB)
    args = {"dtype": "float32", "max_model_len": 4096}
    # 20 GiB available holds the weights, their runtime and 2 of the 4 requests: taken, not refused
    budget = size_cpu_kv("x_talker", path, args, 4, available=20 * GIB, asked=False)
    assert budget.requests == 2 and budget.bytes == 2 * budget.request_bytes + budget.shape.block_bytes(4)
    # all 4 fit: the default is kept whole
    assert size_cpu_kv("x_talker", path, args, 4, available=22 * GIB, asked=False).requests == 4
    with pytest.raises(SizingError, match="not even one request"):
        size_cpu_kv("x_talker", path, args, 4, available=18 * GIB, asked=False)


def test_the_checkpoint_dtype_is_read_in_the_engines_names_and_an_unknown_one_names_the_file():
    assert checkpoint_dtype({"torch_dtype": "bfloat16"}) == "bfloat16"
    assert checkpoint_dtype({"dtype": "torch.float16"}) == "float16"
    assert checkpoint_dtype({"torch_dtype": "bf16"}) == "bfloat16"
    assert checkpoint_dtype({}) == "float32"
    with pytest.raises(SizingError, match=r"x/config.json: dtype 'int3' is not one of"):
        checkpoint_dtype({"torch_dtype": "int3"}, "x/config.json")


def test_a_gpu_share_too_small_for_the_checkpoint_is_refused_with_the_card_and_the_requests_that_fit(tmp_path):
    # 8 GiB of bf16 weights and 4 bf16 requests of 1.625 GiB / 4 in a share of an 80 GiB card
    path = model_dir(tmp_path, RELEASED, weights_bytes=8 * GIB)
    args = {"dtype": "auto", "max_model_len": 4096, "gpu_memory_utilization": 0.125}
    budget = size_gpu_share("x_talker", path, args, 4, 80 * GIB)
    assert budget.weights == 8 * GIB and budget.bytes == int(1.625 * GIB) + budget.shape.block_bytes(2)
    with pytest.raises(SizingError) as refused:
        size_gpu_share("x_talker", path, {**args, "gpu_memory_utilization": 0.11}, 4, 80 * GIB)
    message = str(refused.value)
    assert "weights 8.00 GiB + KV for 4 requests" in message
    assert "> 8.80 GiB (gpu_memory_utilization 0.11 of a 80 GiB card); 1 request(s) would fit" in message
    with pytest.raises(SizingError, match="not even one request: serve fewer families on the card"):
        size_gpu_share("x_talker", path, {**args, "gpu_memory_utilization": 0.1}, 4, 80 * GIB)


def test_weights_are_counted_from_the_safetensors_dtypes_not_a_config_that_names_another(tmp_path):
    """A generated engine folder says torch_dtype float32 beside linked bf16 weights (Fish
    Speech S2 Pro's released talker: counted as 8.5 GiB instead of 17 GiB in fp32, so it passed
    the check and was OOM-killed): the header's dtypes decide; integer tensors keep their size."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"w": np.zeros((256, 512), np.float16), "ids": np.zeros(1000, np.int64)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**RELEASED, "torch_dtype": "float32"}))
    from tritontts.engine.kv_budget import weight_bytes

    assert weight_bytes(tmp_path, 4, {"torch_dtype": "float32"}) == 256 * 512 * 4 + 1000 * 8
    assert weight_bytes(tmp_path, 2, {"torch_dtype": "float32"}) == 256 * 512 * 2 + 1000 * 8
    # Control: a file whose header cannot be read is rescaled from the config's dtype, as before.
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    assert weight_bytes(tmp_path, 4, {"torch_dtype": "bfloat16"}) == 8192


def test_the_stored_dtype_is_what_most_weights_are_in_whatever_the_config_says(tmp_path):
    """"auto" runs the checkpoint's own dtype where the device runs it well: read from the
    weights (a generated engine folder's config says float32 beside linked bf16 weights)."""
    import numpy as np
    from safetensors.numpy import save_file

    from tritontts.engine.kv_budget import stored_dtype

    save_file({"big": np.zeros((64, 64), np.float16), "small": np.zeros(8, np.float32),
               "ids": np.zeros(10_000, np.int64)}, str(tmp_path / "model.safetensors"))
    assert stored_dtype(tmp_path, {"torch_dtype": "float32"}) == "float16"
    # Control: no readable header, the config decides.
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 64)
    assert stored_dtype(tmp_path, {"torch_dtype": "bfloat16"}) == "bfloat16"
