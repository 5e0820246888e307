"""Random codec checkpoints in both layouts (tests, benchmarks)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from torch import Tensor

from .config import (
    CONFIG_FILE,
    LEGACY_WEIGHTS_FILE,
    MODEL_TYPE,
    PREPROCESSOR_FILE,
    WEIGHTS_FILE,
    HiggsCodecConfig,
)
from .decoder import HiggsCodecDecoder
from .encoder import _tokenizer_classes
from .legacy import _legacy_modules, _legacy_sources
from .weight_norm import _norm_dims


def codec_config_dict(size: str) -> dict:
    """config.json for `size`. Both keep the released rates: 24 kHz, ratios 8*5*4*2*3 = 960
    samples per frame (25 frames/s), 8 codebooks of 1024 (target bandwidth 2 kbps)."""
    ratios = [8, 5, 4, 2, 3]
    common = {"architectures": ["HiggsAudioV2TokenizerModel"], "model_type": MODEL_TYPE,
              "sample_rate": 24000, "codebook_size": 1024, "downsample_factor": 320,
              "semantic_sample_rate": 16000, "kernel_size": 3, "unit_kernel_size": 3,
              "strides": [1, 1], "channel_ratios": [1, 1], "block_dilations": [1, 1],
              "target_bandwidths": [0.5, 1, 1.5, 2], "initializer_range": 0.02}
    hubert = {"model_type": "hubert", "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
              "conv_stride": [5, 2, 2, 2, 2, 2, 2], "layer_norm_eps": 1e-5}
    if size == "released":
        # As the released audio_tokenizer/config.json sets them (transformers' own defaults
        # differ: 4 ratios (hop 320) and a 4 kbps bandwidth, i.e. 16 codebooks).
        return {**common, "codebook_dim": 64,
                "acoustic_model_config": {"model_type": "dac", "encoder_hidden_size": 64,
                                          "decoder_hidden_size": 1024, "hidden_size": 256,
                                          "downsampling_ratios": ratios, "upsampling_ratios": ratios},
                "semantic_model_config": {**hubert, "hidden_size": 768, "intermediate_size": 3072,
                                          "num_hidden_layers": 12, "num_attention_heads": 12,
                                          "conv_dim": [512] * 7, "num_conv_pos_embeddings": 128,
                                          "num_conv_pos_embedding_groups": 16}}
    if size == "tiny":
        return {**common, "codebook_dim": 16,
                "acoustic_model_config": {"model_type": "dac", "encoder_hidden_size": 4,
                                          "decoder_hidden_size": 128, "hidden_size": 16,
                                          "downsampling_ratios": ratios, "upsampling_ratios": ratios},
                "semantic_model_config": {**hubert, "hidden_size": 32, "intermediate_size": 64,
                                          "num_hidden_layers": 1, "num_attention_heads": 2,
                                          "conv_dim": [16] * 7, "num_conv_pos_embeddings": 16,
                                          "num_conv_pos_embedding_groups": 4}}
    raise ValueError(f"size must be 'tiny' or 'released', not {size!r}")


_PREPROCESSOR = {"feature_extractor_type": "DacFeatureExtractor", "feature_size": 1,
                 "hop_length": 960, "padding_side": "right", "padding_value": 0.0,
                 "return_attention_mask": True, "sampling_rate": 24000}


def _random_tensor(key: str, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    randn = lambda *s: torch.randn(s, generator=generator)       # noqa: E731
    if key.endswith(".alpha"):                       # Snake frequencies: positive, near 1
        return 0.5 + torch.rand(shape, generator=generator)
    if key.endswith(("codebook.inited", "codebook.cluster_size")):
        return torch.ones(shape)
    if key.endswith("codebook.embed"):               # distinct unit-scale vectors
        return randn(*shape)
    if key.endswith("parametrizations.weight.original0"):
        return 0.5 + torch.rand(shape, generator=generator)
    if len(shape) == 1:                              # biases, norm gains/offsets
        base = 1.0 if re.search(r"(norm|layer_norm)\.weight$", key) else 0.0
        return base + 0.05 * randn(*shape)
    # Weights: unit gain over the fan-in (every dim but the first) keeps activations at a
    # similar scale through the stack; conv_t1 is [in, out, k] but the same rule serves.
    fan_in = math.prod(shape[1:])
    gain = 0.5 if re.search(r"res_unit\d\.conv2|res_units\.\d+\.conv2", key) else 1.0
    return randn(*shape) * (gain / math.sqrt(fan_in))


def _random_codec(size: str, seed: int) -> tuple[dict, dict[str, Tensor]]:
    """(config.json mapping, state dict) of a random codec in transformers' names."""
    config = codec_config_dict(size)
    model_class, config_class = _tokenizer_classes()
    # The key set and shapes are transformers' own, taken from a weightless instance.
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in
                  model_class(config_class(**json.loads(json.dumps(config)))).state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    tensors = {k: _random_tensor(k, shape, generator) for k, shape in shapes.items()}
    for key in [k for k in tensors if k.endswith("codebook.embed_avg")]:
        tensors[key] = tensors[key[:-len("_avg")]].clone()
    _calibrate_output(tensors, HiggsCodecConfig.from_dict(config), generator)
    return config, tensors


