"""A Gepard-1.0 checkpoint read as data:

  config.json          the bare Qwen3.5 text backbone (model_type qwen3_5_text: hidden_size,
                       num_hidden_layers, layer_types or full_attention_interval, the
                       linear_* Gated-DeltaNet sizes, head_dim, rope_parameters, vocab_size)
  gepard_config.json   the sidecar: audio_heads {level_audio_N: levels} (32 FSQ outputs),
                       audio_embed_dim, special_tokens (start_of_text, end_of_text,
                       start_of_speech, end_of_speech, tts_pad, tokeniser_length: the first
                       speaker slot), text_repetition (the short-text prompt layout), codec
                       (codec_id, sample_rate, frame_rate_hz, fsq_levels, num_layers),
                       voice_cloning.compressor.num_queries (the speaker slots), stop_threshold,
                       temperature
  model.safetensors    model.* (the backbone, Qwen3.5 names), lm_head, codebook_heads.0-31,
                       stop_head, audio_embeddings.0-31, audio_embed_proj, null_prefix
  tokenizer.json       the Qwen3.5 BPE (or vocab.json + merges.txt)
  <codec>.nemo         NVIDIA's NanoCodec archive, named after codec_id's last part
                       (nemo-nano-codec-22khz-1.89kbps-21.5fps.nemo), or the folder's only .nemo

Every field is checked with an error naming the file and the field; nothing is executed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...weights.checkpoint import (
    CheckpointError, ConfigFields, read_json, require_dir, require_files, require_tokenizer,
    safetensors_files)

WHAT = "Gepard-1.0"
CONFIG_FILE = "config.json"
SIDECAR_FILE = "gepard_config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
BACKBONE_MODEL_TYPE = "qwen3_5_text"
BACKBONE_PREFIX = "model."
DEFAULT_CODEC_ID = "nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps"


@dataclass(frozen=True)
class Backbone:
    """The fields of config.json this package reads itself (vLLM and transformers read the
    whole file)."""
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    tie_word_embeddings: bool
    max_position_embeddings: int


@dataclass(frozen=True)
class GepardConfig:
    backbone: Backbone
    head_levels: tuple[int, ...]        # each head's cardinality, in channel order (32)
    audio_embed_dim: int
    start_of_text: int
    end_of_text: int
    start_of_speech: int
    end_of_speech: int
    tts_pad: int
    speaker_base: int                   # speaker slot i is token speaker_base + i
    speaker_slots: int                  # null_prefix's rows
    repetition_enabled: bool
    repetition_target: int              # short texts repeat until about this many tokens
    repetition_below: int               # ... when shorter than this
    repetition_max: int
    codec_id: str
    sample_rate: int
    frame_rate_hz: float
    fsq_levels: tuple[int, ...]         # one codec group's levels
    codec_groups: int
    stop_threshold: float
    temperature: float

    @property
    def num_heads(self) -> int:
        return len(self.head_levels)

    @property
    def codec_file_name(self) -> str:
        return self.codec_id.rstrip("/").rsplit("/", 1)[-1] + ".nemo"


def parse_backbone(data, path: Path = Path(CONFIG_FILE)) -> Backbone:
    f = ConfigFields(data, path)
    f.str("model_type", choices=(BACKBONE_MODEL_TYPE,))
    layers = f.int("num_hidden_layers", low=1)
    types = data.get("layer_types")
    if types is None:
        # transformers' rule when the list is absent: every interval-th layer is full attention.
        interval = f.int("full_attention_interval", 4, low=1)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    elif (not isinstance(types, list) or len(types) != layers
          or any(t not in ("linear_attention", "full_attention") for t in types)):
        f.fail("layer_types", f"must list {layers} of 'linear_attention' / 'full_attention'")
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_num_key_heads", "linear_num_value_heads"):
        f.int(name, low=1)
    return Backbone(vocab_size=f.int("vocab_size", low=2), hidden_size=f.int("hidden_size", low=1),
                    num_hidden_layers=layers, layer_types=tuple(types),
                    tie_word_embeddings=f.bool("tie_word_embeddings", False),
                    max_position_embeddings=f.int("max_position_embeddings", 32768, low=16))


def parse_sidecar(data, backbone: Backbone, path: Path = Path(SIDECAR_FILE)) -> GepardConfig:
    f = ConfigFields(data, path)
    heads = f.object("audio_heads")
    try:
        names = sorted(heads.data, key=lambda k: int(str(k).rsplit("_", 1)[-1]))
    except ValueError:
        heads.fail("", "keys must end in the head's number (level_audio_0, level_audio_1, ...)")
    levels = tuple(heads.int(k, low=2) for k in names)
    codec = f.object("codec", {})
    fsq = codec.ints("fsq_levels", (8, 7, 6, 6))
    groups = codec.int("num_layers", 8, low=1)
    if levels != tuple(fsq) * groups:
        f.fail("audio_heads", f"are {list(levels)}; the codec's fsq_levels {list(fsq)} x num_layers {groups} "
                              "must be the same channels (the heads emit the codec's per-dimension codes)")
    special = f.object("special_tokens", {})
    tokens = {name: special.int(name, default, low=0) for name, default in (
        ("start_of_text", 248073), ("end_of_text", 248074), ("start_of_speech", 248070),
        ("end_of_speech", 248071), ("tts_pad", 248076), ("tokeniser_length", 248077))}
    rep = f.object("text_repetition", {})
    cloning = f.object("voice_cloning", {})
    compressor = cloning.object("compressor", {})
    config = GepardConfig(
        backbone=backbone, head_levels=levels, audio_embed_dim=f.int("audio_embed_dim", 32, low=1),
        start_of_text=tokens["start_of_text"], end_of_text=tokens["end_of_text"],
        start_of_speech=tokens["start_of_speech"], end_of_speech=tokens["end_of_speech"],
        tts_pad=tokens["tts_pad"], speaker_base=tokens["tokeniser_length"],
        speaker_slots=compressor.int("num_queries", 8, low=0),
        repetition_enabled=rep.bool("enabled", True), repetition_target=rep.int("target_text_tokens", 16, low=1),
        repetition_below=rep.int("apply_below", 13, low=0), repetition_max=rep.int("max_repeats", 8, low=1),
        codec_id=codec.str("codec_id", DEFAULT_CODEC_ID), sample_rate=codec.int("sample_rate", 22050, low=1),
        frame_rate_hz=codec.float("frame_rate_hz", 21.5, positive=True), fsq_levels=tuple(fsq),
        codec_groups=groups, stop_threshold=f.float("stop_threshold", 0.5),
        temperature=f.float("temperature", 0.3, positive=True))
    vocab = backbone.vocab_size
    for name, token in tokens.items():
        if token >= vocab:
            special.fail(name, f"is {token}, outside config.json's vocab_size ({vocab})")
    if config.speaker_base + config.speaker_slots > vocab:
        special.fail("tokeniser_length", f"+ {config.speaker_slots} speaker slots exceeds vocab_size ({vocab})")
    if not 0.0 < config.stop_threshold < 1.0:
        f.fail("stop_threshold", f"must be a probability in (0, 1), got {config.stop_threshold}")
    return config


@dataclass(frozen=True)
class GepardCheckpoint:
    root: Path
    config: GepardConfig
    backbone_dict: dict             # config.json as read (vLLM / transformers take it whole)
    weight_files: tuple[Path, ...]
    codec_file: Path

    def path(self, name: str) -> Path:
        return self.root / name


def find_codec(root: Path, config: GepardConfig) -> Path:
    named = root / config.codec_file_name
    if named.is_file():
        return named
    found = sorted(root.glob("*.nemo"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise CheckpointError(f"{named}: missing from the {WHAT} checkpoint (the NanoCodec archive of "
                              f"{config.codec_id}: put its .nemo file beside {WEIGHTS_FILE})")
    raise CheckpointError(f"{root}: several .nemo files and none named {config.codec_file_name}")


def open_checkpoint(root: str | Path) -> GepardCheckpoint:
    root = require_dir(root, WHAT)
    require_files(root, (CONFIG_FILE, SIDECAR_FILE), WHAT)
    require_tokenizer(root)
    backbone_dict = read_json(root / CONFIG_FILE)
    backbone = parse_backbone(backbone_dict, root / CONFIG_FILE)
    config = parse_sidecar(read_json(root / SIDECAR_FILE), backbone, root / SIDECAR_FILE)
    files = safetensors_files(root, WHAT, WEIGHTS_FILE, WEIGHTS_INDEX_FILE)
    return GepardCheckpoint(root, config, backbone_dict, files, find_codec(root, config))
