"""AuK checkpoints in both real layouts (vLLM-Omni's assembled folder and upstream's release)
read as data into one description; what is missing or malformed stops the load naming the
file; build/auk_checkpoint.py assembles upstream's release into vLLM-Omni's layout."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tritontts.families.auk.checkpoint import FLASH_T_GRID, open_checkpoint
from tritontts.families.auk.random_checkpoint import write_random_checkpoint
from tritontts.weights.checkpoint import CheckpointError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    base = tmp_path_factory.mktemp("auk")
    return {(layout, variant): write_random_checkpoint(base / f"{layout}-{variant}", seed=4, layout=layout,
                                                       variant=variant)
            for layout in ("assembled", "upstream") for variant in ("base", "flash")}


def test_both_layouts_describe_the_same_model(layouts):
    for variant in ("base", "flash"):
        a, u = (open_checkpoint(layouts[(layout, variant)]) for layout in ("assembled", "upstream"))
        assert (a.layout, u.layout) == ("assembled", "upstream")
        assert a.variant == u.variant == variant
        assert a.dit == u.dit and a.vae == u.vae and a.schedule == u.schedule
        assert a.thinker_config == u.thinker_config
        assert (a.latent_dim, a.hop, a.sample_rate) == (u.latent_dim, u.hop, u.sample_rate) == (64, 480, 24000)
        assert a.read_fusion() == u.read_fusion()
        assert u.thinker_root.name == "Qwen2.5-Omni-3B" and u.weights_file.name == f"auk_{variant}.safetensors"


def test_flash_runs_its_distilled_grid_and_base_its_recipe(layouts):
    flash = open_checkpoint(layouts[("assembled", "flash")]).schedule
    assert (flash.nfe, flash.cfg, flash.t_grid) == (4, 0.0, FLASH_T_GRID)
    base = open_checkpoint(layouts[("upstream", "base")]).schedule
    assert (base.nfe, base.cfg, base.sway, base.t_grid) == (32, 2.0, -1.0, None)


def copy(root: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(root, out, symlinks=True)
    return out


@pytest.mark.parametrize("layout, breakage, needle", [
    ("assembled", lambda r: (r / "vae.safetensors").unlink(), "vae.safetensors: missing"),
    ("assembled", lambda r: (r / "auk.safetensors").unlink(), "auk.safetensors: missing"),
    ("assembled", lambda r: (r / "model.safetensors").unlink(), "model.safetensors"),
    ("assembled", lambda r: (r / "vocab.json").unlink(), "tokenizer"),
    ("assembled", lambda r: _edit_json(r / "config.json", lambda c: c.pop("dit")), "dit is missing"),
    ("assembled", lambda r: _edit_json(r / "config.json", lambda c: c.update(variant="turbo")), "variant"),
    ("assembled", lambda r: _edit_json(r / "config.json", lambda c: c["vae"].update(downsample_rate=400)),
     "multiply to 480"),
    ("assembled", lambda r: _edit_json(r / "config.json", lambda c: c.update(variant="flash", flash_t_grid=[0, 1])),
     "5-point time grid"),
    ("assembled", lambda r: _drop_tensor(r / "auk.safetensors", "layer_scale"), "layer_scale"),
    ("upstream", lambda r: shutil.rmtree(r / "Qwen2.5-Omni-3B"), "not a local folder"),
    ("upstream", lambda r: (r / "config.yaml").write_text("model: [unclosed"), "config.yaml: not readable YAML"),
    ("upstream", lambda r: (r / "config.yaml").write_text("model: 3\n"), "model must be a JSON object"),
])
def test_a_missing_or_malformed_file_stops_the_load_naming_it(layouts, tmp_path, layout, breakage, needle):
    root = copy(layouts[(layout, "base")], tmp_path)
    breakage(root)
    with pytest.raises(CheckpointError, match=needle):
        open_checkpoint(root)


def test_a_folder_that_is_neither_layout_is_refused_saying_what_was_expected(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(CheckpointError, match="model_type"):
        open_checkpoint(tmp_path)


def test_the_assembly_tool_turns_upstream_into_the_assembled_layout(layouts, tmp_path):
    upstream = layouts[("upstream", "flash")]
    out = tmp_path / "assembled"
    subprocess.run([sys.executable, str(REPO / "build" / "auk_checkpoint.py"), str(upstream), str(out)],
                   check=True, cwd=REPO)
    a, u = open_checkpoint(out), open_checkpoint(upstream)
    assert a.layout == "assembled" and json.loads((out / "config.json").read_text())["model_type"] == "auk"
    assert (a.variant, a.dit, a.vae, a.schedule, a.thinker_config) == (u.variant, u.dit, u.vae, u.schedule,
                                                                        u.thinker_config)
    assert a.read_fusion() == u.read_fusion()
    from safetensors.torch import load_file

    ours, theirs = load_file(str(a.weights_file)), load_file(str(u.weights_file))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert {p.name for p in out.iterdir()} >= {"config.json", "auk.safetensors", "vae.safetensors",
                                               "model.safetensors", "vocab.json", "merges.txt"}


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _drop_tensor(path: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    del tensors[name]
    save_file(tensors, str(path))
