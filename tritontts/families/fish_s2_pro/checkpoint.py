"""A Fish Speech S2 Pro checkpoint read as data:

  config.json                 model_type fish_qwen3_omni: text_config (the slow AR, Qwen3-4B
                              shape: dim, n_layer, n_head, n_local_heads, head_dim,
                              intermediate_size, rope_base, norm_eps, attention_qk_norm,
                              vocab_size, tie_word_embeddings), audio_decoder_config (the fast
                              AR: the same fields, vocab_size = codebook size, num_codebooks,
                              text_dim), semantic_start_token_id / semantic_end_token_id (the
                              main tokens that stand for semantic codes), eos_token_id
                              (<|im_end|>), pad_token_id, audio_pad_token_id
  model.safetensors           (or model.safetensors.index.json + shards) text_model.model.*
                              (embeddings, layers.N.attention.{wqkv, wo, q_norm, k_norm},
                              feed_forward.w1-3, attention_norm, ffn_norm, norm) and
                              audio_decoder.* (codebook_embeddings: the slow AR's input side;
                              embeddings, layers.N.*, norm, output: the fast AR)
  tokenizer.json              the Qwen BPE with Fish's special tokens (<|im_start|>, <|voice|>,
                              <|semantic:N|>, <|speaker:N|>, ...)
  codec.pth                   the DAC codec's weights (a torch pickle, sometimes nested under
                              "generator"; loaded with torch's weights_only unpickler)
  codec_config.json           optional, not in the release: the codec's sizes when they are not
                              the released ones (our random test checkpoints); the released
                              codec's sizes are fixed (tritontts.families.fish_s2_pro.codec)

Every field is checked with an error naming the file and the field; nothing is executed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...weights.checkpoint import (
    CheckpointError, ConfigFields, read_json, require_dir, require_files, safetensors_files)

WHAT = "Fish Speech S2 Pro"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
CODEC_FILE = "codec.pth"
CODEC_CONFIG_FILE = "codec_config.json"
SLOW_PREFIX = "text_model.model."
FAST_PREFIX = "audio_decoder."


@dataclass(frozen=True)
class TransformerConfig:
    """One of the two transformers (text_config: the slow AR; audio_decoder_config: the fast)."""
    vocab_size: int
    dim: int
    n_layer: int
    n_head: int
    n_local_heads: int          # key / value heads
    head_dim: int
    intermediate_size: int
    rope_base: float
    norm_eps: float
    qk_norm: bool
    max_seq_len: int

    @classmethod
    def read(cls, f: ConfigFields) -> "TransformerConfig":
        n_head = f.int("n_head", low=1)
        local = f.int("n_local_heads", -1)
        dim = f.int("dim", low=1)
        config = cls(vocab_size=f.int("vocab_size", low=2), dim=dim, n_layer=f.int("n_layer", low=1), n_head=n_head,
                     n_local_heads=n_head if local in (-1, 0) else local,
                     head_dim=f.int("head_dim", dim // n_head, low=2),
                     intermediate_size=f.int("intermediate_size", low=1),
                     rope_base=f.float("rope_base", 1e6, positive=True), norm_eps=f.float("norm_eps", 1e-6, positive=True),
                     qk_norm=f.bool("attention_qk_norm", False), max_seq_len=f.int("max_seq_len", 32768, low=1))
        if config.n_local_heads < 1 or n_head % config.n_local_heads:
            f.fail("n_local_heads", f"must divide n_head ({n_head})")
        if config.head_dim % 2:
            f.fail("head_dim", "must be even (RoPE rotates pairs)")
        for name in ("attention_qkv_bias", "attention_o_bias", "use_moe"):
            if f.bool(name, False):
                f.fail(name, "is true: the released S2 Pro has none; this variant is not supported")
        return config


@dataclass(frozen=True)
class FishConfig:
    slow: TransformerConfig
    fast: TransformerConfig
    num_codebooks: int          # codes per frame: the semantic one + the residual ones
    semantic_begin_id: int      # <|semantic:0|>
    semantic_end_id: int        # <|semantic:N-1|>
    im_end_id: int              # the end of the assistant's turn: the stream's end
    pad_id: int
    audio_pad_id: int
    tie_word_embeddings: bool

    @property
    def codebook_size(self) -> int:
        """Rows per codebook in the input tables (the fast AR's vocabulary)."""
        return self.fast.vocab_size

    def is_semantic(self, token: int) -> bool:
        return self.semantic_begin_id <= token <= self.semantic_end_id


def parse_config(path: Path) -> FishConfig:
    return parse_config_dict(read_json(path), path)


def parse_config_dict(data, path: Path = Path(CONFIG_FILE)) -> FishConfig:
    f = ConfigFields(data, path)
    f.str("model_type", choices=("fish_qwen3_omni",))
    text, audio = f.object("text_config"), f.object("audio_decoder_config")
    slow, fast = TransformerConfig.read(text), TransformerConfig.read(audio)
    if audio.int("text_dim", slow.dim) != slow.dim or fast.dim != slow.dim:
        # Upstream projects the slow hidden state in when the widths differ; S2 Pro's are equal.
        audio.fail("dim", f"and text_dim must equal text_config.dim ({slow.dim}) (no input projection is built)")
    config = FishConfig(
        slow=slow, fast=fast, num_codebooks=audio.int("num_codebooks", low=2),
        semantic_begin_id=f.int("semantic_start_token_id", low=0), semantic_end_id=f.int("semantic_end_token_id", low=0),
        im_end_id=f.int("eos_token_id", low=0), pad_id=f.int("pad_token_id", low=0),
        audio_pad_id=f.int("audio_pad_token_id", low=0), tie_word_embeddings=text.bool("tie_word_embeddings", True))
    if config.semantic_end_id - config.semantic_begin_id + 1 != fast.vocab_size:
        f.fail("semantic_end_token_id", f"- semantic_start_token_id + 1 must equal the codebook size "
                                        f"(audio_decoder_config.vocab_size, {fast.vocab_size})")
    for name, token in (("semantic_end_token_id", config.semantic_end_id), ("eos_token_id", config.im_end_id)):
        if token >= slow.vocab_size:
            f.fail(name, f"is {token}, outside text_config.vocab_size ({slow.vocab_size})")
    if config.is_semantic(config.im_end_id):
        f.fail("eos_token_id", "is inside the semantic range")
    return config


@dataclass(frozen=True)
class FishCheckpoint:
    root: Path
    config: FishConfig
    weight_files: tuple[Path, ...]

    def path(self, name: str) -> Path:
        return self.root / name

    def codec_config(self):
        """The codec's sizes: released, or codec_config.json's when it is there."""
        from .codec import FishCodecConfig

        path = self.root / CODEC_CONFIG_FILE
        if not path.is_file():
            return FishCodecConfig()
        return FishCodecConfig.from_dict(read_json(path), ConfigFields(read_json(path), path))


def open_checkpoint(root: str | Path) -> FishCheckpoint:
    root = require_dir(root, WHAT)
    require_files(root, (CONFIG_FILE, TOKENIZER_FILE, CODEC_FILE), WHAT)
    config = parse_config(root / CONFIG_FILE)
    files = safetensors_files(root, WHAT, WEIGHTS_FILE, WEIGHTS_INDEX_FILE)
    if not files:
        raise CheckpointError(f"{root}: no weights")
    return FishCheckpoint(root, config, files)
