"""The OmniVoice checkpoint layout: what the random writer produces loads, and every missing
or malformed file or field stops the load with an error naming it (the stages and the
launcher's preflight share open_checkpoint)."""
from __future__ import annotations

import json
import shutil

import pytest

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families import FAMILIES
from tritontts.families.omnivoice.checkpoint import REQUIRED_FILES, open_checkpoint


@pytest.fixture()
def copy(random_checkpoints, tmp_path):
    target = tmp_path / "omnivoice"
    shutil.copytree(random_checkpoints["omnivoice"], target)
    return target


def test_the_random_checkpoint_has_the_released_names_and_shapes(random_checkpoints):
    ckpt = open_checkpoint(random_checkpoints["omnivoice"])
    cfg = ckpt.config
    assert (cfg.audio_vocab_size, cfg.audio_mask_id, cfg.num_audio_codebook) == (1025, 1024, 8)
    assert {"audio_embeddings.weight", "audio_heads.weight", "llm.embed_tokens.weight",
            "llm.norm.weight", "codebook_layer_offsets"} <= ckpt.weight_names
    assert any(n.startswith("llm.layers.0.self_attn.q_norm") for n in ckpt.weight_names)


@pytest.mark.parametrize("name", REQUIRED_FILES)
def test_a_missing_file_is_named(copy, name):
    (copy / name).unlink()
    with pytest.raises(CheckpointError, match=name.split("/")[-1]):
        open_checkpoint(copy)
    with pytest.raises(CheckpointError, match=name.split("/")[-1]):
        FAMILIES["omnivoice"].open_checkpoint(copy)


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c.update(model_type="qwen3"), "model_type"),
    (lambda c: c.pop("llm_config"), "llm_config"),
    (lambda c: c["llm_config"].update(hidden_size="wide"), "llm_config.hidden_size"),
    (lambda c: c["llm_config"].update(num_key_value_heads=3), "num_key_value_heads"),
    (lambda c: c["llm_config"].update(vocab_size=500), "vocab_size"),
    (lambda c: c.update(audio_mask_id=2000), "audio_mask_id"),
    (lambda c: c["llm_config"].update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6}), "rope_type"),
], ids=["model_type", "no_llm_config", "hidden_size", "kv_heads", "vocab", "mask_id", "rope"])
def test_a_malformed_config_field_is_named(copy, edit, needle):
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=needle) as error:
        open_checkpoint(copy)
    assert "config.json" in str(error.value)


def test_unreadable_json_and_weights_are_named(copy):
    (copy / "audio_tokenizer" / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="preprocessor_config.json"):
        open_checkpoint(copy)


def test_weights_without_the_audio_head_are_named(copy):
    from safetensors.torch import load_file, save_file

    state = load_file(str(copy / "model.safetensors"))
    del state["audio_heads.weight"]
    save_file(state, str(copy / "model.safetensors"))
    with pytest.raises(CheckpointError, match="audio_heads.weight"):
        open_checkpoint(copy)


def test_the_4x_style_rope_theta_is_read_too(copy):
    config = json.loads((copy / "config.json").read_text())
    config["llm_config"].pop("rope_parameters")
    config["llm_config"]["rope_theta"] = 10000.0
    (copy / "config.json").write_text(json.dumps(config))
    assert open_checkpoint(copy).config.llm.rope_theta == 10000.0
