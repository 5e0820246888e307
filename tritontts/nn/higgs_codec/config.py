"""The codec's configuration (config.json as data) and the layout's file names."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LEGACY_WEIGHTS_FILE = "model.pth"           # boson-ai's standalone layout
PREPROCESSOR_FILE = "preprocessor_config.json"
MODEL_TYPE = "higgs_audio_v2_tokenizer"
_WHAT = "higgs-audio v2 codec"

# Defaults of transformers' HiggsAudioV2TokenizerConfig (5.19), applied as it applies them:
# top-level keys the file omits, and acoustic keys merged under the file's own.
_DEFAULTS = {"sample_rate": 24000, "codebook_size": 1024, "codebook_dim": 64,
             "target_bandwidths": [0.5, 1, 1.5, 2, 4]}
_ACOUSTIC_DEFAULTS = {"encoder_hidden_size": 64, "downsampling_ratios": [8, 5, 4, 2],
                      "decoder_hidden_size": 1024, "upsampling_ratios": [8, 5, 4, 2],
                      "hidden_size": 256}
_SEMANTIC_HIDDEN_DEFAULT = 768      # HubertConfig's hidden_size


@dataclass(frozen=True)
class HiggsCodecConfig:
    """What the decode path needs from config.json."""
    sample_rate: int
    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    semantic_hidden_size: int
    acoustic_hidden_size: int
    decoder_hidden_size: int
    upsampling_ratios: tuple[int, ...]
    hop_length: int                     # product of the encoder's downsampling ratios

    @property
    def hidden_size(self) -> int:
        """Width of the RVQ space: acoustic latent + semantic features side by side."""
        return self.acoustic_hidden_size + self.semantic_hidden_size

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios)

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.samples_per_frame

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "HiggsCodecConfig":
        """From config.json's mapping, interpreted as transformers interprets it (its
        defaults; num_quantizers from the largest target bandwidth). ValueError if the
        decoder could not produce hop_length samples per frame."""
        model_type = raw.get("model_type", MODEL_TYPE)
        if model_type != MODEL_TYPE:
            raise ValueError(f"model_type {model_type!r}, expected {MODEL_TYPE!r}")
        top = {**_DEFAULTS, **{k: raw[k] for k in _DEFAULTS if raw.get(k) is not None}}
        acoustic = raw.get("acoustic_model_config") or {}
        semantic = raw.get("semantic_model_config") or {}
        if not isinstance(acoustic, Mapping) or not isinstance(semantic, Mapping):
            raise ValueError("acoustic_model_config and semantic_model_config must be objects")
        acoustic = {**_ACOUSTIC_DEFAULTS, **acoustic}
        down = tuple(int(r) for r in acoustic["downsampling_ratios"])
        up = tuple(int(r) for r in acoustic["upsampling_ratios"])
        hop = math.prod(down)
        if math.prod(up) != hop:
            raise ValueError(f"upsampling_ratios {list(up)} give {math.prod(up)} samples per "
                             f"frame but the encoder's hop is {hop} ({list(down)})")
        decoder_hidden = int(acoustic["decoder_hidden_size"])
        if decoder_hidden % 2 ** len(up):
            raise ValueError(f"decoder_hidden_size {decoder_hidden} does not halve {len(up)} times")
        codebook_size = int(top["codebook_size"])
        # transformers: 1000 * max bandwidth // (frame rate * bits per code)
        frame_rate = math.ceil(int(top["sample_rate"]) / hop)
        bits = math.ceil(math.log2(codebook_size))
        quantizers = int(1000 * float(top["target_bandwidths"][-1]) // (frame_rate * bits))
        if quantizers < 1:
            raise ValueError(f"target_bandwidths {top['target_bandwidths']} give no codebook")
        return cls(sample_rate=int(top["sample_rate"]), codebook_size=codebook_size,
                   codebook_dim=int(top["codebook_dim"]), num_quantizers=quantizers,
                   semantic_hidden_size=int(semantic.get("hidden_size", _SEMANTIC_HIDDEN_DEFAULT)),
                   acoustic_hidden_size=int(acoustic["hidden_size"]),
                   decoder_hidden_size=decoder_hidden, upsampling_ratios=up, hop_length=hop)
