"""The Voxtral TTS checkpoint read as data: the tiny random one opens, its networks load
strictly from consolidated.safetensors, and a missing voice file, a bad field or a voice
embedding of the wrong width is an error naming the file and what is wrong."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tritontts.weights.checkpoint import CheckpointError, load_strict
from tritontts.families.voxtral_tts.acoustic import AcousticTransformer
from tritontts.families.voxtral_tts.checkpoint import open_checkpoint
from tritontts.families.voxtral_tts.codec import load_codec
from tritontts.families.voxtral_tts.random_checkpoint import write_random_checkpoint


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("voxtral") / "tiny", seed=1)


def copy(root, tmp_path):
    return shutil.copytree(root, tmp_path / "copy")


def test_tiny_checkpoint_opens_and_its_networks_load_strictly(root):
    ckpt = open_checkpoint(root)
    c = ckpt.config
    assert c.voices == ("casual_male", "neutral_female") and c.audio_token_id == 24
    assert c.codec.samples_per_frame == 1920 and c.acoustic.input_dim == c.backbone.dim
    state = load_file(str(root / "consolidated.safetensors"))
    load_codec(state, c.codec, "consolidated.safetensors")
    load_strict(AcousticTransformer(c.acoustic), {k[len("acoustic_transformer."):]: v for k, v in state.items()
                                                  if k.startswith("acoustic_transformer.")}, "acoustic")
    assert ckpt.voice_embedding("casual_male").shape == (6, c.backbone.dim)


def test_a_missing_voice_file_is_named(root, tmp_path):
    broken = copy(root, tmp_path)
    (broken / "voice_embedding" / "neutral_female.pt").unlink()
    with pytest.raises(CheckpointError, match="neutral_female"):
        open_checkpoint(broken)


def test_a_bad_field_is_named(root, tmp_path):
    broken = copy(root, tmp_path)
    params = json.loads((broken / "params.json").read_text())
    params["multimodal"]["audio_model_args"]["acoustic_transformer_args"]["dim"] = 32
    (broken / "params.json").write_text(json.dumps(params))
    with pytest.raises(CheckpointError, match="acoustic_transformer_args.dim"):
        open_checkpoint(broken)


def test_a_voice_embedding_of_the_wrong_width_is_named(root, tmp_path):
    broken = copy(root, tmp_path)
    torch.save(torch.zeros(5, 7), broken / "voice_embedding" / "casual_male.pt")
    with pytest.raises(CheckpointError, match=r"casual_male.pt: a voice embedding is \[tokens, 64\]"):
        open_checkpoint(broken).voice_embedding("casual_male")
