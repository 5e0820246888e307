"""The higgs-audio v2 checkpoint layout (transformers' `higgs_audio_v2`, as
bosonai/higgs-audio-v2-generation-3B-base is published for transformers >= 5.16), opened
from a path (nothing is downloaded):

  <root>/config.json              model_type higgs_audio_v2: the Llama-3.2-3B fields
                                  (hidden_size, num_hidden_layers, ..., rope_parameters with
                                  llama3 scaling), num_codebooks (8), codebook_size (1026:
                                  1024 codes + the stream bos 1024 and eos 1025), the audio
                                  token ids (audio_token_id 128016, audio_bos_token_id
                                  128013, audio_delay_token_id 128014), eos_token_id 128009
  <root>/generation_config.json   sampling defaults (do_sample, temperature, top_k, top_p)
                                  and repetition-aware sampling (ras_win_len,
                                  ras_win_max_num_repeat); optional
  <root>/model.safetensors        (or model.safetensors.index.json + its shards)
                                  model.embed_tokens, model.layers.N.{self_attn, mlp,
                                  input_layernorm, post_attention_layernorm, audio_mlp,
                                  audio_input_layernorm, audio_post_attention_layernorm},
                                  model.norm, model.embed_audio_tokens.embed_audio_tokens
                                  [8 * 1026, H], audio_lm_head [8 * 1026, H], and
                                  text_lm_head (training only, not read)
  <root>/tokenizer.json, tokenizer_config.json
                                  the Llama 3 tokenizer with higgs' audio tokens
                                  (<|audio_out_bos|>, <|AUDIO_OUT|>, <|audio_eos|>, ...)
  <root>/audio_tokenizer/         the higgs-audio v2 codec (tritontts/nn/higgs_codec/): the
                                  transformers higgs_audio_v2_tokenizer layout, or boson-ai's
                                  standalone one (config.json + model.pth)

The original boson-ai tensor names (layers.N..., audio_codebook_embeddings,
audio_decoder_proj.audio_lm_head) are accepted too: `canonical_name` maps them onto the
names above (the same mapping transformers' conversion applies). config.json is read as
data; every missing or malformed file or field is a CheckpointError naming it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ...weights.checkpoint import (
    CheckpointError, ConfigFields, read_json, require_dir, require_files, safetensors_files,
    require_json_objects, weight_names)

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CODEC_DIR = "audio_tokenizer"
REQUIRED_FILES = (CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, f"{CODEC_DIR}/config.json")
# The codec's weights: the transformers layout's model.safetensors, or boson-ai's own
# single-file layout (model.pth; tritontts/nn/higgs_codec/ reads both).
CODEC_WEIGHTS = ("model.safetensors", "model.pth")
MODEL_TYPE = "higgs_audio_v2"
DTYPES = ("float32", "bfloat16", "float16")
WHAT = "higgs-audio v2"

# Tokens the prompt is built from, by their text (the tokenizer gives their ids).
BEGIN_OF_TEXT = "<|begin_of_text|>"
START_HEADER, END_HEADER, END_OF_TURN = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
AUDIO_OUT_BOS, AUDIO_OUT, AUDIO_EOS = "<|audio_out_bos|>", "<|AUDIO_OUT|>", "<|audio_eos|>"
AUDIO_DELAY = "<|reserved_special_token_6|>"
PROMPT_TOKENS = (BEGIN_OF_TEXT, START_HEADER, END_HEADER, END_OF_TURN, AUDIO_OUT_BOS, AUDIO_OUT,
                 AUDIO_EOS, AUDIO_DELAY)

# Original boson-ai names -> transformers' names (applied in order).
_ORIGINAL_NAMES = ((re.compile(r"^audio_codebook_embeddings\."), "model.embed_audio_tokens.embed_audio_tokens."),
                   (re.compile(r"^(embed_tokens|layers|norm)\b"), r"model.\1"),
                   (re.compile(r"^audio_decoder_proj\."), ""))
LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                 "mlp.down_proj.weight", "audio_mlp.gate_proj.weight", "audio_mlp.up_proj.weight",
                 "audio_mlp.down_proj.weight", "input_layernorm.weight",
                 "post_attention_layernorm.weight", "audio_input_layernorm.weight",
                 "audio_post_attention_layernorm.weight")
AUDIO_EMBEDDINGS = "model.embed_audio_tokens.embed_audio_tokens.weight"
AUDIO_HEAD = "audio_lm_head.weight"


def canonical_name(name: str) -> str:
    """A tensor's name in transformers' layout, whichever of the two layouts it comes from."""
    if name.startswith(("model.", "audio_lm_head", "text_lm_head")):
        return name
    for pattern, replacement in _ORIGINAL_NAMES:
        name = pattern.sub(replacement, name)
    return name


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent RoPE scaling (rope_type llama3), or none (default)."""
    rope_type: str
    rope_theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 1.0
    original_max_position_embeddings: int = 0

    def as_config(self) -> dict:
        if self.rope_type == "default":
            return {"rope_type": "default", "rope_theta": self.rope_theta}
        return {"rope_type": "llama3", "rope_theta": self.rope_theta, "factor": self.factor,
                "low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}


# HiggsAudioV2Config's default (transformers 5.19), applied when config.json has none.
DEFAULT_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                "low_freq_factor": 0.125, "high_freq_factor": 0.5,
                "original_max_position_embeddings": 1024}


