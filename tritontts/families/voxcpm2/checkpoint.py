"""The released VoxCPM2 checkpoint layout (openbmb/VoxCPM2), opened from a path; nothing is
downloaded and nothing in it is executed.

  <root>/config.json            VoxCPMConfig as JSON: lm_config (MiniCPM4: muP, LongRoPE),
                                patch_size, feat_dim, residual_lm_num_layers, the scalar
                                quantizer, encoder_config, dit_config (+ cfm_config) and
                                audio_vae_config
  <root>/model.safetensors      base_lm.*, residual_lm.*, feat_encoder.*, feat_decoder.*,
                                fsq_layer.*, the projections and the stop head
  <root>/audiovae.safetensors   the causal AudioVAE v2 (tritontts.families.voxcpm2.audio_vae)
  <root>/tokenizer.json + tokenizer_config.json   a Llama tokenizer (LlamaTokenizerFast)

Read field by field (tritontts.weights.checkpoint.ConfigFields): a missing or malformed field is
named with its path (lm_config.rope_scaling.long_factor).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...weights.checkpoint import (
    CheckpointError, ConfigFields, read_json, require_dir, require_files)

REQUIRED_FILES = ("config.json", "model.safetensors", "audiovae.safetensors", "tokenizer_config.json")


@dataclass(frozen=True)
class LMConfig:
    """MiniCPM4 fields (upstream's MiniCPM4Config)."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    use_mup: bool
    scale_emb: float
    dim_model_base: int
    scale_depth: float
    kv_channels: int | None
    rope_long_factor: tuple[float, ...]
    rope_short_factor: tuple[float, ...]
    rope_original_max_position: int


@dataclass(frozen=True)
class LocalConfig:
    """The local encoder's or DiT's transformer sizes (encoder_config / dit_config)."""
    hidden_dim: int
    ffn_dim: int
    num_heads: int
    num_layers: int
    kv_channels: int | None


@dataclass(frozen=True)
class VoxCPM2Config:
    lm: LMConfig
    patch_size: int
    feat_dim: int
    residual_lm_num_layers: int
    residual_lm_no_rope: bool
    fsq_latent_dim: int
    fsq_scale: int
    encoder: LocalConfig
    dit: LocalConfig
    dit_mean_mode: bool
    cfm: dict
    audio_vae: dict | None
    max_length: int
    dtype: str


def _lm(f: ConfigFields) -> LMConfig:
    rope = f.object("rope_scaling")
    return LMConfig(
        hidden_size=f.int("hidden_size", low=1), intermediate_size=f.int("intermediate_size", low=1),
        num_hidden_layers=f.int("num_hidden_layers", low=1),
        num_attention_heads=f.int("num_attention_heads", low=1),
        num_key_value_heads=f.int("num_key_value_heads", low=1), vocab_size=f.int("vocab_size", low=1),
        max_position_embeddings=f.int("max_position_embeddings", low=1),
        rms_norm_eps=f.float("rms_norm_eps", positive=True), rope_theta=f.float("rope_theta", positive=True),
        use_mup=f.bool("use_mup", True), scale_emb=f.float("scale_emb"),
        dim_model_base=f.int("dim_model_base", low=1), scale_depth=f.float("scale_depth"),
        kv_channels=f.int("kv_channels", None, low=1),
        rope_long_factor=rope.floats("long_factor"), rope_short_factor=rope.floats("short_factor"),
        rope_original_max_position=rope.int("original_max_position_embeddings", low=1))


def _local(f: ConfigFields) -> LocalConfig:
    return LocalConfig(hidden_dim=f.int("hidden_dim", 1024, low=1), ffn_dim=f.int("ffn_dim", 4096, low=1),
                       num_heads=f.int("num_heads", 16, low=1), num_layers=f.int("num_layers", 4, low=1),
                       kv_channels=f.int("kv_channels", None, low=1))


def parse_config(path: Path) -> VoxCPM2Config:
    f = ConfigFields(read_json(path), path)
    dit = f.object("dit_config")
    cfm = dit.object("cfm_config")
    vae = f.object("audio_vae_config", None)
    config = VoxCPM2Config(
        lm=_lm(f.object("lm_config")), patch_size=f.int("patch_size", 4, low=1),
        feat_dim=f.int("feat_dim", 64, low=1), residual_lm_num_layers=f.int("residual_lm_num_layers", 8, low=1),
        residual_lm_no_rope=f.bool("residual_lm_no_rope", False),
        fsq_latent_dim=f.int("scalar_quantization_latent_dim", 512, low=1),
        fsq_scale=f.int("scalar_quantization_scale", 9, low=1),
        encoder=_local(f.object("encoder_config")), dit=_local(dit),
        dit_mean_mode=dit.bool("dit_mean_mode", False), cfm=dict(cfm.data),
        audio_vae=dict(vae.data) if vae is not None else None,
        max_length=f.int("max_length", 8192, low=1), dtype=f.str("dtype", "bfloat16"))
    n_rope = (config.lm.kv_channels or config.lm.hidden_size // config.lm.num_attention_heads) // 2
    for name, factors in (("long_factor", config.lm.rope_long_factor),
                          ("short_factor", config.lm.rope_short_factor)):
        if len(factors) != n_rope:
            raise CheckpointError(f"{path}: lm_config.rope_scaling.{name} has {len(factors)} values, "
                                  f"the head width needs {n_rope}")
    return config


@dataclass(frozen=True)
class VoxCPM2Checkpoint:
    root: Path
    config: VoxCPM2Config

    def path(self, name: str) -> Path:
        return self.root / name


def open_checkpoint(root: str | Path) -> VoxCPM2Checkpoint:
    root = require_dir(root, "VoxCPM2")
    require_files(root, REQUIRED_FILES, "VoxCPM2")
    if not (root / "tokenizer.json").is_file() and not (root / "tokenizer.model").is_file():
        raise CheckpointError(f"{root}: needs tokenizer.json (or tokenizer.model) for the Llama tokenizer")
    return VoxCPM2Checkpoint(root, parse_config(root / "config.json"))