def write_random_codec(out_dir: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """A codec folder (config.json, model.safetensors, preprocessor_config.json) with seeded
    random weights that transformers' HiggsAudioV2TokenizerModel and load_codec_decoder
    both load. size "tiny" (small widths, 1-layer HuBERT: tests) or "released" (the
    released widths: benchmarks). Returns the folder."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    config, tensors = _random_codec(size, seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    (out / PREPROCESSOR_FILE).write_text(json.dumps(_PREPROCESSOR, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / WEIGHTS_FILE),
              metadata={"format": "pt"})
    return out


def write_legacy_codec(out_dir: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """The codec write_random_codec(out_dir, size, seed) writes, the same weights, in
    boson-ai's standalone layout: config.json with HiggsAudioTokenizer's arguments (as the
    released one has them) and model.pth, boson's names, the DAC convs weight-normed as
    (weight_g, weight_v). Returns the folder."""
    out = Path(out_dir)
    config, tensors = _random_codec(size, seed)
    acoustic = config["acoustic_model_config"]
    if acoustic["downsampling_ratios"] != acoustic["upsampling_ratios"]:
        raise ValueError("boson's layout has one `ratios` for the DAC encoder and decoder")
    cfg = HiggsCodecConfig.from_dict(config)
    modules = _legacy_modules(cfg)
    # g is each output row's norm and v the row times a random power of two: folding
    # g * v / ||v|| back is a real computation, as for boson's file, and an exact one
    # (scaling by 2^k rounds nothing, and ||v|| is then exactly 2^k ||row||).
    generator = torch.Generator().manual_seed(seed)
    # HuBERT's positional conv keeps torch's parametrizations names: transformers' conversion
    # of boson's file loads its semantic_model tensors into HubertModel unrenamed.
    legacy = {}
    for key, tensor in tensors.items():
        names = _legacy_sources(key, modules)[0]
        if len(names) == 2:
            rows = (tensor.shape[0],) + (1,) * (tensor.ndim - 1)
            dims = _norm_dims(rows, tuple(tensor.shape))
            legacy[names[0]] = torch.linalg.vector_norm(tensor, dim=dims, keepdim=True)
            legacy[names[1]] = tensor * torch.randint(-2, 3, rows, generator=generator).float().exp2()
        else:
            legacy[names[0]] = tensor
    boson_config = {"n_filters": 32, "D": acoustic["hidden_size"], "codebook_dim": cfg.codebook_dim,
                    "target_bandwidths": [0.5, 1, 1.5, 2, 4], "ratios": acoustic["upsampling_ratios"],
                    "sample_rate": cfg.sample_rate, "bins": cfg.codebook_size,
                    "n_q": cfg.num_quantizers, "semantic_techer": "hubert_base_general"}
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(boson_config, indent=2) + "\n")
    torch.save({k: v.contiguous() for k, v in legacy.items()}, out / LEGACY_WEIGHTS_FILE)
    return out


@torch.no_grad()
def _calibrate_output(tensors: dict[str, Tensor], cfg: HiggsCodecConfig,
                      generator: torch.Generator, peak: float = 0.5) -> None:
    """Scale the last conv so random codes decode to audio peaking near `peak`: random
    residual stacks otherwise end anywhere between silence and thousands."""
    decoder = HiggsCodecDecoder(cfg)
    decoder.load_state_dict({k: tensors[k] for k in decoder.state_dict()})
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 8), generator=generator)
    scale = peak / float(decoder(codes).abs().max().clamp_min(1e-12))
    for key in ("acoustic_decoder.conv2.weight", "acoustic_decoder.conv2.bias"):
        tensors[key] = tensors[key] * scale


def spread_codebooks(module: torch.nn.Module) -> None:
    """Unit-normal codebook rows, as the random codec checkpoints have them: the codec's
    own init leaves them zero (a checkpoint always fills them), which would decode every
    code alike and encode every frame to code 0 (the GPU check's random networks)."""
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if name.endswith("codebook.embed"):
                tensor.normal_()