@dataclass(frozen=True)
class HiggsAudioV2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeScaling
    attention_bias: bool
    mlp_bias: bool
    num_codebooks: int
    codebook_size: int               # entries per codebook, the stream bos and eos included
    audio_token_id: int
    audio_bos_token_id: int
    audio_delay_token_id: int
    audio_stream_bos_id: int
    audio_stream_eos_id: int
    eos_token_id: int
    dtype: str = "float32"           # the weights' dtype (config.json's dtype / torch_dtype)

    @property
    def codes(self) -> int:
        """Codec codes per codebook (the codebook entries below the stream bos)."""
        return self.audio_stream_bos_id


def _rope(fields: ConfigFields) -> RopeScaling:
    params = fields.object("rope_parameters", None)
    if params is None:
        params = ConfigFields(DEFAULT_ROPE, fields.path, "rope_parameters (default).")
    kind = params.str("rope_type", "default", choices=("default", "llama3"))
    theta = params.float("rope_theta", 500000.0, positive=True)
    if kind == "default":
        return RopeScaling("default", theta)
    return RopeScaling("llama3", theta, factor=params.float("factor", positive=True),
                       low_freq_factor=params.float("low_freq_factor", positive=True),
                       high_freq_factor=params.float("high_freq_factor", positive=True),
                       original_max_position_embeddings=params.int("original_max_position_embeddings", low=1))


