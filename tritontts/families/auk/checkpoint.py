"""AuK / AuK-Flash checkpoints, in either of the two layouts they come in (read as data).

vLLM-Omni's assembled folder (its tools/prepare_auk_checkpoint.py, not published; ours is
build/auk_checkpoint.py):
  config.json            Qwen2.5-Omni-3B's config with model_type "auk" and the sections
                         dit, vae (model_init_kwargs), variant (base | flash), flash_t_grid,
                         defaults (nfe, cfg, sway)
  model*.safetensors     the Qwen2.5-Omni shards (thinker.*; talker.* and token2wav.* unused)
  tokenizer files        Qwen2.5-Omni's (vocab.json + merges.txt or tokenizer.json)
  auk.safetensors        transformer.* (the DiT), layer_weights, layer_scale (the fusion)
  vae.safetensors        the BigVGAN-flow VAE (flow.* is training-only)

Upstream's release (Tencent-Hunyuan/AuK):
  config.yaml            model: {name: AuK | AuK-Flash, arch: {DiT}, vae: {...},
                         schedule: {...}, text_encoder: {text_encoder_path}}
  auk_base.safetensors | auk_flash.safetensors   as auk.safetensors above
  vae.safetensors
  the thinker            a Qwen2.5-Omni-3B folder: text_encoder_path when that is a local
                         folder (relative to the checkpoint), else a subfolder named like its
                         last component (Qwen2.5-Omni-3B/) or thinker/. Hub ids are never
                         fetched: nothing is downloaded.

Both give one AuKCheckpoint; every error names the file and what is wrong with it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ...weights.checkpoint import (
    CheckpointError, ConfigFields, read_json, require_dir, require_tokenizer, safetensors_files,
    weight_names)

ASSEMBLED_CONFIG = "config.json"
UPSTREAM_CONFIGS = ("config.yaml", "config.yml")
ASSEMBLED_WEIGHTS = "auk.safetensors"
UPSTREAM_WEIGHTS = {"base": "auk_base.safetensors", "flash": "auk_flash.safetensors"}
VAE_WEIGHTS = "vae.safetensors"
DIT_PREFIX = "transformer."
FUSION_KEYS = ("layer_weights", "layer_scale")
# Training wrappers some exports keep around every name (EMA, DDP); stripped on load.
WRAPPER_PREFIXES = ("ema_model.", "module.", "net.")
THINKER_SUBFOLDERS = ("Qwen2.5-Omni-3B", "thinker")

VARIANTS = ("base", "flash")
# AuK-Flash's distilled 4-step grid (the released recipe: the student was trained on these
# exact times; rounding them changes the output level).
FLASH_T_GRID = (0.0, 0.07612049579620361, 0.2928932309150696, 0.6173166036605835, 1.0)
FLASH_NFE, FLASH_CFG = 4, 0.0
# The base model's recipe when the checkpoint does not say: 32 Euler steps, CFG 2, sway -1.
DEFAULT_NFE, DEFAULT_CFG, DEFAULT_SWAY = 32, 2.0, -1.0

DIT_FIELDS = ("dim", "heads", "dim_head", "ff_mult", "text_hidden_dim", "num_layers", "num_single_layers")


@dataclass(frozen=True)
class Schedule:
    """The checkpoint's sampling recipe."""
    nfe: int
    cfg: float
    sway: float
    t_grid: tuple[float, ...] | None       # fixed (AuK-Flash), else None


