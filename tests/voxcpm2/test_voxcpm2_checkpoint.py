"""The VoxCPM2 checkpoint layout read as data: config.json's fields (the same JSON upstream's
pydantic MiniCPM4Config accepts), LongRoPE factor counts checked against the head width,
every missing file or field named."""
from __future__ import annotations

import copy
import json

import pytest

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.voxcpm2.upstream import voxcpm_module
from tritontts.families.voxcpm2.checkpoint import REQUIRED_FILES, open_checkpoint, parse_config

HEAD = 32
CONFIG = {
    "lm_config": {"bos_token_id": 1, "eos_token_id": 2, "hidden_size": 128, "intermediate_size": 256,
                  "max_position_embeddings": 4096, "num_attention_heads": 4, "num_hidden_layers": 2,
                  "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 500, "use_mup": True,
                  "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4, "rope_theta": 10000.0,
                  "rope_scaling": {"type": "longrope", "long_factor": [1.0 + i / 10 for i in range(HEAD // 2)],
                                   "short_factor": [1.0] * (HEAD // 2), "original_max_position_embeddings": 2048}},
    "patch_size": 4, "feat_dim": 64, "residual_lm_num_layers": 2,
    "encoder_config": {"hidden_dim": 64, "ffn_dim": 128, "num_heads": 2, "num_layers": 1},
    "dit_config": {"hidden_dim": 64, "ffn_dim": 128, "num_heads": 2, "num_layers": 1,
                   "cfm_config": {"sigma_min": 1e-6, "solver": "euler", "t_scheduler": "log-norm",
                                  "inference_cfg_rate": 2.0}},
    "max_length": 4096, "dtype": "bfloat16",
}


def write(tmp_path, config=CONFIG):
    for name in REQUIRED_FILES:
        (tmp_path / name).write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def test_the_config_reads_as_upstreams_pydantic_model_reads_it(tmp_path):
    ckpt = open_checkpoint(write(tmp_path))
    with voxcpm_module("voxcpm.modules.minicpm4.config") as ref:
        theirs = ref.MiniCPM4Config(**CONFIG["lm_config"])
    lm = ckpt.config.lm
    assert (lm.hidden_size, lm.num_hidden_layers, lm.scale_emb, lm.dim_model_base, lm.scale_depth) == (
        theirs.hidden_size, theirs.num_hidden_layers, theirs.scale_emb, theirs.dim_model_base, theirs.scale_depth)
    assert lm.rope_long_factor == tuple(theirs.rope_scaling.long_factor)
    assert ckpt.config.dit.num_layers == 1 and ckpt.config.cfm["inference_cfg_rate"] == 2.0
    assert ckpt.config.audio_vae is None and ckpt.config.fsq_scale == 9   # upstream defaults


@pytest.mark.parametrize("name", [*REQUIRED_FILES, "tokenizer.json"])
def test_a_missing_file_is_named(tmp_path, name):
    write(tmp_path)
    (tmp_path / name).unlink()
    with pytest.raises(CheckpointError, match=name.split(".")[0]):
        open_checkpoint(tmp_path)


@pytest.mark.parametrize("path,value,needle", [
    (("lm_config", "hidden_size"), None, r"lm_config\.hidden_size is missing"),
    (("lm_config", "scale_emb"), "big", r"lm_config\.scale_emb must be a number"),
    (("lm_config", "rope_scaling", "long_factor"), [1.0, 2.0], r"long_factor has 2 values, the head width needs 16"),
    (("dit_config", "cfm_config"), None, r"dit_config\.cfm_config is missing"),
])
def test_a_bad_field_is_named_with_its_path(tmp_path, path, value, needle):
    config = copy.deepcopy(CONFIG)
    node = config
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    with pytest.raises(CheckpointError, match=needle):
        parse_config(write(tmp_path, config) / "config.json")
