"""The higgs-audio v2 codec: 8 codebooks x 1024 codes at 25 frames/s <-> 24 kHz audio.

OmniVoice (and higgs-audio v2) keep it in `audio_tokenizer/`, laid out as the Hugging Face
repo eustlb/higgs-audio-v2-tokenizer: config.json (model_type higgs_audio_v2_tokenizer,
with nested `acoustic_model_config` (DAC) and `semantic_model_config` (HuBERT)),
model.safetensors and preprocessor_config.json.

Decoding (ours, `HiggsCodecDecoder`):

  codes [B, 8, T]
    --RVQ: per codebook, embedding row then project_out (codebook_dim -> hidden), summed
                                                              [B, T, 1024]
    --fc2 (hidden -> acoustic latent)                        [B, T, 256]
    --DAC decoder: conv k7, per upsampling ratio (8, 5, 4, 2, 3) Snake + transposed conv
      (kernel 2r, output_padding r % 2 so every block is exactly r times longer) + residual
      units (dilations 1, 3, 9), Snake, conv k7 to 1 channel; no tanh
  audio [B, T * 960]

Module and parameter names are the checkpoint's, prefix kept (`quantizer.quantizers.0.
codebook.embed`, `fc2.weight`, `acoustic_decoder.block.0.conv_t1.weight`, ...), so the
decoder's tensors load strictly and the encoder's (project_in, the EMA training buffers,
acoustic_encoder, semantic_model, ...) are never read.

Encoding (`HiggsCodecEncoder`) wraps transformers' HiggsAudioV2TokenizerModel (HuBERT +
DAC encoder + RVQ search), loaded from the local folder only.

The DAC decoder is not causal: a frame's samples depend on `context_frames` (10) frames
on each side. `decode_chunk` decodes a window and keeps the frames between its context
margins; with that much context on both sides (`chunk_window`) a stream of chunks joins
into exactly the whole-utterance decode.

boson-ai's standalone layout (bosonai/higgs-audio-v2-tokenizer: config.json with
boson_multimodal's HiggsAudioTokenizer arguments + model.pth) loads too, its names mapped
onto these (see the section on it below).

Triton-free: torch, transformers and safetensors only.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import math
import pickle
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..weights.checkpoint import (
    CheckpointError, ConfigFields, load_strict, require_dir, require_files)
from .snake import Snake

__all__ = [
    "HiggsCodecConfig", "HiggsCodecDecoder", "HiggsCodecEncoder", "load_codec_decoder",
    "decoder_graph", "write_random_codec", "write_legacy_codec", "resample",
    "context_frames", "chunk_window", "decode_chunk", "decode_chunk_rows",
    "CONFIG_FILE", "WEIGHTS_FILE", "LEGACY_WEIGHTS_FILE", "PREPROCESSOR_FILE", "MODEL_TYPE",
]

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


# --- config ------------------------------------------------------------------------------

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


# --- decoder -----------------------------------------------------------------------------

class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.snake1 = Snake(channels)
        self.conv1 = nn.Conv1d(channels, channels, 7, dilation=dilation, padding=3 * dilation)
        self.snake2 = Snake(channels)
        self.conv2 = nn.Conv1d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        # Both convs keep the length, so DAC's crop of the skip path never applies.
        return x + self.conv2(self.snake2(self.conv1(self.snake1(x))))


class DecoderBlock(nn.Module):
    """Halves the channels and upsamples by `stride`."""

    def __init__(self, in_channels: int, stride: int) -> None:
        super().__init__()
        out_channels = in_channels // 2
        self.snake1 = Snake(in_channels)
        # (T-1)s - 2ceil(s/2) + 2s + s%2 = T*s exactly: higgs adds output_padding s % 2,
        # which DAC lacks, so odd strides (the released 5 and 3) do not lose a sample.
        self.conv_t1 = nn.ConvTranspose1d(in_channels, out_channels, 2 * stride, stride=stride,
                                          padding=math.ceil(stride / 2),
                                          output_padding=stride % 2)
        self.res_unit1 = ResidualUnit(out_channels, 1)
        self.res_unit2 = ResidualUnit(out_channels, 3)
        self.res_unit3 = ResidualUnit(out_channels, 9)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_t1(self.snake1(x))
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class AcousticDecoder(nn.Module):
    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        width = cfg.decoder_hidden_size
        self.conv1 = nn.Conv1d(cfg.acoustic_hidden_size, width, 7, padding=3)
        self.block = nn.ModuleList(DecoderBlock(width // 2 ** i, r)
                                   for i, r in enumerate(cfg.upsampling_ratios))
        out = width // 2 ** len(cfg.upsampling_ratios)
        self.snake1 = Snake(out)
        self.conv2 = nn.Conv1d(out, 1, 7, padding=3)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))      # no tanh: higgs removed DAC's


class _Codebook(nn.Module):
    def __init__(self, entries: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.zeros(entries, dim))


class _CodebookDecoder(nn.Module):
    """One RVQ level's decode half: vector lookup, then project_out to the hidden width."""

    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.codebook = _Codebook(cfg.codebook_size, cfg.codebook_dim)
        self.project_out = nn.Linear(cfg.codebook_dim, cfg.hidden_size)

    def forward(self, codes: Tensor) -> Tensor:          # [B, T] -> [B, T, hidden]
        return self.project_out(F.embedding(codes, self.codebook.embed))


