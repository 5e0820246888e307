"""boson-ai's standalone layout (config.json with HiggsAudioTokenizer's arguments + model.pth),
its names mapped onto ours."""
from __future__ import annotations

import math
import pickle
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from torch import Tensor

from ...weights.checkpoint import CheckpointError, ConfigFields
from .config import MODEL_TYPE, HiggsCodecConfig
from .weight_norm import _fold_pair

#
# bosonai/higgs-audio-v2-tokenizer as boson_multimodal's HiggsAudioTokenizer loads it:
# config.json holds that class's constructor arguments, model.pth its state dict. Names
# (from its code, and transformers' convert_higgs_audio_v2_tokenizer_to_hf.py, which maps
# the same file onto the names used here):
#   decoder_2.model.<i>   DAC decoder, one nn.Sequential: 0 conv, 1..n blocks (each a
#                         Sequential: Snake, ConvTranspose, 3 residual units of Snake, conv,
#                         Snake, 1x1 conv), n+1 Snake, n+2 conv; convs weight-normed
#                         (weight_g, weight_v)
#   encoder.block.<i>     DAC encoder, likewise (blocks: 3 residual units, Snake, conv)
#   quantizer.vq.layers.<i>.{_codebook.*, project_in, project_out}
#   fc_prior, fc_post1, fc_post2                 transformers' fc, fc1, fc2
#   encoder_semantic, decoder_semantic           each nn.Conv1d but a residual unit's 1x1
#                                                one wrapped in a module (one more `.conv`)
#   semantic_model                               the HuBERT, transformers' HubertModel names

_BOSON_TEACHERS = ("hubert_base", "hubert_base_general")      # both HuBERT base
_LEGACY_DECODER_KEY = re.compile(
    r"decoder_2\.|fc_post2\.|quantizer\.vq\.layers\.\d+\.(project_out\.|_codebook\.embed$)")
_RESIDUAL_LAYERS = ("snake1", "conv1", "snake2", "conv2")      # DAC ResidualUnit.block order


