"""Upstream's AuK release -> vLLM-Omni's assembled layout (its tools/prepare_auk_checkpoint.py
is not published; this is ours). Both layouts serve here as they are: assemble to hand the
checkpoint to vLLM-Omni, or to keep one self-contained folder.

The assembled config.json is the thinker folder's Qwen2.5-Omni config with model_type "auk"
and the sections dit, vae, variant, flash_t_grid and defaults; the thinker's files (shards,
index, tokenizer, processor configs) and vae.safetensors are linked (or copied); the DiT and
fusion tensors become auk.safetensors (linked when their names are already bare, rewritten
when a training wrapper prefixes them).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from ...weights.checkpoint import CheckpointError, publish_dir, read_json, weight_names
from .checkpoint import ASSEMBLED_CONFIG, ASSEMBLED_WEIGHTS, VAE_WEIGHTS, open_checkpoint, strip_wrapper


def assemble(upstream: str | Path, out: str | Path, copy: bool = False) -> Path:
    checkpoint = open_checkpoint(upstream)
    if checkpoint.layout != "upstream":
        raise CheckpointError(f"{checkpoint.root}: already vLLM-Omni's assembled layout")
    out = Path(out).resolve()
    if out.exists():
        raise CheckpointError(f"{out}: exists; give a new folder")
    config = dict(read_json(checkpoint.thinker_root / ASSEMBLED_CONFIG))
    schedule = checkpoint.schedule
    dit = {k: v for k, v in checkpoint.dit.items() if k != "latent_dim"}
    config.update(model_type="auk", architectures=["AuKForConditionalGeneration"], dit=dit,
                  vae={"latent_dim": checkpoint.latent_dim, "downsample_rate": checkpoint.hop,
                       "target_sample_rate": checkpoint.sample_rate, "model_init_kwargs": checkpoint.vae},
                  variant=checkpoint.variant,
                  flash_t_grid=list(schedule.t_grid) if schedule.t_grid else None,
                  defaults={"nfe": schedule.nfe, "cfg": schedule.cfg, "sway": schedule.sway})
    if config["flash_t_grid"] is None:
        del config["flash_t_grid"]

    def place(source: Path, folder: Path, name: str | None = None) -> None:
        target = folder / (name or source.name)
        if copy:
            shutil.copy2(source, target)
        else:
            target.symlink_to(source.resolve())

    def fill(folder: Path) -> None:
        (folder / ASSEMBLED_CONFIG).write_text(json.dumps(config, indent=2))
        for f in sorted(checkpoint.thinker_root.iterdir()):
            if f.is_file() and f.name != ASSEMBLED_CONFIG:
                place(f, folder)
        place(checkpoint.vae_file, folder, VAE_WEIGHTS)
        names = weight_names(checkpoint.weights_file)
        if all(strip_wrapper(n) == n for n in names):
            place(checkpoint.weights_file, folder, ASSEMBLED_WEIGHTS)
        else:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in checkpoint.read_weights().items()},
                      str(folder / ASSEMBLED_WEIGHTS), metadata={"format": "pt"})

    return publish_dir(out, fill)
