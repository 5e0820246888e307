"""The released Qwen3-TTS 12 Hz checkpoint layout, opened from a path (nothing is downloaded).

One layout for all five releases, Qwen3-TTS-12Hz-{0.6B,1.7B}-{CustomVoice,VoiceDesign,Base}:

  <root>/config.json              model_type qwen3_tts; talker_config (with
                                  code_predictor_config), speaker_encoder_config,
                                  tts_model_type custom_voice|voice_design|base,
                                  tts_model_size 0b6|1b7, special text token ids
  <root>/generation_config.json   sampling defaults (do_sample, top_k, ..., max_new_tokens)
  <root>/model.safetensors        talker.* (and speaker_encoder.* in Base)
  <root>/vocab.json, merges.txt   Qwen2 byte-level BPE (and/or tokenizer.json)
  <root>/tokenizer_config.json    added special tokens (<|im_start|>, <tts_pad>, ...)
  <root>/speech_tokenizer/        config.json (encoder_config, decoder_config),
                                  model.safetensors (encoder.*, decoder.*),
                                  preprocessor_config.json

config.json is read as data into frozen dataclasses: a field the model cannot do without is
required (the reference's own defaults for codec ids are not the released ones, so a missing
one is an error rather than a silent default); optional fields take the reference's defaults.
Every missing or malformed file or field is a CheckpointError that names it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ...weights.checkpoint import REQUIRED as _REQUIRED
from ...weights.checkpoint import CheckpointError
from ...weights.checkpoint import ConfigFields as _Fields
from ...weights.checkpoint import read_json as _read_json
from ...weights.checkpoint import (
    read_tensors, require_dir, require_files, require_json_objects, require_tokenizer)
from ...weights.checkpoint import weight_names as _weight_names
from ...nn.qwen3_shape import Qwen3Shape

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPEECH_TOKENIZER_DIR = "speech_tokenizer"
REQUIRED_FILES = (CONFIG_FILE, GENERATION_FILE, WEIGHTS_FILE, TOKENIZER_CONFIG_FILE,
                  f"{SPEECH_TOKENIZER_DIR}/config.json", f"{SPEECH_TOKENIZER_DIR}/model.safetensors",
                  f"{SPEECH_TOKENIZER_DIR}/preprocessor_config.json")
TALKER_PREFIX = "talker."
SPEAKER_ENCODER_PREFIX = "speaker_encoder."

# tts_model_type -> the task name requests use (vLLM-Omni's task_type values).
KINDS = ("custom_voice", "voice_design", "base")
TASK_OF_KIND = MappingProxyType({"custom_voice": "CustomVoice", "voice_design": "VoiceDesign",
                                 "base": "Base"})
KIND_OF_TASK = MappingProxyType({task: kind for kind, task in TASK_OF_KIND.items()})
# Only the 12 Hz tokenizer (16 codebooks, code predictor) is built here; the 25 Hz one
# (Qwen3-TTS-Tokenizer-25Hz, a single codebook) has another decoder altogether.
TOKENIZER_TYPE = "qwen3_tts_tokenizer_12hz"
AUTO_LANGUAGE = "auto"

# --- config.json ----------------------------------------------------------------------------

@dataclass(frozen=True)
class DecoderShape(Qwen3Shape):
    """What one Qwen3 decoder stack of the talker is built from (talker.py builds both)."""
    num_code_groups: int            # codebooks per frame (16)


@dataclass(frozen=True)
class CodePredictorConfig(DecoderShape):
    """talker_config.code_predictor_config: the 5-layer transformer that predicts codebooks
    1..15 of a frame from the talker's hidden state and codebook 0 (vocab_size: entries per
    codebook, 2048)."""


@dataclass(frozen=True)
class TalkerConfig(DecoderShape):
    """talker_config: the Qwen3 decoder that emits codebook 0 of each 12.5 Hz frame
    (vocab_size: the codec vocabulary, 3072: codes, control tokens, languages, speakers)."""
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    text_vocab_size: int
    text_hidden_size: int
    codec_eos_token_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_pad_id: int
    codec_bos_id: int
    spk_id: Mapping[str, int]                   # speaker name (as the file spells it) -> codec id
    spk_is_dialect: Mapping[str, str | None]    # speaker -> dialect language, None if not
    codec_language_id: Mapping[str, int]        # language (dialects included) -> codec id
    code_predictor: CodePredictorConfig


@dataclass(frozen=True)
class Qwen3TTSConfig:
    kind: str                       # tts_model_type: custom_voice | voice_design | base
    model_size: str | None          # tts_model_size: 0b6 | 1b7
    talker: TalkerConfig
    speaker_encoder: Mapping[str, Any]   # speaker_encoder_config as written (speaker_encoder.py reads it)
    speaker_embedding_dim: int      # speaker_encoder_config.enc_dim: the x-vector's size
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int

    @property
    def task(self) -> str:
        return TASK_OF_KIND[self.kind]


@dataclass(frozen=True)
class GenerationDefaults:
    """generation_config.json; absent keys take the reference wrapper's hard defaults
    (qwen_tts Qwen3TTSModel._merge_generate_kwargs)."""
    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9
    max_new_tokens: int = 2048


def _rope(fields: _Fields) -> _Fields | None:
    """rope_scaling as 4.x wrote it, or rope_parameters as transformers 5 writes it."""
    name = "rope_scaling" if fields.has("rope_scaling") else "rope_parameters"
    rope = fields.object(name, None)
    if rope is not None:
        kind = rope.str("rope_type", None) or rope.str("type", "default")
        if kind != "default":
            # Scaled variants (yarn, dynamic, ...) change the frequencies; none is released.
            rope.fail("rope_type", f"is {kind!r}; only plain RoPE ('default') is implemented")
    return rope


def _shape(fields: _Fields, head_dim_default: int | None) -> tuple[dict, _Fields | None]:
    """The DecoderShape fields of one config block, and its RoPE block. `head_dim_default`:
    the reference talker reads head_dim if stated, else hidden / heads; its predictor
    defaults to 128 (None: hidden / heads)."""
    hidden = fields.int("hidden_size", low=1)
    heads = fields.int("num_attention_heads", low=1)
    kv_heads = fields.int("num_key_value_heads", low=1)
    head_dim = fields.int("head_dim", head_dim_default or hidden // heads, low=2)
    if heads % kv_heads:
        fields.fail("num_attention_heads", f"{heads} is not a multiple of num_key_value_heads {kv_heads}")
    if head_dim % 2:
        fields.fail("head_dim", f"{head_dim} must be even for RoPE")
    if fields.bool("use_sliding_window", False):
        fields.fail("use_sliding_window", "is true; the released talkers attend to the whole sequence "
                                          "and sliding windows are not implemented")
    act = fields.str("hidden_act", "silu")
    if act != "silu":
        fields.fail("hidden_act", f"is {act!r}; the Qwen3 MLP here is SwiGLU (silu)")
    rope = _rope(fields)
    theta = rope.float("rope_theta", None, positive=True) if rope is not None else None
    return dict(
        vocab_size=fields.int("vocab_size", low=2), hidden_size=hidden,
        intermediate_size=fields.int("intermediate_size", low=1),
        num_hidden_layers=fields.int("num_hidden_layers", low=1),
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        rms_norm_eps=fields.float("rms_norm_eps", 1e-6, positive=True),
        rope_theta=theta or fields.float("rope_theta", 10000.0, positive=True),
        attention_bias=fields.bool("attention_bias", False),
        max_position_embeddings=fields.int("max_position_embeddings", 32768, low=1),
        num_code_groups=fields.int("num_code_groups", low=2)), rope


def _id_map(fields: _Fields, name: str, vocab: int, default=_REQUIRED) -> dict[str, int]:
    """spk_id / codec_language_id: name -> codec id. The released spk_id values are either
    an id or a one-element list of it (the reference embeds torch.tensor(value) and reshapes
    it to one row, so a longer list cannot work)."""
    table = fields.object(name, default)
    if table is None:
        return {}
    out: dict[str, int] = {}
    for key, value in table.data.items():
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
            table.fail(key, f"must be a codec id in [0, {vocab}), got {value!r}")
        out[key] = value
    lowered = [key.lower() for key in out]
    if len(set(lowered)) != len(lowered):
        fields.fail(name, "has names that differ only in case; names are matched case-insensitively")
    return out


def _talker(fields: _Fields) -> TalkerConfig:
    shape, rope = _shape(fields, None)
    vocab, head_dim = shape["vocab_size"], shape["head_dim"]
    if rope is None:
        fields.fail("rope_scaling", "is missing (the talker's attention reads mrope_section from it)")
    section = rope.ints("mrope_section")
    if sum(section) != head_dim // 2 or any(s < 0 for s in section):
        # The reference splits the head's rotary half into these sections; any other total
        # makes its cos/sin the wrong width.
        rope.fail("mrope_section", f"{list(section)} must be non-negative and add up to head_dim / 2 = {head_dim // 2}")
    codec_ids = {name: fields.int(name, low=0) for name in (
        "codec_eos_token_id", "codec_think_id", "codec_nothink_id", "codec_think_bos_id",
        "codec_think_eos_id", "codec_pad_id", "codec_bos_id")}
    for name, value in codec_ids.items():
        if value >= vocab:
            fields.fail(name, f"{value} is outside the codec vocabulary of {vocab}")
    spk_id = _id_map(fields, "spk_id", vocab)
    languages = _id_map(fields, "codec_language_id", vocab)
    dialects: dict[str, str | None] = {}
    table = fields.object("spk_is_dialect", {})
    for speaker, dialect in table.data.items():
        if dialect is False or dialect is None:
            dialects[speaker] = None
        elif isinstance(dialect, str) and dialect.lower() in {k.lower() for k in languages}:
            dialects[speaker] = dialect.lower()
        else:
            table.fail(speaker, f"must be false or a codec_language_id name, got {dialect!r}")
    # The reference's predictor defaults head_dim to 128, not hidden / heads.
    predictor = CodePredictorConfig(**_shape(fields.object("code_predictor_config"), 128)[0])
    if shape["num_code_groups"] != predictor.num_code_groups:
        fields.fail("num_code_groups", f"{shape['num_code_groups']} != code_predictor_config."
                                       f"num_code_groups {predictor.num_code_groups}")
    if predictor.vocab_size > vocab:
        fields.fail("vocab_size", f"{vocab} is smaller than the codebook size {predictor.vocab_size}")
    return TalkerConfig(
        **shape, mrope_section=section, mrope_interleaved=rope.bool("interleaved", False),
        text_vocab_size=fields.int("text_vocab_size", low=1),
        text_hidden_size=fields.int("text_hidden_size", low=1),
        **codec_ids,
        spk_id=MappingProxyType(spk_id), spk_is_dialect=MappingProxyType(dialects),
        codec_language_id=MappingProxyType(languages), code_predictor=predictor)


def parse_config(data: Any, path: Path) -> Qwen3TTSConfig:
    """config.json as data -> Qwen3TTSConfig (CheckpointError naming the field otherwise)."""
    fields = _Fields(data, path)
    fields.str("model_type", choices=("qwen3_tts",))
    fields.str("tokenizer_type", TOKENIZER_TYPE, choices=(TOKENIZER_TYPE,))
    kind = fields.str("tts_model_type", choices=KINDS)
    talker = _talker(fields.object("talker_config"))
    speaker = fields.object("speaker_encoder_config", {})
    # The reference's speaker encoder defaults to a 1024-d x-vector.
    enc_dim = speaker.int("enc_dim", 1024, low=1)
    if kind == "base" and enc_dim != talker.hidden_size:
        # The x-vector takes one row of the talker's prompt, so it must be that wide.
        speaker.fail("enc_dim", f"{enc_dim} != talker_config.hidden_size {talker.hidden_size}")
    special = {}
    # The reference's defaults are the released Qwen2 vocabulary's ids.
    for name, default in (("im_start_token_id", 151644), ("im_end_token_id", 151645),
                          ("tts_pad_token_id", 151671), ("tts_bos_token_id", 151672),
                          ("tts_eos_token_id", 151673)):
        special[name] = fields.int(name, default, low=0)
        if special[name] >= talker.text_vocab_size:
            fields.fail(name, f"{special[name]} is outside talker_config.text_vocab_size "
                              f"{talker.text_vocab_size}")
    return Qwen3TTSConfig(kind=kind, model_size=fields.str("tts_model_size", None), talker=talker,
                          speaker_encoder=MappingProxyType(dict(speaker.data)),
                          speaker_embedding_dim=enc_dim, **special)


def parse_generation_config(data: Any, path: Path) -> GenerationDefaults:
    fields = _Fields(data, path)
    d = GenerationDefaults()
    top_p = fields.float("top_p", d.top_p, positive=True)
    sub_top_p = fields.float("subtalker_top_p", d.subtalker_top_p, positive=True)
    for name, value in (("top_p", top_p), ("subtalker_top_p", sub_top_p)):
        if value > 1:
            fields.fail(name, f"must be in (0, 1], got {value}")
    return GenerationDefaults(
        do_sample=fields.bool("do_sample", d.do_sample),
        top_k=fields.int("top_k", d.top_k, low=0), top_p=top_p,
        temperature=fields.float("temperature", d.temperature, positive=True),
        repetition_penalty=fields.float("repetition_penalty", d.repetition_penalty, positive=True),
        subtalker_dosample=fields.bool("subtalker_dosample", d.subtalker_dosample),
        subtalker_top_k=fields.int("subtalker_top_k", d.subtalker_top_k, low=0),
        subtalker_top_p=sub_top_p,
        subtalker_temperature=fields.float("subtalker_temperature", d.subtalker_temperature,
                                           positive=True),
        max_new_tokens=fields.int("max_new_tokens", d.max_new_tokens, low=1))


# --- the checkpoint -------------------------------------------------------------------------

@dataclass(frozen=True)
class Qwen3TTSCheckpoint:
    root: Path
    config: Qwen3TTSConfig
    generation: GenerationDefaults
    weight_names: frozenset[str]    # the tensor names in model.safetensors (header only)

    @property
    def kind(self) -> str:
        return self.config.kind

    @property
    def task(self) -> str:
        return self.config.task

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def speech_tokenizer_dir(self) -> Path:
        return self.root / SPEECH_TOKENIZER_DIR

    # Speakers and languages are matched case-insensitively, as the reference wrapper does
    # (the released files spell them in lower case).
    @property
    def speakers(self) -> tuple[str, ...]:
        return tuple(sorted(self.config.talker.spk_id))

    def speaker_id(self, name: str) -> int | None:
        return lookup(self.config.talker.spk_id, name)

    def speaker_dialect(self, name: str) -> str | None:
        return lookup(self.config.talker.spk_is_dialect, name)

    @property
    def languages(self) -> tuple[str, ...]:
        """What a request may ask for: "auto" and every codec language but the dialects
        (those follow from a dialect speaker), as the reference's supported_languages."""
        names = sorted(k.lower() for k in self.config.talker.codec_language_id if "dialect" not in k.lower())
        return (AUTO_LANGUAGE, *names)

    def language_id(self, name: str) -> int | None:
        """The codec id of a language (any case); None for "auto"; KeyError if unknown."""
        if name.lower() == AUTO_LANGUAGE:
            return None
        value = lookup(self.config.talker.codec_language_id, name)
        if value is None:
            raise KeyError(name)
        return value

    def tensors(self, prefix: str, strip: bool = True) -> dict:
        """The tensors of model.safetensors whose names start with `prefix` (prefix removed
        when `strip`); only those are read."""
        return read_tensors(self.root / WEIGHTS_FILE, prefix, strip)


