"""Gepard-1.0's checkpoint reader (tritontts.families.gepard.checkpoint) on the generator's tiny
layout: it opens, and each missing or malformed piece stops it with an error naming the
file and the field."""
from __future__ import annotations

import json
import shutil

import pytest

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.gepard.checkpoint import open_checkpoint


@pytest.fixture(scope="module")
def tiny(random_checkpoints):
    return random_checkpoints["gepard"]


def copy(tiny, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(tiny, out)
    return out


def test_the_generated_layout_opens_with_the_sidecar_and_codec_archive(tiny):
    c = open_checkpoint(tiny)
    assert c.config.head_levels == (8, 7, 6, 6) * 8 and c.config.speaker_slots == 8
    assert c.codec_file.name == "nemo-nano-codec-22khz-1.89kbps-21.5fps.nemo"
    assert c.config.backbone.layer_types.count("full_attention") == 1


@pytest.mark.parametrize("edit,needle", [
    (lambda root: (root / "gepard_config.json").unlink(), "gepard_config.json: missing"),
    (lambda root: next(root.glob("*.nemo")).unlink(), ".nemo: missing"),
    (lambda root: (root / "model.safetensors").unlink(), "model.safetensors: missing"),
    (lambda root: edit_json(root / "gepard_config.json", lambda d: d["audio_heads"].pop("level_audio_31")),
     "audio_heads"),
    (lambda root: edit_json(root / "gepard_config.json", lambda d: d["special_tokens"].update(end_of_speech=10**6)),
     "special_tokens.end_of_speech"),
    (lambda root: edit_json(root / "config.json", lambda d: d.update(model_type="qwen3")), "model_type"),
    (lambda root: edit_json(root / "config.json", lambda d: d.update(layer_types=["full_attention"])), "layer_types"),
])
def test_a_missing_or_malformed_piece_is_an_error_naming_it(tiny, tmp_path, edit, needle):
    root = copy(tiny, tmp_path)
    edit(root)
    with pytest.raises(CheckpointError, match=needle.replace(".", r"\.")):
        open_checkpoint(root)


def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
