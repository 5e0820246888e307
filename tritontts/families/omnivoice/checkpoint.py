"""The released OmniVoice checkpoint layout (k2-fsa/OmniVoice), opened from a path.

  <root>/config.json              model_type omnivoice; audio_vocab_size (1025: 1024 codes
                                  and the mask), audio_mask_id (1024), num_audio_codebook (8),
                                  audio_codebook_weights (training only), llm_config (a
                                  Qwen3 config: the bidirectional backbone)
  <root>/model.safetensors        llm.* (Qwen3Model: embed_tokens, layers, norm),
                                  audio_embeddings.weight [8 * 1025, H],
                                  audio_heads.weight [8 * 1025, H]
                                  (codebook_layer_offsets, a derived buffer, may be there too)
  <root>/tokenizer.json or vocab.json + merges.txt, tokenizer_config.json
                                  Qwen3's text tokenizer with OmniVoice's control tokens
                                  (<|lang_start|>, <|text_start|>, <|denoise|>, ...)
  <root>/audio_tokenizer/         the higgs-audio v2 codec (tritontts/nn/higgs_codec/)

config.json is read as data; every missing or malformed file or field is a CheckpointError
naming it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...weights.checkpoint import (
    CheckpointError, ConfigFields, read_json, require_dir, require_files, require_json_objects,
    require_tokenizer, weight_names)
from ...nn.qwen3_shape import Qwen3Shape

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CODEC_DIR = "audio_tokenizer"
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_CONFIG_FILE, f"{CODEC_DIR}/config.json",
                  f"{CODEC_DIR}/model.safetensors", f"{CODEC_DIR}/preprocessor_config.json")
LLM_PREFIX = "llm."
AUDIO_WEIGHTS = ("audio_embeddings.weight", "audio_heads.weight")
# The control tokens the prompt is built from (tritontts/families/omnivoice/text.py): each must be one
# token of the tokenizer, or the prompt is not the one the model was trained on.
CONTROL_TOKENS = ("<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>",
                  "<|instruct_end|>", "<|text_start|>", "<|text_end|>")


@dataclass(frozen=True)
class OmniVoiceConfig:
    audio_vocab_size: int
    audio_mask_id: int
    num_audio_codebook: int
    llm: Qwen3Shape                # llm_config: the backbone


def _rope_theta(llm: ConfigFields) -> float:
    # transformers 5 writes rope_parameters {rope_type, rope_theta}; 4.x wrote rope_theta.
    params = llm.object("rope_parameters", None)
    if params is not None:
        kind = params.str("rope_type", "default")
        if kind != "default":
            params.fail("rope_type", f"is {kind!r}; only plain RoPE ('default') is built here")
        return params.float("rope_theta", positive=True)
    scaling = llm.object("rope_scaling", None)
    if scaling is not None and scaling.str("rope_type", "default") != "default":
        scaling.fail("rope_type", "is not 'default'; only plain RoPE is built here")
    return llm.float("rope_theta", 1000000.0, positive=True)


def parse_config(data, path: Path) -> OmniVoiceConfig:
    fields = ConfigFields(data, path)
    model_type = fields.str("model_type")
    if model_type != "omnivoice":
        fields.fail("model_type", f"is {model_type!r}; an OmniVoice checkpoint says 'omnivoice'")
    llm = fields.object("llm_config")
    hidden = llm.int("hidden_size", low=1)
    heads = llm.int("num_attention_heads", low=1)
    shape = Qwen3Shape(
        vocab_size=llm.int("vocab_size", low=1), hidden_size=hidden,
        intermediate_size=llm.int("intermediate_size", low=1),
        num_hidden_layers=llm.int("num_hidden_layers", low=1), num_attention_heads=heads,
        num_key_value_heads=llm.int("num_key_value_heads", heads, low=1),
        head_dim=llm.int("head_dim", hidden // heads, low=2),
        rms_norm_eps=llm.float("rms_norm_eps", 1e-6, positive=True),
        rope_theta=_rope_theta(llm), attention_bias=llm.bool("attention_bias", False),
        max_position_embeddings=llm.int("max_position_embeddings", 40960, low=1))
    if heads % shape.num_key_value_heads:
        llm.fail("num_key_value_heads", f"({shape.num_key_value_heads}) must divide "
                 f"num_attention_heads ({heads})")
    vocab = fields.int("audio_vocab_size", 1025, low=2)
    mask = fields.int("audio_mask_id", 1024, low=0)
    if mask >= vocab:
        fields.fail("audio_mask_id", f"({mask}) must be below audio_vocab_size ({vocab})")
    if shape.vocab_size < vocab:
        llm.fail("vocab_size", f"({shape.vocab_size}) must be at least audio_vocab_size ({vocab}): "
                 "audio positions look up their first code in the text table too")
    return OmniVoiceConfig(audio_vocab_size=vocab, audio_mask_id=mask,
                           num_audio_codebook=fields.int("num_audio_codebook", 8, low=1), llm=shape)


@dataclass(frozen=True)
class OmniVoiceCheckpoint:
    root: Path
    config: OmniVoiceConfig
    weight_names: frozenset[str]

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def codec_dir(self) -> Path:
        return self.root / CODEC_DIR


def open_checkpoint(root: str | Path) -> OmniVoiceCheckpoint:
    root = require_dir(root, "OmniVoice")
    require_files(root, REQUIRED_FILES, "OmniVoice")
    require_tokenizer(root)
    config = parse_config(read_json(root / CONFIG_FILE), root / CONFIG_FILE)
    require_json_objects(root / CODEC_DIR, ("config.json", "preprocessor_config.json"))
    names = weight_names(root / WEIGHTS_FILE)
    for name in AUDIO_WEIGHTS:
        if name not in names:
            raise CheckpointError(f"{root / WEIGHTS_FILE}: no {name} tensor")
    if not any(n.startswith(LLM_PREFIX) for n in names):
        raise CheckpointError(f"{root / WEIGHTS_FILE}: no {LLM_PREFIX}* tensors (the backbone)")
    return OmniVoiceCheckpoint(root, config, names)
