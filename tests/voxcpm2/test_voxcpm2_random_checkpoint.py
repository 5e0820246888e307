"""The random-weight VoxCPM2 writer: the tiny checkpoint opens with open_checkpoint, its
model.safetensors holds exactly the tensors (names and shapes) of voxcpm 2.0.3's VoxCPM2Model
built from the written config.json (audio_vae.* aside: that is audiovae.safetensors), our
modules load their slices strictly, and the tokenizer keeps upstream's audio token ids."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tritontts.weights.checkpoint import load_strict
from tritontts.families.voxcpm2.audio_vae import AudioVAEConfig, load_audio_vae
from tritontts.families.voxcpm2.checkpoint import open_checkpoint
from tritontts.families.voxcpm2.local import LocalCFM, LocDiT, LocEnc, ScalarQuantizer
from tritontts.families.voxcpm2.minicpm4 import MiniCPM4Config, MiniCPM4Stack
from tritontts.families.voxcpm2.random_checkpoint import AUDIO_TOKENS, write_random_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("voxcpm2") / "tiny", seed=3)


@pytest.fixture(scope="module")
def state(ckpt):
    return load_file(str(ckpt / "model.safetensors"))


def _reference_state_shapes(root) -> dict[str, tuple[int, ...]]:
    """Upstream's VoxCPM2Model built from root's config.json, on the CPU; its AudioVAE is a
    stand-in with the sizes only, so no audio_vae.* keys appear."""
    from tritontts.families.voxcpm2.upstream import voxcpm2_upstream_model

    model = voxcpm2_upstream_model(root, audio_vae=False)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_opens_with_open_checkpoint(ckpt):
    c = open_checkpoint(ckpt).config
    assert (c.lm.hidden_size, c.lm.num_hidden_layers, c.patch_size) == (128, 2, 4)
    assert len(c.lm.rope_long_factor) == 128 // c.lm.num_attention_heads // 2
    assert c.lm.max_position_embeddings > c.lm.rope_original_max_position   # long factors in use
    assert c.feat_dim == AudioVAEConfig.from_dict(c.audio_vae).latent_dim


def test_model_tensors_match_reference(ckpt, state):
    ref = _reference_state_shapes(ckpt)
    assert not any(k.startswith("audio_vae.") for k in state)
    assert sorted(state) == sorted(ref)
    assert {k: tuple(v.shape) for k, v in state.items()} == ref
    assert all(v.dtype == torch.float32 for v in state.values())


def _slice(state, prefix):
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def test_our_modules_load_their_slices(ckpt, state):
    config = json.loads((ckpt / "config.json").read_text())
    lm, feat = config["lm_config"], config["feat_dim"]
    h = lm["hidden_size"]
    base = _slice(state, "base_lm.")
    assert base.pop("embed_tokens.weight").shape == (lm["vocab_size"], h)
    load_strict(MiniCPM4Stack(MiniCPM4Config.from_lm_config(lm)), base, "base_lm")
    load_strict(MiniCPM4Stack(MiniCPM4Config.from_lm_config(
        lm, num_hidden_layers=config["residual_lm_num_layers"])), _slice(state, "residual_lm."), "residual_lm")
    load_strict(LocEnc(MiniCPM4Config.for_local_module(lm, config["encoder_config"]), feat),
                _slice(state, "feat_encoder."), "feat_encoder")
    load_strict(LocalCFM(LocDiT(MiniCPM4Config.for_local_module(lm, config["dit_config"]), feat), feat),
                _slice(state, "feat_decoder."), "feat_decoder")
    load_strict(ScalarQuantizer(h, h, config["scalar_quantization_latent_dim"],
                                config["scalar_quantization_scale"]), _slice(state, "fsq_layer."), "fsq_layer")
    vae = load_audio_vae(ckpt / "audiovae.safetensors", AudioVAEConfig.from_dict(config["audio_vae_config"]))
    assert vae.config.latent_dim == feat
    # Random, not zero or constant: norms near 1, the rest spread around 0.
    assert all(v.std() > 0.01 for k, v in state.items() if v.numel() > 1 and not k.endswith("norm.weight"))


def test_tokenizer_keeps_audio_token_ids(ckpt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    for i, token in AUDIO_TOKENS.items():
        assert tok.convert_tokens_to_ids(token) == i
    text = "Hello there, ü!"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id == 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert len(tok) == json.loads((ckpt / "config.json").read_text())["lm_config"]["vocab_size"]


def test_seeded(ckpt, state, tmp_path):
    again = load_file(str(write_random_checkpoint(tmp_path / "again", seed=3) / "model.safetensors"))
    assert all(torch.equal(again[k], v) for k, v in state.items())
    other = load_file(str(write_random_checkpoint(tmp_path / "other", seed=4) / "model.safetensors"))
    assert not torch.equal(other["stop_head.weight"], state["stop_head.weight"])