@dataclass(frozen=True)
class AuKCheckpoint:
    root: Path
    layout: str                     # "assembled" | "upstream"
    variant: str                    # "base" | "flash"
    dit: dict[str, Any]             # AuKTransformer's keyword arguments (latent_dim included)
    vae: dict[str, Any]             # the VAE's model_init_kwargs
    latent_dim: int
    hop: int                        # samples per latent frame (480: 50 Hz at 24 kHz)
    sample_rate: int
    schedule: Schedule
    thinker_root: Path              # config.json with thinker_config, shards, tokenizer
    thinker_config: dict[str, Any]
    weights_file: Path              # transformer.*, layer_weights, layer_scale
    vae_file: Path

    @property
    def is_flash(self) -> bool:
        return self.variant == "flash"

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.hop

    @cached_property
    def text_config(self) -> ConfigFields:
        return ConfigFields(self.thinker_config, self.thinker_root / ASSEMBLED_CONFIG, "thinker_config.").object(
            "text_config")

    @cached_property
    def audio_config(self) -> dict[str, Any]:
        return ConfigFields(self.thinker_config, self.thinker_root / ASSEMBLED_CONFIG, "thinker_config.").object(
            "audio_config").data

    @property
    def hidden_size(self) -> int:
        return self.text_config.int("hidden_size")

    @property
    def num_layers(self) -> int:
        return self.text_config.int("num_hidden_layers")

    @cached_property
    def thinker_files(self) -> tuple[Path, ...]:
        return safetensors_files(self.thinker_root, "Qwen2.5-Omni thinker")

    def frames_for(self, seconds: float) -> int:
        """Latent frames for a duration (rounded up, as upstream sizes its target)."""
        return max(1, math.ceil(seconds * self.sample_rate / self.hop - 1e-9))

    def read_weights(self) -> dict:
        """auk.safetensors' tensors (any training wrapper removed from their names): the DiT
        under transformer.*, and the fusion."""
        from ...weights.checkpoint import read_tensors

        return {strip_wrapper(k): v for k, v in read_tensors(self.weights_file, "").items()}

    def read_fusion(self) -> tuple[list[float], float]:
        """(layer_weights as fp32 values, layer_scale): the thinker layers' fusion."""
        from safetensors import safe_open

        names = {strip_wrapper(n): n for n in weight_names(self.weights_file)}
        with safe_open(str(self.weights_file), framework="pt", device="cpu") as f:
            weights = f.get_tensor(names["layer_weights"]).float().reshape(-1)
            scale = f.get_tensor(names["layer_scale"]).float().reshape(-1)
        if weights.numel() != self.num_layers or scale.numel() != 1:
            raise CheckpointError(f"{self.weights_file}: layer_weights has {weights.numel()} entries and layer_scale "
                                  f"{scale.numel()}; the thinker has {self.num_layers} layers (and one scale)")
        return [float(v) for v in weights], float(scale[0])



