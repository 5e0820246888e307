"""The higgs-audio v2 checkpoint layout: the random writer's checkpoint is exactly what
transformers' HiggsAudioV2ForConditionalGeneration loads (no missing or unexpected tensor),
both tensor namings and sharded weights open, and every missing or malformed file or field
stops the load with an error naming it (the stages and the launcher's preflight share
open_checkpoint)."""
from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families import FAMILIES
from tritontts.families.higgs_audio_v2.checkpoint import (
    REQUIRED_FILES, WEIGHTS_FILE, WEIGHTS_INDEX_FILE, canonical_name, open_checkpoint)


@pytest.fixture()
def copy(random_checkpoints, tmp_path):
    target = tmp_path / "higgs"
    shutil.copytree(random_checkpoints["higgs_audio_v2"], target)
    return target


def test_transformers_loads_the_random_checkpoint_with_no_missing_or_unexpected_tensor(random_checkpoints):
    from transformers import HiggsAudioV2ForConditionalGeneration

    _, info = HiggsAudioV2ForConditionalGeneration.from_pretrained(
        str(random_checkpoints["higgs_audio_v2"]), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"] and not info["error_msgs"]
    assert not info["unexpected_keys"]


def test_the_random_checkpoint_has_the_released_fields(random_checkpoints):
    ckpt = open_checkpoint(random_checkpoints["higgs_audio_v2"])
    cfg = ckpt.config
    assert (cfg.num_codebooks, cfg.codebook_size, cfg.audio_stream_bos_id, cfg.audio_stream_eos_id) == (8, 1026, 1024, 1025)
    assert cfg.rope.rope_type == "llama3" and cfg.rope.factor == 32.0
    assert ckpt.generation.ras_win_len == 7 and ckpt.generation.ras_win_max_num_repeat == 2


@pytest.mark.parametrize("name,expected", [
    ("audio_codebook_embeddings.weight", "model.embed_audio_tokens.embed_audio_tokens.weight"),
    ("layers.3.audio_mlp.up_proj.weight", "model.layers.3.audio_mlp.up_proj.weight"),
    ("embed_tokens.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("audio_decoder_proj.audio_lm_head.weight", "audio_lm_head.weight"),
    ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight"),
])
def test_original_boson_names_map_onto_the_transformers_names(name, expected):
    assert canonical_name(name) == expected


def test_weights_under_the_original_names_and_in_shards_open(copy):
    state = load_file(str(copy / WEIGHTS_FILE))
    original = {}
    for name, tensor in state.items():
        name = name.replace("model.embed_audio_tokens.embed_audio_tokens.", "audio_codebook_embeddings.")
        name = name.replace("audio_lm_head.", "audio_decoder_proj.audio_lm_head.")
        original[name[len("model."):] if name.startswith("model.") else name] = tensor
    names = sorted(original)
    halves = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in halves.items():
        save_file({k: original[k] for k in keys}, str(copy / shard))
    (copy / WEIGHTS_INDEX_FILE).write_text(json.dumps(
        {"weight_map": {k: shard for shard, keys in halves.items() for k in keys}}))
    (copy / WEIGHTS_FILE).unlink()
    ckpt = open_checkpoint(copy)
    assert len(ckpt.weight_files) == 2
    assert {canonical_name(n) for n in original} == set(ckpt.weight_names)


@pytest.mark.parametrize("name", REQUIRED_FILES + (WEIGHTS_FILE,))
def test_a_missing_file_is_named(copy, name):
    (copy / name).unlink()
    with pytest.raises(CheckpointError, match=name.split("/")[-1]):
        open_checkpoint(copy)
    with pytest.raises(CheckpointError, match=name.split("/")[-1]):
        FAMILIES["higgs_audio_v2"].open_checkpoint(copy)


def test_a_codec_folder_without_weights_is_named_and_the_legacy_codec_layout_opens(copy):
    from tritontts.nn.higgs_codec import write_legacy_codec

    (copy / "audio_tokenizer" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"audio_tokenizer: no codec weights \(model.safetensors or model.pth\)"):
        open_checkpoint(copy)
    shutil.rmtree(copy / "audio_tokenizer")
    write_legacy_codec(copy / "audio_tokenizer")
    assert open_checkpoint(copy).codec_dir == copy / "audio_tokenizer"


def test_a_missing_tensor_and_a_missing_shard_are_named(copy):
    state = load_file(str(copy / WEIGHTS_FILE))
    del state["model.layers.1.audio_mlp.down_proj.weight"]
    save_file(state, str(copy / WEIGHTS_FILE))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.audio_mlp\.down_proj\.weight"):
        open_checkpoint(copy)
    (copy / WEIGHTS_FILE).unlink()
    (copy / WEIGHTS_INDEX_FILE).write_text(json.dumps({"weight_map": {"x": "model-00001-of-00009.safetensors"}}))
    with pytest.raises(CheckpointError, match="model-00001-of-00009.safetensors"):
        open_checkpoint(copy)


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c.update(model_type="higgs_audio"), "original boson-ai config"),
    (lambda c: c.update(model_type="llama"), "model_type"),
    (lambda c: c.update(hidden_size="wide"), "hidden_size"),
    (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads"),
    (lambda c: c.update(codebook_size=1024), "codebook_size"),
    (lambda c: c.update(audio_token_id=10**6), "audio_token_id"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6}), "rope_type"),
    (lambda c: c["rope_parameters"].pop("factor"), "rope_parameters.factor"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
], ids=["boson", "model_type", "hidden_size", "kv_heads", "codebook_size", "audio_token", "rope",
        "rope_factor", "act"])
def test_a_malformed_config_field_is_named(copy, edit, needle):
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=needle) as error:
        open_checkpoint(copy)
    assert "config.json" in str(error.value)


def test_a_tokenizer_whose_audio_token_is_not_the_configs_is_named(copy):
    from tritontts.families.higgs_audio_v2.prompt import TextTokenizer

    config = json.loads((copy / "config.json").read_text())
    config["audio_token_id"] = config["audio_token_id"] - 1
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"<\|AUDIO_OUT\|>.*audio_token_id"):
        TextTokenizer(open_checkpoint(copy))


def test_unreadable_json_and_weights_are_named(copy):
    (copy / "generation_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="generation_config.json"):
        open_checkpoint(copy)
    (copy / "generation_config.json").write_text("{}")
    (copy / WEIGHTS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match=WEIGHTS_FILE):
        open_checkpoint(copy)
