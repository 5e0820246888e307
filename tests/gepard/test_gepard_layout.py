"""Gepard's checkpoint is told by its layout, not its config: config.json is the bare
Qwen3.5 text backbone's (model_type qwen3_5_text), and gepard_config.json beside it is what
makes it Gepard (tritontts serve MODEL, tritontts/launch/resolve.py)."""
from __future__ import annotations

import shutil

import pytest

from tritontts.launch.resolve import ResolveError, detect


def test_gepard_is_told_by_its_sidecar_though_its_config_says_qwen3_5_text(random_checkpoints, tmp_path):
    gepard = random_checkpoints["gepard"]
    assert detect(gepard).name == "gepard"
    bare = tmp_path / "bare"
    shutil.copytree(gepard, bare, symlinks=True)
    (bare / "gepard_config.json").unlink()          # a plain Qwen3.5 text model: no family's
    with pytest.raises(ResolveError, match="model_type 'qwen3_5_text'"):
        detect(bare)