def lookup(table: Mapping[str, Any], name: str):
    """table[name] matching case-insensitively (speakers, languages), None if absent."""
    lowered = name.lower()
    for key, value in table.items():
        if key.lower() == lowered:
            return value
    return None


def open_checkpoint(root: str | Path) -> Qwen3TTSCheckpoint:
    root = require_dir(root, "Qwen3-TTS")
    require_files(root, REQUIRED_FILES, "Qwen3-TTS")
    require_tokenizer(root)
    config = parse_config(_read_json(root / CONFIG_FILE), root / CONFIG_FILE)
    generation = parse_generation_config(_read_json(root / GENERATION_FILE), root / GENERATION_FILE)
    require_json_objects(root / SPEECH_TOKENIZER_DIR, ("config.json", "preprocessor_config.json"))
    names = _weight_names(root / WEIGHTS_FILE)
    needed = [TALKER_PREFIX] + ([SPEAKER_ENCODER_PREFIX] if config.kind == "base" else [])
    for prefix in needed:
        if not any(n.startswith(prefix) for n in names):
            raise CheckpointError(f"{root / WEIGHTS_FILE}: no {prefix}* tensors "
                                  f"(tts_model_type {config.kind})")
    return Qwen3TTSCheckpoint(root, config, generation, names)