class _ResidualQuantizer(nn.Module):
    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(_CodebookDecoder(cfg) for _ in range(cfg.num_quantizers))

    def forward(self, codes: Tensor) -> Tensor:          # [B, Q, T] -> [B, T, hidden]
        total = self.quantizers[0](codes[:, 0])
        for q, level in enumerate(self.quantizers[1:], start=1):
            total = total + level(codes[:, q])
        return total


class HiggsCodecDecoder(nn.Module):
    """codes [B, num_quantizers, T] (int64, each in [0, codebook_size)) -> audio
    [B, T * samples_per_frame] float at cfg.sample_rate. State-dict keys are the
    checkpoint's own (prefixes quantizer., fc2., acoustic_decoder. kept)."""

    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = _ResidualQuantizer(cfg)
        self.fc2 = nn.Linear(cfg.hidden_size, cfg.acoustic_hidden_size)
        self.acoustic_decoder = AcousticDecoder(cfg)

    def forward(self, codes: Tensor) -> Tensor:
        latent = self.fc2(self.quantizer(codes)).transpose(1, 2)      # [B, acoustic, T]
        return self.acoustic_decoder(latent).squeeze(1)


# --- chunked (streaming) decoding -------------------------------------------------------

def _decoder_reach(cfg: HiggsCodecConfig) -> tuple[int, int]:
    """(frames before, frames after) a frame whose codes can change that frame's samples.

    Walks the DAC decoder's convolutions back from one output sample to the span of input
    positions it reads, for every phase of a sample within its frame. The decoder runs
    its layers in the order they are registered, and every stride-1 conv in it is centred
    (padding = dilation * (kernel - 1) / 2), so its span contains the input position
    itself and a residual skip around it widens nothing. Snake, fc2 and the RVQ are per
    position. The span is an upper bound on the real reach (a zero tap would shorten
    it); tests measure that random weights reach exactly this far."""
    with torch.device("meta"):
        convs = [m for m in AcousticDecoder(cfg).modules()
                 if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    before = after = 0
    for phase in range(cfg.samples_per_frame):
        lo = hi = phase                       # one output sample of frame 0
        for conv in reversed(convs):
            (k,), (s,), (p,), (d,) = conv.kernel_size, conv.stride, conv.padding, conv.dilation
            if isinstance(conv, nn.ConvTranspose1d):
                if d != 1:
                    raise ValueError("dilated transposed convs are not modelled")
                # y[n] = sum_m x[m] w[n + p - m*s] over 0 <= n + p - m*s < k
                lo, hi = -(-(lo + p - k + 1) // s), (hi + p) // s
            else:
                if s != 1 or 2 * p != d * (k - 1):
                    raise ValueError("only centred stride-1 convs are modelled")
                lo, hi = lo - p, hi - p + d * (k - 1)     # y[n] = sum_j x[n - p + j*d]
        before, after = max(before, -lo), max(after, hi)
    return before, after


def context_frames(cfg: HiggsCodecConfig) -> int:
    """How many frames on each side of a frame can change its samples: the decoder's
    receptive-field radius in frames, rounded up (the larger of its two sides). A chunk
    decoded with this many real frames of context on both sides (fewer only where the
    utterance itself ends) equals the same frames of a whole-utterance decode."""
    return max(_decoder_reach(cfg))


def chunk_window(start: int, stop: int, total: int, context: int) -> tuple[int, int, int, int]:
    """The window to decode for frames [start, stop) of an utterance of `total` frames
    known so far: (lo, hi, left, right), decode codes[..., lo:hi] with decode_chunk(...,
    left, right). Context is clipped at the utterance's edges, where the whole-utterance
    decode pads with zeros exactly as the window does. While streaming, `total` is the
    frames generated so far: a chunk is exact once total >= stop + context, or at the end."""
    if not 0 <= start < stop <= total or context < 0:
        raise ValueError(f"bad chunk [{start}, {stop}) of {total} frames, context {context}")
    lo, hi = max(0, start - context), min(total, stop + context)
    return lo, hi, start - lo, hi - stop


def _check_margins(width: int, left: int, right: int) -> None:
    if left < 0 or right < 0 or left + right >= width:
        raise ValueError(f"left {left} + right {right} context frames leave nothing of a "
                         f"{width}-frame window")


def decode_chunk(decoder: HiggsCodecDecoder, codes: Tensor, left: int, right: int) -> Tensor:
    """codes [B, Q, W], a window whose first `left` and last `right` frames are context
    -> audio [B, (W - left - right) * samples_per_frame] of the frames in between (every
    row has the same margins; decode_chunk_rows for per-row ones)."""
    if codes.ndim != 3:
        raise ValueError(f"expected codes [batch, quantizers, frames], got {tuple(codes.shape)}")
    width = codes.shape[-1]
    _check_margins(width, left, right)
    spf = decoder.cfg.samples_per_frame
    return decoder(codes)[:, left * spf:(width - right) * spf]


def decode_chunk_rows(decoder: HiggsCodecDecoder, codes: Tensor, lefts: Sequence[int],
                      rights: Sequence[int]) -> list[Tensor]:
    """decode_chunk with margins per row (windows of one width, batched in one decode):
    one 1-D audio tensor per row, as long as that row's kept frames."""
    if codes.ndim != 3 or not len(lefts) == len(rights) == codes.shape[0]:
        raise ValueError(f"expected codes [batch, quantizers, frames] and one left and right "
                         f"per row, got {tuple(codes.shape)}, {len(lefts)}, {len(rights)}")
    width = codes.shape[-1]
    for left, right in zip(lefts, rights):
        _check_margins(width, left, right)
    spf = decoder.cfg.samples_per_frame
    audio = decoder(codes)
    return [audio[row, left * spf:(width - right) * spf]
            for row, (left, right) in enumerate(zip(lefts, rights))]


# --- checkpoint --------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return raw


def _config_from(raw: Mapping[str, Any], path: Path) -> HiggsCodecConfig:
    try:
        return HiggsCodecConfig.from_dict(raw)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"{path}: {type(exc).__name__}: {exc}") from None


def _codec_files(root: Path) -> tuple[dict, Path]:
    """config.json's mapping and the weights file the codec is in: model.safetensors (the
    transformers layout) or model.pth (boson-ai's standalone layout, below). With both
    present config.json decides: model_type higgs_audio_v2_tokenizer is the transformers
    layout, anything else boson's, whose model.safetensors is not the codec (vLLM-Omni's
    loader notes it is another artefact of that repo)."""
    require_files(root, (CONFIG_FILE,), _WHAT)
    raw = _read_json(root / CONFIG_FILE)
    transformers_layout = raw.get("model_type") == MODEL_TYPE
    if not transformers_layout and (root / LEGACY_WEIGHTS_FILE).is_file():
        return raw, root / LEGACY_WEIGHTS_FILE
    if not (root / WEIGHTS_FILE).is_file():
        why = (f"config.json's model_type {MODEL_TYPE} is the transformers layout, which has no "
               f"{LEGACY_WEIGHTS_FILE}" if transformers_layout and (root / LEGACY_WEIGHTS_FILE).is_file()
               else f"nor is boson-ai's {LEGACY_WEIGHTS_FILE} there")
        raise CheckpointError(f"{root / WEIGHTS_FILE}: missing from the {_WHAT} checkpoint ({why})")
    return raw, root / WEIGHTS_FILE


_DECODER_KEY = re.compile(r"(acoustic_decoder|fc2)\.|quantizer\.quantizers\.\d+\.(codebook\.embed$|project_out\.)")
# Weight norm as torch.nn.utils.parametrizations stores it, and as the older hook does.
_NORM_PAIRS = ((".parametrizations.weight.original0", ".parametrizations.weight.original1"),
               (".weight_g", ".weight_v"))


def _norm_dims(g_shape: tuple[int, ...], v_shape: tuple[int, ...]) -> list[int]:
    """The dims weight norm takes ||v|| over: those where g has size 1 (weight_norm's
    `dim` is the one g keeps), less those where v has size 1 too, which change nothing
    (and so a single-channel conv's g, all ones in shape, still means its usual dims)."""
    if len(g_shape) != len(v_shape):
        return list(range(len(v_shape)))
    return [d for d in range(len(v_shape)) if g_shape[d] == 1 and v_shape[d] != 1]


def _fold_pair(g: Tensor, v: Tensor) -> Tensor:
    """The weight g * v / ||v||."""
    g, v = g.float(), v.float()
    dims = _norm_dims(tuple(g.shape), tuple(v.shape))
    return v * (g / torch.linalg.vector_norm(v, dim=dims, keepdim=True))


def _fold_weight_norm(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Replace each weight-norm (g, v) pair by its weight (_fold_pair)."""
    out = dict(tensors)
    for g_suffix, v_suffix in _NORM_PAIRS:
        for g_key in [k for k in out if k.endswith(g_suffix)]:
            stem = g_key[:-len(g_suffix)]
            v_key = stem + v_suffix
            if v_key not in out:
                continue        # left unmatched: load_strict names it as unexpected
            out[stem + ".weight"] = _fold_pair(out.pop(g_key), out.pop(v_key))
    return out


def _read_decoder_weights(path: Path) -> dict[str, Tensor]:
    """The decode path's tensors in float32, weight norm folded; nothing else is read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k).float() for k in f.keys() if _DECODER_KEY.match(k)}
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    if not tensors:
        raise CheckpointError(f"{path}: no decoder tensors (quantizer.*, fc2.*, acoustic_decoder.*)")
    return _fold_weight_norm(tensors)


def load_codec_decoder(codec_dir: str | Path, device: str | torch.device = "cpu") -> HiggsCodecDecoder:
    """The decoder from an audio_tokenizer/ folder, transformers' layout or boson-ai's
    (see _codec_files), fp32, eval mode, on `device`. A missing or malformed file, and any
    missing, extra or wrongly shaped decoder tensor, raise CheckpointError naming the file."""
    root = require_dir(codec_dir, _WHAT)
    raw, weights_path = _codec_files(root)
    if weights_path.name == LEGACY_WEIGHTS_FILE:
        tensors = _read_legacy_weights(weights_path)
        cfg = _config_from(_legacy_config(raw, root / CONFIG_FILE, tensors), root / CONFIG_FILE)
        module = HiggsCodecDecoder(cfg)
        weights = _from_legacy(tensors, module.state_dict(), cfg, weights_path,
                               _LEGACY_DECODER_KEY.match)
    else:
        cfg = _config_from(raw, root / CONFIG_FILE)
        module = HiggsCodecDecoder(cfg)
        weights = _read_decoder_weights(weights_path)
    load_strict(module, weights, f"{weights_path} (decoder tensors)")
    return module.to(device=device, dtype=torch.float32).eval()


# --- boson-ai's standalone layout: config.json + model.pth ---------------------------------
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


def decoder_graph(decoder: HiggsCodecDecoder, max_batch: int = 8, max_frames: int = 1500):
    """The decoder as a tritontts.nn.runtime Graph: codes int64 (batch, Q, frames) -> audio
    float32 (batch, frames * samples_per_frame), for onnxruntime / TensorRT."""
    from .runtime import Axis, Graph, TensorSpec

    cfg = decoder.cfg
    return Graph(
        name="higgs_codec_decoder", module=decoder,
        inputs=(TensorSpec("codes", torch.int64, ("batch", cfg.num_quantizers, "frames"),
                           high=cfg.codebook_size),),
        outputs=("audio",),
        # opt: 10 s, a typical OmniVoice utterance (it decodes whole utterances).
        axes={"batch": Axis(1, 1, max_batch), "frames": Axis(1, min(250, max_frames), max_frames)},
        output_axes={"audio": {0: "batch", 1: "samples"}})


# --- resampling (for the encoder's HuBERT at 16 kHz) -------------------------------------

def resample(waveform: Tensor, orig_freq: int, new_freq: int, lowpass_filter_width: int = 6,
             rolloff: float = 0.99, resampling_method: str = "sinc_interp_hann",
             beta: float | None = None) -> Tensor:
    """Band-limited sinc resampling along the last axis, the method and defaults of
    torchaudio.functional.resample (Hann-windowed sinc, 6 zero crossings, roll-off 0.99),
    which transformers' tokenizer calls and which cannot be installed beside this torch.

    Output j is sum_i x[i] h(i/orig - j/new), h a low-pass at rolloff * min(orig, new)/2
    (in rates reduced by their gcd). The filter for j + new is that of j shifted by orig
    inputs, so all `new` phases run as one strided conv with `new` output channels."""
    if resampling_method != "sinc_interp_hann" or beta is not None:
        raise ValueError(f"only sinc_interp_hann resampling is implemented, not {resampling_method!r}")
    if orig_freq == new_freq:
        return waveform
    gcd = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // gcd, int(new_freq) // gcd
    cutoff = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / cutoff)      # taps each side, in inputs
    dtype = waveform.dtype
    # Computed in the waveform's dtype, as torchaudio does, so the filters agree bit for bit.
    taps = torch.arange(-width, width + orig, dtype=dtype, device=waveform.device) / orig
    phases = torch.arange(0, -new, -1, dtype=dtype, device=waveform.device) / new
    t = ((phases[:, None] + taps[None, :]) * cutoff).clamp(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    kernel = (sinc * (window * (cutoff / orig)))[:, None, :]        # [new, 1, taps]
    shape = waveform.shape
    flat = waveform.reshape(-1, shape[-1])
    padded = F.pad(flat, (width, width + orig))
    out = F.conv1d(padded[:, None], kernel, stride=orig)            # [N, new, steps]
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)[:, :math.ceil(new * shape[-1] / orig)]
    return out.reshape(*shape[:-1], out.shape[-1])


_TORCHAUDIO_SHIM = types.ModuleType("torchaudio")
_TORCHAUDIO_SHIM.functional = types.ModuleType("torchaudio.functional")
_TORCHAUDIO_SHIM.functional.resample = resample
_TOKENIZER_MODULE = "transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer"


def _tokenizer_module():
    """transformers' higgs tokenizer modeling module. It imports torchaudio (only for
    resample), which is absent here: then our `resample` stands in for it while the module
    imports, and is bound as the module's `torchaudio` from then on. A real torchaudio,
    when present, is used."""
    importlib.import_module("transformers")     # it probes for torchaudio: before any stand-in

    module = sys.modules.get(_TOKENIZER_MODULE)
    if module is None and ("torchaudio" in sys.modules
                           or importlib.util.find_spec("torchaudio") is not None):
        try:
            module = importlib.import_module(_TOKENIZER_MODULE)
        except (ImportError, OSError):      # a torchaudio built for another torch
            module = None
    if module is None:
        saved = sys.modules.get("torchaudio")
        sys.modules["torchaudio"] = _TORCHAUDIO_SHIM
        try:
            module = importlib.import_module(_TOKENIZER_MODULE)
        finally:
            if saved is None:
                sys.modules.pop("torchaudio", None)
            else:
                sys.modules["torchaudio"] = saved
    # An empty stand-in (another importer's) has no resample: ours replaces it.
    if not callable(getattr(getattr(module.torchaudio, "functional", None), "resample", None)):
        module.torchaudio = _TORCHAUDIO_SHIM
    return module


def _tokenizer_classes():
    from transformers.models.higgs_audio_v2_tokenizer.configuration_higgs_audio_v2_tokenizer import (
        HiggsAudioV2TokenizerConfig)

    return _tokenizer_module().HiggsAudioV2TokenizerModel, HiggsAudioV2TokenizerConfig


def _legacy_tokenizer_model(raw: Mapping[str, Any], config_path: Path, weights_path: Path):
    """(config, transformers' HiggsAudioV2TokenizerModel) from boson's layout: the model is
    built from the equivalent transformers config and every tensor of the file is mapped
    onto it and loaded strictly. The semantic model's architecture is not in the file
    or in boson's config.json, only its weights: boson's code builds it from the hub by
    semantic_techer, and its two HuBERT teachers are HuBERT base, transformers' default
    HubertConfig (the one transformers' own conversion of this file uses). Other teachers
    (WavLM), and HuBERTs of other widths, raise CheckpointError."""
    tensors = _read_legacy_weights(weights_path)
    derived = _legacy_config(raw, config_path, tensors)
    cfg = _config_from(derived, config_path)
    fields = ConfigFields(raw, config_path)
    fields.str("semantic_techer", "hubert_base_general", choices=_BOSON_TEACHERS)
    fields.str("downsample_mode", "step_down", choices=("step_down",))   # transformers' way
    fields.str("merge_mode", "concat", choices=("concat",))
    model_class, config_class = _tokenizer_classes()
    semantic = derived["semantic_model_config"]
    if semantic["hidden_size"] != _SEMANTIC_HIDDEN_DEFAULT:
        raise CheckpointError(f"{weights_path}: the semantic features are {semantic['hidden_size']} "
                              f"wide, not HuBERT base's {_SEMANTIC_HIDDEN_DEFAULT}: encoding needs "
                              f"boson's HuBERT base teacher (decoding does not)")
    if "semantic_model.masked_spec_embed" in tensors:
        # Training-only (SpecAugment); HubertConfig's default masking creates it.
        semantic["mask_time_prob"] = 0.05
    try:
        config = config_class(**derived)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{config_path}: no transformers config follows from it ({exc})") from None
    with _no_init_weights():        # every tensor is loaded next: skip the random init
        model = model_class(config)
    weights = _from_legacy(tensors, model.state_dict(), cfg, weights_path, lambda key: True)
    load_strict(model, weights, f"{weights_path} (as transformers' HiggsAudioV2TokenizerModel)")
    return cfg, model


def _no_init_weights():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:             # another transformers: initialising only costs time
        return contextlib.nullcontext()
    return no_init_weights()


# --- encoder -----------------------------------------------------------------------------

class HiggsCodecEncoder:
    """Reference audio -> codes, for voice cloning: transformers' HiggsAudioV2TokenizerModel
    loaded once from the local folder (never downloaded), the decode-only parts dropped.
    A folder in boson-ai's layout is mapped onto that model (_legacy_tokenizer_model)."""

    def __init__(self, codec_dir: str | Path, device: str | torch.device = "cpu") -> None:
        root = require_dir(codec_dir, _WHAT)
        raw, weights_path = _codec_files(root)
        if weights_path.name == LEGACY_WEIGHTS_FILE:
            self.cfg, model = _legacy_tokenizer_model(raw, root / CONFIG_FILE, weights_path)
        else:
            self.cfg = _config_from(raw, root / CONFIG_FILE)
            model_class, _ = _tokenizer_classes()
            try:
                model = model_class.from_pretrained(str(root), local_files_only=True)
            except (OSError, ValueError, RuntimeError) as exc:
                raise CheckpointError(f"{root}: transformers cannot load the codec ({exc})") from None
        # encode() never touches these; dropping them frees the decoder's memory.
        for name in ("acoustic_decoder", "decoder_semantic", "fc1", "fc2"):
            setattr(model, name, nn.Identity())
        self.model = model.to(device=device, dtype=torch.float32).eval()
        self.device = torch.device(device)
        self.hop_length = self.cfg.hop_length
        self.sample_rate = self.cfg.sample_rate

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> np.ndarray:
        """float32 mono audio at sample_rate (24 kHz) -> codes int64 [num_quantizers, T],
        T = len(audio) // hop_length: the audio is first cut to whole frames."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"expected mono audio of shape [samples], got {audio.shape}")
        usable = len(audio) // self.hop_length * self.hop_length
        if usable == 0:
            raise ValueError(f"reference audio of {len(audio)} samples is shorter than one "
                             f"codec frame ({self.hop_length} samples)")
        x = torch.from_numpy(np.ascontiguousarray(audio[:usable])).to(self.device)[None, None]
        codes = self.model.encode(x, return_dict=False)
        return codes[0].to(device="cpu", dtype=torch.int64).numpy()


# --- random checkpoints (tests, benchmarks) ----------------------------------------------

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