def parse_config(data, path: Path) -> HiggsAudioV2Config:
    f = ConfigFields(data, path)
    model_type = f.str("model_type")
    if model_type != MODEL_TYPE:
        hint = (" (the original boson-ai config; this loader reads the transformers layout, "
                "converted by transformers' convert_higgs_audio_v2_to_hf)") if model_type == "higgs_audio" else ""
        f.fail("model_type", f"is {model_type!r}; a higgs-audio v2 checkpoint says {MODEL_TYPE!r}{hint}")
    act = f.str("hidden_act", "silu")
    if act != "silu":
        f.fail("hidden_act", f"is {act!r}; the Llama MLP here is SiLU-gated")
    hidden = f.int("hidden_size", 3072, low=1)
    heads = f.int("num_attention_heads", 24, low=1)
    kv_heads = f.int("num_key_value_heads", 8, low=1)
    if heads % kv_heads:
        f.fail("num_key_value_heads", f"({kv_heads}) must divide num_attention_heads ({heads})")
    eos = f.data.get("eos_token_id", 128009)
    if isinstance(eos, list) and eos and all(isinstance(e, int) for e in eos):
        eos = eos[0]
    if isinstance(eos, bool) or not isinstance(eos, int):
        f.fail("eos_token_id", f"must be an integer (or a list of them), got {eos!r}")
    cfg = HiggsAudioV2Config(
        vocab_size=f.int("vocab_size", 128256, low=1), hidden_size=hidden,
        intermediate_size=f.int("intermediate_size", 8192, low=1),
        num_hidden_layers=f.int("num_hidden_layers", 28, low=1), num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=f.int("head_dim", hidden // heads, low=2),
        rms_norm_eps=f.float("rms_norm_eps", 1e-5, positive=True),
        max_position_embeddings=f.int("max_position_embeddings", 2048, low=16), rope=_rope(f),
        attention_bias=f.bool("attention_bias", False), mlp_bias=f.bool("mlp_bias", False),
        num_codebooks=f.int("num_codebooks", 8, low=1), codebook_size=f.int("codebook_size", 1024, low=3),
        audio_token_id=f.int("audio_token_id", 128016, low=0),
        audio_bos_token_id=f.int("audio_bos_token_id", 128013, low=0),
        audio_delay_token_id=f.int("audio_delay_token_id", 128014, low=0),
        audio_stream_bos_id=f.int("audio_stream_bos_id", 1024, low=1),
        audio_stream_eos_id=f.int("audio_stream_eos_id", 1025, low=1), eos_token_id=eos,
        dtype=f.str("dtype", None, choices=DTYPES) or f.str("torch_dtype", "float32", choices=DTYPES))
    for name in ("audio_stream_bos_id", "audio_stream_eos_id"):
        if getattr(cfg, name) >= cfg.codebook_size:
            f.fail("codebook_size", f"({cfg.codebook_size}) must hold {name} ({getattr(cfg, name)}): "
                   "the released checkpoint has 1026 (1024 codes, stream bos, stream eos)")
    for name in ("audio_token_id", "audio_bos_token_id", "audio_delay_token_id", "eos_token_id"):
        if getattr(cfg, name) >= cfg.vocab_size:
            f.fail(name, f"({getattr(cfg, name)}) must be below vocab_size ({cfg.vocab_size})")
    return cfg


@dataclass(frozen=True)
class GenerationSettings:
    """generation_config.json. The converted release's file holds only the token ids and
    repetition-aware sampling (ras_win_len 7, ras_win_max_num_repeat 2); for what it omits
    the defaults are boson-ai's serving defaults (sampling at temperature 1.0, top_k 50,
    top_p 0.95; vLLM-Omni keeps them too), not transformers' generate() default of greedy
    decoding, under which the audio codebooks collapse into repeats."""
    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.95
    ras_win_len: int | None = 7             # repetition-aware sampling: window (frames)
    ras_win_max_num_repeat: int = 2         # and the repeats that trigger a resample
    max_new_tokens: int | None = None


def parse_generation(data, path: Path) -> GenerationSettings:
    f = ConfigFields(data, path)
    d = GenerationSettings()
    return GenerationSettings(
        do_sample=f.bool("do_sample", d.do_sample),
        temperature=f.float("temperature", d.temperature, positive=True),
        top_k=f.int("top_k", d.top_k, low=0), top_p=f.float("top_p", d.top_p, positive=True),
        ras_win_len=f.int("ras_win_len", d.ras_win_len, low=1),
        ras_win_max_num_repeat=f.int("ras_win_max_num_repeat", d.ras_win_max_num_repeat, low=1),
        max_new_tokens=f.int("max_new_tokens", None, low=1))


@dataclass(frozen=True)
class HiggsAudioV2Checkpoint:
    root: Path
    config: HiggsAudioV2Config
    generation: GenerationSettings
    weight_files: tuple[Path, ...]
    weight_names: frozenset[str]        # canonical names

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def codec_dir(self) -> Path:
        return self.root / CODEC_DIR


def required_weights(cfg: HiggsAudioV2Config) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight", AUDIO_EMBEDDINGS, AUDIO_HEAD]
    names += [f"model.layers.{i}.{t}" for i in range(cfg.num_hidden_layers) for t in LAYER_TENSORS]
    return names


def open_checkpoint(root: str | Path) -> HiggsAudioV2Checkpoint:
    root = require_dir(root, WHAT)
    require_files(root, REQUIRED_FILES, WHAT)
    config = parse_config(read_json(root / CONFIG_FILE), root / CONFIG_FILE)
    generation = (parse_generation(read_json(root / GENERATION_FILE), root / GENERATION_FILE)
                  if (root / GENERATION_FILE).exists() else GenerationSettings())
    require_json_objects(root, (TOKENIZER_CONFIG_FILE,))
    require_json_objects(root / CODEC_DIR, ("config.json",))
    if not any((root / CODEC_DIR / name).is_file() for name in CODEC_WEIGHTS):
        raise CheckpointError(f"{root / CODEC_DIR}: no codec weights ({' or '.join(CODEC_WEIGHTS)})")
    files = safetensors_files(root, WHAT, WEIGHTS_FILE, WEIGHTS_INDEX_FILE)
    names = frozenset(canonical_name(n) for path in files for n in weight_names(path))
    missing = [n for n in required_weights(config) if n not in names]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"{files[0] if len(files) == 1 else root / WEIGHTS_INDEX_FILE}: no "
                              f"{', '.join(missing[:3])}{more} tensor")
    return HiggsAudioV2Checkpoint(root, config, generation, files, names)