def _read_legacy_weights(path: Path) -> dict[str, Tensor]:
    """model.pth's tensors. It is a pickle, and unpickling in full runs whatever callable
    the file names: weights_only=True unpickles tensors and plain containers only and
    refuses anything else, so a crafted file fails here instead of running code."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise CheckpointError(f"{path}: not a loadable torch state dict "
                              f"({type(exc).__name__}: {first_line})") from None
    if not isinstance(state, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise CheckpointError(f"{path}: expected a plain dict of tensors by name, "
                              f"got {type(state).__name__}")
    return dict(state)


def _dac_modules(ours: str, boson: str, blocks: int, decoder: bool):
    """(our module path, boson's) for a DAC decoder or encoder of `blocks` blocks."""
    yield f"{ours}.conv1", f"{boson}.0"
    # Inside a block's Sequential: the decoder's Snake and ConvTranspose come first, the
    # encoder's Snake and strided conv after its residual units.
    first_unit, own = (2, (("snake1", 0), ("conv_t1", 1))) if decoder else (0, (("snake1", 3), ("conv1", 4)))
    for b in range(blocks):
        block, sequential = f"{ours}.block.{b}", f"{boson}.{b + 1}.block"
        for name, index in own:
            yield f"{block}.{name}", f"{sequential}.{index}"
        for unit in range(3):
            for index, name in enumerate(_RESIDUAL_LAYERS):
                yield f"{block}.res_unit{unit + 1}.{name}", f"{sequential}.{first_unit + unit}.block.{index}"
    yield f"{ours}.snake1", f"{boson}.{blocks + 1}"
    yield f"{ours}.conv2", f"{boson}.{blocks + 2}"


def _legacy_modules(cfg: HiggsCodecConfig) -> dict[str, str]:
    """Our (transformers') module path -> boson's, for the modules whose names differ by
    more than the semantic wrappers' `.conv` (see _legacy_name). boson's config has one
    `ratios` for both DAC halves, so the encoder has as many blocks as the decoder."""
    blocks = len(cfg.upsampling_ratios)
    names = dict(_dac_modules("acoustic_decoder", "decoder_2.model", blocks, True))
    names.update(_dac_modules("acoustic_encoder", "encoder.block", blocks, False))
    for q in range(cfg.num_quantizers):
        ours, boson = f"quantizer.quantizers.{q}", f"quantizer.vq.layers.{q}"
        names.update({f"{ours}.codebook": f"{boson}._codebook",
                      f"{ours}.project_in": f"{boson}.project_in",
                      f"{ours}.project_out": f"{boson}.project_out"})
    names.update({"fc": "fc_prior", "fc1": "fc_post1", "fc2": "fc_post2"})
    return names


def _legacy_name(key: str, modules: Mapping[str, str]) -> str:
    stem, _, leaf = key.rpartition(".")
    if stem in modules:
        return f"{modules[stem]}.{leaf}"
    head, _, path = stem.partition(".")
    # boson's semantic Conv1d is a module holding an nn.Conv1d as `.conv`; the residual
    # units' 1x1 conv2 (Conv1d1x1) is a bare nn.Conv1d.
    if head in ("encoder_semantic", "decoder_semantic") and (
            path.rpartition(".")[2] in ("conv", "conv1") or path == "conv2"):
        return f"{stem}.conv.{leaf}"
    return key


def _legacy_sources(key: str, modules: Mapping[str, str]) -> list[tuple[str, ...]]:
    """Where our tensor `key` may be in boson's file, the native form first: (name,) for
    one tensor, (g, v) for a weight-normed weight to fold."""
    for original in (".parametrizations.weight.original0", ".parametrizations.weight.original1"):
        if key.endswith(original):
            # HuBERT's positional conv: torch's current weight norm, or the older hook's g/v.
            old = ".weight_g" if original.endswith("0") else ".weight_v"
            return [(key,), (key[:-len(original)] + old,)]
    name = _legacy_name(key, modules)
    if name.startswith(("decoder_2.", "encoder.")) and name.endswith(".weight"):
        stem = name[:-len(".weight")]
        return [(stem + ".weight_g", stem + ".weight_v"), (name,)]      # boson's DAC: all WN
    return [(name,)]


def _from_legacy(tensors: Mapping[str, Tensor], expected: Iterable[str], cfg: HiggsCodecConfig,
                 path: Path, in_scope) -> dict[str, Tensor]:
    """Our state dict (keys `expected`) from boson's tensors, weight norm folded. Missing
    tensors, and those of the file that `in_scope` claims but nothing read, raise
    CheckpointError naming them by boson's names."""
    modules = _legacy_modules(cfg)
    out, missing, used = {}, [], set()
    for key in expected:
        options = _legacy_sources(key, modules)
        sources = next((s for s in options if all(name in tensors for name in s)), None)
        if sources is None:
            missing.append(" + ".join(options[0]))
            continue
        used.update(sources)
        if len(sources) == 2:
            out[key] = _fold_pair(tensors[sources[0]], tensors[sources[1]])
        else:
            tensor = tensors[sources[0]]
            out[key] = tensor.float() if tensor.is_floating_point() else tensor
    unexpected = sorted(k for k in tensors if k not in used and in_scope(k))
    if missing or unexpected:
        parts = [f"{label}: {', '.join(keys)}" for label, keys in
                 (("missing keys", missing), ("unexpected keys", unexpected)) if keys]
        raise CheckpointError(f"{path} does not match boson-ai's codec layout; " + "; ".join(parts))
    return out


def _tensor_shape(tensors: Mapping[str, Tensor], path: Path, *names: str) -> tuple[int, ...]:
    for name in names:
        if name in tensors:
            return tuple(tensors[name].shape)
    raise CheckpointError(f"{path}: missing {names[0]}")


def _legacy_config(raw: Mapping[str, Any], path: Path, tensors: Mapping[str, Tensor]) -> dict:
    """The transformers config.json mapping equal to boson's config.json (`raw`, read with
    HiggsAudioTokenizer's own defaults) over these tensors. boson's code fixes some widths
    instead of configuring them (DAC decoder 1024 and encoder 64 channels, HuBERT base's
    768 semantic features); they are read from the tensors' shapes, so a file of other
    widths (the tests' tiny one) loads too."""
    fields = ConfigFields(raw, path)
    latent = fields.int("D", 128, low=1)
    ratios = list(fields.ints("ratios", (8, 5, 4, 2)))
    sample_rate = fields.int("sample_rate", 16000, low=1)
    bins = fields.int("bins", 1024, low=2)           # a list there is boson's FSQ: not this codec
    n_q = fields.int("n_q", 8, low=1)
    codebook_dim = fields.int("codebook_dim", None, low=1)
    if codebook_dim is None:
        fields.fail("codebook_dim", "is missing: boson's RVQ then has no projections, which "
                                    "this codec always has")
    if fields.int("vq_scale", 1) != 1:
        fields.fail("vq_scale", "must be 1: transformers' RVQ works at the full D + semantic width")
    decoder_width = _tensor_shape(tensors, path, "decoder_2.model.0.weight_v", "decoder_2.model.0.weight")[0]
    hidden = _tensor_shape(tensors, path, "quantizer.vq.layers.0.project_out.weight")[0]
    if hidden <= latent:
        raise CheckpointError(f"{path}: the RVQ is {hidden} wide, which leaves no semantic "
                              f"features beside config.json's D {latent}")
    encoder_width = (_tensor_shape(tensors, path, "encoder.block.0.weight_v", "encoder.block.0.weight")[0]
                     if any(k.startswith("encoder.block.0.") for k in tensors) else 64)
    # transformers derives the codebook count from the top bandwidth (kbps): the bandwidth of
    # n_q codebooks, half a bit per second above it so float rounding cannot floor it to n_q - 1.
    frame_rate = math.ceil(sample_rate / math.prod(ratios))
    bandwidth = (n_q * frame_rate * math.ceil(math.log2(bins)) + 0.5) / 1000
    return {"model_type": MODEL_TYPE, "sample_rate": sample_rate, "codebook_size": bins,
            "codebook_dim": codebook_dim, "target_bandwidths": [bandwidth],
            "semantic_sample_rate": fields.int("semantic_sample_rate", 16000, low=1),
            "acoustic_model_config": {"model_type": "dac", "encoder_hidden_size": encoder_width,
                                      "downsampling_ratios": ratios, "upsampling_ratios": ratios,
                                      "decoder_hidden_size": decoder_width, "hidden_size": latent},
            "semantic_model_config": {"model_type": "hubert", "hidden_size": hidden - latent}}
