"""A Voxtral TTS checkpoint (Mistral format) read as data:

  params.json                 the Ministral backbone (dim, n_layers, heads, head_dim,
                              hidden_dim, rope_theta, norm_eps, vocab_size), and
                              multimodal.audio_model_args (codebook sizes, the acoustic
                              transformer) and multimodal.audio_tokenizer_args (the codec;
                              `voice`: the preset voices by name)
  consolidated.safetensors    backbone (layers.N.attention.wq ..., feed_forward.w1-3, norms),
                              mm_audio_embeddings.{tok_embeddings, audio_codebook_embeddings
                              .embeddings}, acoustic_transformer.*, audio_tokenizer.*
  tekken.json                 the tokenizer, with its audio section (read by mistral-common)
  voice_embedding/NAME.pt     each preset voice: [tokens, dim] rows that take the prompt's
                              [AUDIO] positions

Every field is checked with an error naming the file and the field; nothing is executed (the
voice files are loaded with torch's weights_only unpickler).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...weights.checkpoint import (
    CheckpointError, ConfigFields, read_json, require_dir, require_files)
from .acoustic import AcousticConfig
from .codec import CodecConfig

PARAMS_FILE = "params.json"
WEIGHTS_FILE = "consolidated.safetensors"
TOKENIZER_FILE = "tekken.json"
VOICE_DIR = "voice_embedding"


@dataclass(frozen=True)
class BackboneConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    norm_eps: float
    rope_theta: float
    vocab_size: int
    tied_embeddings: bool
    max_seq_len: int


@dataclass(frozen=True)
class VoxtralTTSConfig:
    backbone: BackboneConfig
    acoustic: AcousticConfig
    codec: CodecConfig
    voices: tuple[str, ...]
    audio_token_id: int
    begin_audio_token_id: int


def read_params_json(path: Path) -> VoxtralTTSConfig:
    return params_json_config(read_json(path), path)


def params_json_config(data, path: Path = Path(PARAMS_FILE)) -> VoxtralTTSConfig:
    f = ConfigFields(data, path)
    backbone = BackboneConfig(
        dim=f.int("dim", low=1), n_layers=f.int("n_layers", low=1), n_heads=f.int("n_heads", low=1),
        n_kv_heads=f.int("n_kv_heads", low=1), head_dim=f.int("head_dim", low=1),
        hidden_dim=f.int("hidden_dim", low=1), norm_eps=f.float("norm_eps", 1e-5),
        rope_theta=f.float("rope_theta", 1e6, positive=True), vocab_size=f.int("vocab_size", low=1),
        tied_embeddings=f.bool("tied_embeddings", True), max_seq_len=f.int("max_seq_len", 65536, low=1))
    if backbone.n_heads % backbone.n_kv_heads:
        f.fail("n_kv_heads", f"must divide n_heads ({backbone.n_heads})")
    multimodal = f.object("multimodal")
    model = multimodal.object("audio_model_args")
    acoustic = AcousticConfig.from_dict(model.data, model)
    if acoustic.input_dim != backbone.dim:
        model.fail("acoustic_transformer_args.input_dim", f"is {acoustic.input_dim}; the backbone's dim is {backbone.dim}")
    tokenizer = multimodal.object("audio_tokenizer_args")
    codec = CodecConfig.from_dict(tokenizer.data, tokenizer)
    if (codec.semantic_codebook_size, codec.acoustic_codebook_size, codec.acoustic_dim) != (
            acoustic.semantic_codebook_size, acoustic.acoustic_codebook_size, acoustic.n_acoustic_codebook):
        tokenizer.fail("semantic_codebook_size", "and the acoustic codebook sizes must match audio_model_args")
    voices = tokenizer.object("voice", None)
    names = tuple(voices.data) if voices is not None else ()
    if not names:
        tokenizer.fail("voice", "names no preset voice; the served model speaks only in its preset voices")
    return VoxtralTTSConfig(backbone, acoustic, codec, names,
                            audio_token_id=model.int("audio_token_id", 24, low=0),
                            begin_audio_token_id=model.int("begin_audio_token_id", 25, low=0))


@dataclass(frozen=True)
class VoxtralTTSCheckpoint:
    root: Path
    config: VoxtralTTSConfig

    def path(self, name: str) -> Path:
        return self.root / name

    def voice_path(self, voice: str) -> Path:
        return self.root / VOICE_DIR / f"{voice}.pt"

    def voice_embedding(self, voice: str):
        """The voice's [tokens, dim] rows (float32), checked."""
        import torch

        path = self.voice_path(voice)
        try:
            rows = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure is a bad file
            raise CheckpointError(f"{path}: not a readable voice embedding ({exc})") from None
        if not isinstance(rows, torch.Tensor) or rows.ndim != 2 or rows.shape[1] != self.config.backbone.dim:
            shape = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
            raise CheckpointError(f"{path}: a voice embedding is [tokens, {self.config.backbone.dim}], got {shape}")
        return rows.float()


def open_checkpoint(root: str | Path) -> VoxtralTTSCheckpoint:
    root = require_dir(root, "Voxtral TTS")
    require_files(root, (PARAMS_FILE, WEIGHTS_FILE, TOKENIZER_FILE), "Voxtral TTS")
    config = read_params_json(root / PARAMS_FILE)
    missing = [v for v in config.voices if not (root / VOICE_DIR / f"{v}.pt").is_file()]
    if missing:
        raise CheckpointError(f"{root / VOICE_DIR}: no embedding for the voice(s) {', '.join(missing)} "
                              f"that {PARAMS_FILE} names")
    return VoxtralTTSCheckpoint(root, config)