def strip_wrapper(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def open_checkpoint(path: str | Path) -> AuKCheckpoint:
    root = require_dir(path, "AuK")
    if (root / ASSEMBLED_CONFIG).is_file() and _model_type(root / ASSEMBLED_CONFIG) == "auk":
        return _assembled(root)
    for name in UPSTREAM_CONFIGS:
        if (root / name).is_file():
            return _upstream(root, root / name)
    raise CheckpointError(f"{root}: not an AuK checkpoint: expected config.json with model_type \"auk\" "
                          f"(vLLM-Omni's assembled layout) or config.yaml beside auk_base.safetensors / "
                          f"auk_flash.safetensors (upstream's release)")


def _model_type(path: Path) -> str | None:
    data = read_json(path)
    return data.get("model_type") if isinstance(data, dict) else None


def _assembled(root: Path) -> AuKCheckpoint:
    path = root / ASSEMBLED_CONFIG
    fields = ConfigFields(read_json(path), path)
    variant = fields.str("variant", "base", choices=VARIANTS)
    defaults = fields.object("defaults", {}) or ConfigFields({}, path, "defaults.")
    grid = fields.floats("flash_t_grid", FLASH_T_GRID) if variant == "flash" else None
    schedule = _schedule(variant, defaults.int("nfe", DEFAULT_NFE, low=1), defaults.float("cfg", DEFAULT_CFG),
                         defaults.float("sway", DEFAULT_SWAY), grid, path)
    thinker = fields.object("thinker_config").data
    return _finish(root, "assembled", variant, fields.object("dit"), fields.object("vae"), schedule, root,
                   thinker, root / ASSEMBLED_WEIGHTS)


def _upstream(root: Path, path: Path) -> AuKCheckpoint:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CheckpointError(f"{path}: not readable YAML ({exc})") from None
    top = ConfigFields(data, path)
    model = top.object("model") if top.has("model") else top
    name = model.str("name", "AuK")
    variant = "flash" if "flash" in name.lower() else "base"
    weights = root / UPSTREAM_WEIGHTS[variant]
    if not weights.is_file():       # the file name decides when the yaml's name does not
        other = "base" if variant == "flash" else "flash"
        if (root / UPSTREAM_WEIGHTS[other]).is_file():
            variant, weights = other, root / UPSTREAM_WEIGHTS[other]
    schedule_fields = model.object("schedule", {}) or ConfigFields({}, path, "model.schedule.")
    grid = schedule_fields.floats("t_grid", FLASH_T_GRID) if variant == "flash" else None
    schedule = _schedule(variant, _first(schedule_fields, ("nfe", "steps"), DEFAULT_NFE, int),
                         _first(schedule_fields, ("cfg_strength", "cfg"), DEFAULT_CFG, float),
                         _first(schedule_fields, ("sway_sampling_coef", "sway"), DEFAULT_SWAY, float), grid, path)
    encoder = model.object("text_encoder", {}) or ConfigFields({}, path, "model.text_encoder.")
    thinker_root = _thinker_folder(root, encoder.str("text_encoder_path", "Qwen/Qwen2.5-Omni-3B"), path)
    thinker_path = thinker_root / ASSEMBLED_CONFIG
    thinker = ConfigFields(read_json(thinker_path), thinker_path).object("thinker_config").data
    return _finish(root, "upstream", variant, model.object("arch"), model.object("vae"), schedule, thinker_root,
                   thinker, weights)


def _first(fields: ConfigFields, names: tuple[str, ...], default, kind):
    for name in names:
        if fields.has(name):
            return fields.int(name, low=1) if kind is int else fields.float(name)
    return default


def _thinker_folder(root: Path, named: str, config_path: Path) -> Path:
    candidates = [Path(named).expanduser()] if Path(named).is_absolute() else [root / named]
    candidates += [root / Path(named).name] + [root / sub for sub in THINKER_SUBFOLDERS]
    for folder in candidates:
        if (folder / ASSEMBLED_CONFIG).is_file():
            return folder.resolve()
    raise CheckpointError(
        f"{config_path}: the thinker (model.text_encoder.text_encoder_path = {named!r}) is not a local folder; "
        f"put a Qwen2.5-Omni-3B download at {root / Path(named).name} (nothing is downloaded), or set "
        f"text_encoder_path to its folder")


def _schedule(variant: str, nfe: int, cfg: float, sway: float, grid, path: Path) -> Schedule:
    if variant == "flash":
        grid = tuple(grid)
        if len(grid) != FLASH_NFE + 1 or any(b <= a for a, b in zip(grid, grid[1:])):
            raise CheckpointError(f"{path}: AuK-Flash needs a strictly increasing {FLASH_NFE + 1}-point time grid, "
                                  f"got {list(grid)}")
        return Schedule(FLASH_NFE, FLASH_CFG, 0.0, grid)
    return Schedule(nfe, cfg, sway, None)


def _finish(root: Path, layout: str, variant: str, dit: ConfigFields, vae: ConfigFields, schedule: Schedule,
            thinker_root: Path, thinker: dict, weights: Path) -> AuKCheckpoint:
    vae_kwargs = vae.object("model_init_kwargs").data
    latent_dim = vae.int("latent_dim", low=1)
    hop = vae.int("downsample_rate", low=1)
    rate = vae.int("target_sample_rate", low=1)
    rates = vae.object("model_init_kwargs").ints("downsample_rates")
    if math.prod(rates) != hop:
        vae.fail("downsample_rate", f"is {hop}, but model_init_kwargs.downsample_rates multiply to {math.prod(rates)}")
    dit_kwargs = {name: (dit.float(name) if name == "ff_mult" else dit.int(name, low=1)) for name in DIT_FIELDS}
    dit_kwargs["attn_mask_enabled"] = dit.bool("attn_mask_enabled", True)
    dit_kwargs["latent_dim"] = latent_dim
    require_tokenizer(thinker_root)
    for f in (weights, root / VAE_WEIGHTS):
        if not f.is_file():
            raise CheckpointError(f"{f}: missing from the AuK checkpoint")
    names = {strip_wrapper(n) for n in weight_names(weights)}
    missing = [k for k in FUSION_KEYS if k not in names]
    if missing or not any(n.startswith(DIT_PREFIX) for n in names):
        raise CheckpointError(f"{weights}: expected the DiT (transformer.*) and the layer fusion "
                              f"({', '.join(FUSION_KEYS)}); missing: {missing or ['transformer.*']}")
    checkpoint = AuKCheckpoint(root, layout, variant, dit_kwargs, vae_kwargs, latent_dim, hop, rate, schedule,
                               thinker_root, thinker, weights, root / VAE_WEIGHTS)
    text_hidden = checkpoint.hidden_size
    if text_hidden != dit_kwargs["text_hidden_dim"]:
        raise CheckpointError(f"{thinker_root / ASSEMBLED_CONFIG}: the thinker's hidden size {text_hidden} differs "
                              f"from the DiT's text_hidden_dim {dit_kwargs['text_hidden_dim']}")
    checkpoint.thinker_files  # noqa: B018 - the shards must exist (raises naming the missing one)
    return checkpoint
