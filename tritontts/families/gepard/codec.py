"""NVIDIA NanoCodec's decoder (ours), as Gepard-1.0 uses it: frames of 32 per-dimension FSQ
codes at 22050 / 1024 = 21.53 Hz -> 1024 samples a frame at 22.05 kHz
(nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps).

  codes -> latent   Gepard's talker samples every FSQ dimension with its own head (8 groups x
                    levels [8, 7, 6, 6], group-major), so a code k of a dimension with L levels
                    is the latent value (k - L//2) / (L//2) as it stands. NeMo's own decode
                    takes one mixed-radix index per group and splits it into these digits
                    first; both end in the same 32 values (the tests check it).
  decoder           NeMo's CausalHiFiGANDecoder: a causal k7 conv to base_channels, then per
                    up-sample rate r: half-snake, a transposed conv (kernel 2r, stride r,
                    channels halved, one group per output channel) with its k - r overhang
                    cut on the right, and a HiFi-GAN residual layer (the mean of three chains
                    of kernel 3 / 7 / 11 blocks with dilations 1 / 3 / 5); then half-snake, a
                    causal k3 conv to one channel and a clamp to [-1, 1].

Every conv pads on the left only, so the decoder is causal: a window with `context_frames`
frames of left context decodes its newer frames exactly as the whole utterance does.

The codec ships as a NeMo archive (.nemo: a tar of model_config.yaml and model_weights.ckpt,
members usually named ./...), read here with tarfile, yaml.safe_load and a weights_only
torch.load: NeMo itself is not needed. Parameter names are the archive's under
`audio_decoder.`; its convs are weight-normed (torch's parametrization: original0 = g,
original1 = v; older NeMo wrote weight_g / weight_v), folded into plain weights at load.
"""
from __future__ import annotations

import io
import math
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import CheckpointError, ConfigFields, fold_weight_norm, load_strict

CONFIG_MEMBER = "model_config.yaml"
WEIGHTS_MEMBER = "model_weights.ckpt"
DECODER_PREFIX = "audio_decoder."
RELEASED_NAME = "nemo-nano-codec-22khz-1.89kbps-21.5fps.nemo"

# NeMo's Snake adds this to alpha before taking its reciprocal, and its HalfSnake uses
# torch's default LeakyReLU slope (0.01, not HiFi-GAN's usual 0.1).
SNAKE_EPS = 1e-9
LRELU_SLOPE = 0.01


# --- config --------------------------------------------------------------------------------

@dataclass(frozen=True)
class NanoCodecConfig:
    """The parts of model_config.yaml that decoding needs (activation and pad_mode are
    checked, not kept: half_snake and zeros are the only ones built). The kernel and
    dilation defaults are NeMo's CausalHiFiGANDecoder signature's, which the released
    archive leaves unset; from_yaml takes NeMo's defaults for the other unset fields too."""
    sample_rate: int
    samples_per_frame: int
    num_groups: int                          # vector_quantizer.num_groups
    levels: tuple[int, ...]                  # vector_quantizer.num_levels_per_group
    up_sample_rates: tuple[int, ...]
    base_channels: int
    in_kernel_size: int = 7
    out_kernel_size: int = 3
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[int, ...] = (1, 3, 5)
    output_activation: str = "clamp"
    grouped_upsample: bool = True            # n_groups_equal_to_out_channels

    @classmethod
    def from_yaml(cls, data: Any, where: str) -> "NanoCodecConfig":
        """From model_config.yaml's parsed contents; `where` names the file in errors."""
        if not isinstance(data, dict):
            raise CheckpointError(f"{where}: expected a YAML mapping, got {type(data).__name__}")
        f = ConfigFields(data, Path(where))
        dec = f.object("audio_decoder")
        vq = f.object("vector_quantizer")
        d = cls                          # the dataclass defaults, as class attributes
        target = dec.str("_target_")
        if target.rsplit(".", 1)[-1] != "CausalHiFiGANDecoder":
            # The non-causal HiFiGANDecoder pads both sides: windows would not decode exactly.
            dec.fail("_target_", f"is {target!r}; only NeMo's CausalHiFiGANDecoder is supported")
        if vq.str("_target_").rsplit(".", 1)[-1] != "GroupFiniteScalarQuantizer":
            vq.fail("_target_", "must be NeMo's GroupFiniteScalarQuantizer")
        config = cls(
            sample_rate=f.int("sample_rate", low=1),
            samples_per_frame=f.int("samples_per_frame", low=1),
            num_groups=vq.int("num_groups", low=1),
            levels=vq.ints("num_levels_per_group"),
            up_sample_rates=dec.ints("up_sample_rates", (8, 8, 2, 2)),
            base_channels=dec.int("base_channels", 512, low=1),
            in_kernel_size=dec.int("in_kernel_size", d.in_kernel_size, low=1),
            out_kernel_size=dec.int("out_kernel_size", d.out_kernel_size, low=1),
            resblock_kernel_sizes=dec.ints("resblock_kernel_sizes", d.resblock_kernel_sizes),
            resblock_dilation_sizes=dec.ints("resblock_dilation_sizes", d.resblock_dilation_sizes),
            output_activation=dec.str("output_activation", "tanh", choices=("clamp", "tanh")),
            grouped_upsample=dec.bool("n_groups_equal_to_out_channels", True),
        )
        # NeMo's default activation is lrelu (no parameters); the codec is trained with
        # half_snake, the only one built here.
        if (activation := dec.str("activation", "lrelu")) != "half_snake":
            dec.fail("activation", f"is {activation!r}; only half_snake is supported")
        # Zero left padding is what makes the decoder causal and windows exact.
        dec.str("pad_mode", "zeros", choices=("zeros",))
        if not config.levels or min(config.levels) < 2:
            vq.fail("num_levels_per_group", f"must be a non-empty list of levels >= 2, got {list(config.levels)}")
        if dec.int("input_dim") != config.codes_per_frame:
            dec.fail("input_dim", f"must be num_groups x len(num_levels_per_group) = {config.codes_per_frame}")
        if not config.up_sample_rates or min(config.up_sample_rates) < 1:
            dec.fail("up_sample_rates", "must be a non-empty list of positive rates")
        if math.prod(config.up_sample_rates) != config.samples_per_frame:
            dec.fail("up_sample_rates", f"multiply to {math.prod(config.up_sample_rates)}, "
                     f"not samples_per_frame ({config.samples_per_frame})")
        if config.base_channels % 2 ** len(config.up_sample_rates):
            # Each up-sampler halves the channels, two inputs per output channel.
            dec.fail("base_channels", f"must be divisible by 2^{len(config.up_sample_rates)}")
        for name, values in (("resblock_kernel_sizes", config.resblock_kernel_sizes),
                             ("resblock_dilation_sizes", config.resblock_dilation_sizes)):
            if not values or min(values) < 1:
                dec.fail(name, "must be a non-empty list of positive integers")
        return config

    @property
    def codes_per_frame(self) -> int:
        return self.num_groups * len(self.levels)

    @property
    def code_levels(self) -> tuple[int, ...]:
        """The number of levels of each of the codes_per_frame codes, group-major."""
        return self.levels * self.num_groups

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.samples_per_frame

    def channels(self, stage: int) -> int:
        """Channels after `stage` up-samplers (0: the input conv's output)."""
        return self.base_channels >> stage

    @property
    def context_frames(self) -> int:
        """Frames of left context a window needs to decode its newer frames exactly as the
        whole utterance does. Walking forward from the window's first frame: where does each
        layer's output stop depending on what came before the window (positions at that
        layer's rate)? A causal conv (kernel k, dilation d) moves that point (k - 1) d later;
        a transposed conv (kernel 2r, stride r) maps point e to e r + r (its output m sums
        inputs down to (m - 2r + 1) / r); a residual layer adds its longest chain (input and
        skip conv of each block). The first exact sample, rounded up to whole frames: at the
        released rates and kernels 25440 samples, 25 frames (vLLM-Omni's 8-frame lookback
        only approximates the whole decode)."""
        chains = max((k - 1) * (sum(self.resblock_dilation_sizes) + len(self.resblock_dilation_sizes))
                     for k in self.resblock_kernel_sizes)
        first = self.in_kernel_size - 1
        for rate in self.up_sample_rates:
            first = first * rate + rate + chains
        first += self.out_kernel_size - 1
        return math.ceil(first / self.samples_per_frame)


# --- decoder -------------------------------------------------------------------------------

class _Alpha(nn.Module):
    """Snake's per-channel frequency (NeMo's Snake module: only its parameter is needed)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))


class _HalfSnake(nn.Module):
    """Snake x + sin^2(alpha x) / alpha on the first C // 2 channels, LeakyReLU on the rest."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.snake_act = _Alpha(channels // 2)

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.snake_act.alpha
        split = alpha.shape[1]
        snake = x[:, :split]
        snake = snake + (alpha + SNAKE_EPS).reciprocal() * torch.sin(alpha * snake).square()
        return torch.cat([snake, F.leaky_relu(x[:, split:], LRELU_SLOPE)], dim=1)


class _Activation(nn.Module):
    """NeMo's CodecActivation wrapper, kept for its parameter names (`activation.snake_act.alpha`)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.activation = _HalfSnake(channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(x)


class _CausalConv(nn.Module):
    """Stride-1 Conv1d after (k - 1) d zeros on the left: same length, no look-ahead."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation)
        self.pad = (kernel - 1) * dilation

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (self.pad, 0)))


class _CausalUpsample(nn.Module):
    """ConvTranspose1d (kernel 2r, stride r) keeping the first T r outputs: the k - r cut on
    the right are the parts the next frame's input would add to."""

    def __init__(self, c_in: int, c_out: int, rate: int, grouped: bool) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, 2 * rate, stride=rate, groups=c_out if grouped else 1)
        self.rate = rate

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)[..., :x.shape[-1] * self.rate]


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.input_activation = _Activation(channels)
        self.input_conv = _CausalConv(channels, channels, kernel, dilation)
        self.skip_activation = _Activation(channels)
        self.skip_conv = _CausalConv(channels, channels, kernel)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.skip_conv(self.skip_activation(self.input_conv(self.input_activation(x))))


class _ResidualChain(nn.Module):
    """One kernel size's blocks, one per dilation, in sequence (NeMo's HiFiGANResBlock)."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.res_blocks = nn.ModuleList(_ResidualBlock(channels, kernel, d) for d in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.res_blocks:
            x = block(x)
        return x


class _ResidualLayer(nn.Module):
    """The mean of one chain per kernel size over the same input (NeMo's HiFiGANResLayer)."""

    def __init__(self, channels: int, kernels: tuple[int, ...], dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.res_blocks = nn.ModuleList(_ResidualChain(channels, k, dilations) for k in kernels)

    def forward(self, x: Tensor) -> Tensor:
        # Summed one chain at a time (not stacked): one chain's output alive at once.
        total = self.res_blocks[0](x)
        for chain in self.res_blocks[1:]:
            total = total + chain(x)
        return total / len(self.res_blocks)


class NanoCodecDecoder(nn.Module):
    """Per-dimension FSQ codes -> audio: NeMo's AudioCodecModel.decode_audio on the
    dequantized codes, under the archive's `audio_decoder.` parameter names."""

    def __init__(self, config: NanoCodecConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.pre_conv = _CausalConv(c.codes_per_frame, c.base_channels, c.in_kernel_size)
        self.activations = nn.ModuleList()
        self.up_sample_conv_layers = nn.ModuleList()
        self.res_layers = nn.ModuleList()
        for stage, rate in enumerate(c.up_sample_rates):
            c_in, c_out = c.channels(stage), c.channels(stage + 1)
            self.activations.append(_Activation(c_in))
            self.up_sample_conv_layers.append(_CausalUpsample(c_in, c_out, rate, c.grouped_upsample))
            self.res_layers.append(_ResidualLayer(c_out, c.resblock_kernel_sizes, c.resblock_dilation_sizes))
        last = c.channels(len(c.up_sample_rates))
        self.post_activation = _Activation(last)
        self.post_conv = _CausalConv(last, 1, c.out_kernel_size)
        # Integers, so that .double() / .half() leave them exact; not in the state dict (the
        # archive's quantizer buffers are checked against the config when it is read).
        self.register_buffer("code_levels", torch.tensor(c.code_levels), persistent=False)

    def load_nemo_state(self, state: dict[str, Tensor], what: str = "NanoCodec weights") -> "NanoCodecDecoder":
        """Load the `audio_decoder.*` tensors of an archive's state dict (others ignored),
        weight norm folded, strictly: CheckpointError names every missing, unexpected or
        wrongly shaped tensor."""
        ours = {k[len(DECODER_PREFIX):]: v for k, v in state.items() if k.startswith(DECODER_PREFIX)}
        if not ours:
            raise CheckpointError(f"{what}: no {DECODER_PREFIX}* tensors")
        load_strict(self, fold_weight_norm(ours, what), f"{what} ({DECODER_PREFIX}*)")
        return self

    @classmethod
    def from_nemo(cls, path: str | Path, device: str | torch.device = "cpu",
                  dtype: torch.dtype = torch.float32) -> "NanoCodecDecoder":
        """The decoder of a .nemo archive, in eval mode."""
        config, state = read_nemo_codec(path)
        decoder = cls(config).load_nemo_state(state, str(path))
        return decoder.to(device=device, dtype=dtype).eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.pre_conv.conv.weight.dtype

    def dequantize(self, codes: Tensor) -> Tensor:
        """codes [B, codes_per_frame, T] (code d of a frame in [0, levels[d])) -> the
        decoder's input [B, codes_per_frame, T] in [-1, 1], in the decoder's dtype."""
        c = self.config
        if codes.ndim != 3 or codes.shape[1] != c.codes_per_frame:
            raise ValueError(f"codes must be [batch, {c.codes_per_frame}, frames], got {tuple(codes.shape)}")
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise ValueError(f"codes must be integers, got {codes.dtype}")
        levels = self.code_levels.view(1, -1, 1)
        codes = codes.to(levels.device)
        bad = (codes < 0) | (codes >= levels)
        if bool(bad.any()):
            dim = int(bad.nonzero()[0, 1])
            raise ValueError(f"code {dim} out of range [0, {c.code_levels[dim]})")
        # At least fp32 (NeMo dequantizes in fp32), then the decoder's dtype.
        work = torch.promote_types(self.dtype, torch.float32)
        half = (levels // 2).to(work)
        return ((codes.to(work) - half) / half).to(self.dtype)

    def decode_latents(self, latents: Tensor) -> Tensor:
        """latents [B, codes_per_frame, T] -> audio [B, T * samples_per_frame]."""
        if latents.shape[-1] == 0:       # the convs cannot take an empty input
            return latents.new_zeros(latents.shape[0], 0)
        x = self.pre_conv(latents)
        for activation, upsample, res_layer in zip(self.activations, self.up_sample_conv_layers, self.res_layers):
            x = res_layer(upsample(activation(x)))
        x = self.post_conv(self.post_activation(x))[:, 0]
        return x.clamp(-1.0, 1.0) if self.config.output_activation == "clamp" else torch.tanh(x)

    @torch.inference_mode()
    def decode_codes(self, codes: Tensor) -> Tensor:
        """codes [B, codes_per_frame, T] (LongTensor, per-dimension FSQ codes, group-major)
        -> audio [B, T * samples_per_frame] in the decoder's dtype."""
        return self.decode_latents(self.dequantize(codes))

    @torch.inference_mode()
    def decode_window(self, codes: Tensor, left_context: int) -> Tensor:
        """The audio of a window's frames after its first `left_context` (context only):
        what a whole decode gives those frames when left_context >= config.context_frames
        or the window starts at the utterance's first frame."""
        return self.decode_codes(codes)[:, left_context * self.config.samples_per_frame:]


# --- archive -------------------------------------------------------------------------------

def _member_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name


def read_nemo_codec(path: str | Path) -> tuple[NanoCodecConfig, dict[str, Tensor]]:
    """A .nemo archive's config and state dict (every tensor, by NeMo's names; the
    encoder's and any training-only ones included). The archive is opened with tarfile
    (plain or compressed), the config with yaml.safe_load, the weights with a weights_only
    torch.load (tensors and plain containers, never code). Errors are CheckpointError
    naming the file and the member."""
    config, state = _read_nemo(Path(path), weights=True)
    assert state is not None
    return config, state


def read_nemo_config(path: str | Path) -> NanoCodecConfig:
    """Only a .nemo archive's config, its weights left unread (a few hundred MB at the
    released size): enough to plan chunks by context_frames. Errors as read_nemo_codec's."""
    return _read_nemo(Path(path), weights=False)[0]


def _read_nemo(path: Path, weights: bool) -> tuple[NanoCodecConfig, dict[str, Tensor] | None]:
    import yaml

    if not path.is_file():
        raise CheckpointError(f"{path}: NanoCodec .nemo archive not found")
    try:
        tar = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as exc:
        raise CheckpointError(f"{path}: not a .nemo archive (a tar file): {exc}") from None
    with tar:
        members = {_member_name(m.name): m for m in tar.getmembers() if m.isfile()}
        missing = [name for name in (CONFIG_MEMBER, WEIGHTS_MEMBER) if name not in members]
        if missing:
            raise CheckpointError(f"{path}: {' and '.join(missing)} missing from the .nemo archive "
                                  f"(it holds: {', '.join(sorted(members)) or 'no files'})")
        where = f"{path}:{CONFIG_MEMBER}"
        try:
            data = yaml.safe_load(tar.extractfile(members[CONFIG_MEMBER]))
        except yaml.YAMLError as exc:
            raise CheckpointError(f"{where}: not readable YAML ({exc})") from None
        # The config first: a wrong one fails before hundreds of MB of weights are read.
        config = NanoCodecConfig.from_yaml(data, where)
        if not weights:
            return config, None
        where = f"{path}:{WEIGHTS_MEMBER}"
        try:
            state = torch.load(tar.extractfile(members[WEIGHTS_MEMBER]), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure is a bad member
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise CheckpointError(f"{where}: not a loadable torch state dict "
                                  f"({type(exc).__name__}: {first_line})") from None
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise CheckpointError(f"{where}: expected a non-empty dict of tensors by name, got {type(state).__name__}")
    _check_quantizer(state, config, where)
    return config, state


def _check_quantizer(state: dict[str, Tensor], config: NanoCodecConfig, where: str) -> None:
    """The quantizer's buffers, where present, must say what the config says: they are the
    only other record of the levels the codes were trained with."""
    for group in range(config.num_groups):
        key = f"vector_quantizer.fsqs.{group}.num_levels"
        if key in state and state[key].flatten().tolist() != list(config.levels):
            raise CheckpointError(f"{where}: {key} is {state[key].flatten().tolist()}, but "
                                  f"num_levels_per_group is {list(config.levels)}")


# --- random archives (tests, benchmarks) ---------------------------------------------------

# model_config.yaml as the released archive has it (resolved values; training-only sections,
# e.g. the discriminator and the losses, left out). tiny keeps the rates, kernels and levels
# (so the same context_frames) with 96 decoder channels (864 released) and a 4-channel
# encoder (24 released).
_SIZES = {"tiny": (96, 4), "released": (864, 24)}


def nemo_model_config(size: str = "released") -> dict[str, Any]:
    """The model_config.yaml contents write_random_nemo_codec writes for `size`."""
    decoder_channels, encoder_channels = _SIZES[size]
    modules = "nemo.collections.tts.modules.audio_codec_modules."
    return {
        "target": "nemo.collections.tts.models.audio_codec.AudioCodecModel",
        "sample_rate": 22050,
        "samples_per_frame": 1024,
        "audio_encoder": {
            "_target_": modules + "HiFiGANEncoder", "down_sample_rates": [2, 2, 4, 8, 8],
            "encoded_dim": 32, "base_channels": encoder_channels, "activation": "lrelu",
            "pad_mode": "replicate"},
        "audio_decoder": {
            "_target_": modules + "CausalHiFiGANDecoder", "up_sample_rates": [8, 8, 4, 2, 2],
            "input_dim": 32, "base_channels": decoder_channels, "activation": "half_snake",
            "output_activation": "clamp", "pad_mode": "zeros", "n_groups_equal_to_out_channels": True},
        "vector_quantizer": {
            "_target_": modules + "GroupFiniteScalarQuantizer", "num_groups": 8,
            "num_levels_per_group": [8, 7, 6, 6]},
    }


def _weight_normed(module: nn.Module) -> nn.Module:
    """Every conv of `module` weight-normed as NeMo trains them, so that the state dict has
    the archive's names (parametrizations.weight.original0/1)."""
    for m in list(module.modules()):
        if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)):
            nn.utils.parametrizations.weight_norm(m)
    return module


def _encoder_skeleton(data: dict[str, Any]) -> nn.Module:
    """NeMo's HiFiGANEncoder's convs under its names (lrelu has no parameters): only names
    and shapes matter, nothing here runs."""
    def conv(c_in: int, c_out: int, kernel: int) -> nn.Module:
        holder = nn.Module()
        holder.conv = nn.Conv1d(c_in, c_out, kernel)
        return holder

    enc = nn.Module()
    channels = data["base_channels"]
    enc.pre_conv = conv(1, channels, 7)
    enc.res_layers, enc.down_sample_conv_layers = nn.ModuleList(), nn.ModuleList()
    for rate in data["down_sample_rates"]:
        layer = nn.Module()
        layer.res_blocks = nn.ModuleList()
        for kernel in (3, 7, 11):
            chain = nn.Module()
            chain.res_blocks = nn.ModuleList()
            for _ in (1, 3, 5):
                block = nn.Module()
                block.input_conv, block.skip_conv = conv(channels, channels, kernel), conv(channels, channels, kernel)
                chain.res_blocks.append(block)
            layer.res_blocks.append(chain)
        enc.res_layers.append(layer)
        enc.down_sample_conv_layers.append(conv(channels, 2 * channels, 2 * rate))
        channels *= 2
    enc.post_conv = conv(channels, data["encoded_dim"], 7)
    return enc


def random_nemo_state(size: str = "tiny", seed: int = 0) -> dict[str, Tensor]:
    """Random weights under the archive's names (audio_encoder.*, audio_decoder.*,
    vector_quantizer.* buffers). Values from random_weights.randomize, except where the
    decoder would otherwise go silent or saturate: weight-norm magnitudes g (each output's
    weight norm) 0.8-1.2, keeping every conv near unit gain, 0.3 on each residual block's
    closing conv (15 chained blocks add up), 0.3 on the output conv (audio a few tenths
    before the clamp); snake alphas 0.5-1.5 (trained ones are positive, the term divides
    by them)."""
    from ...weights.random_weights import randomize

    data = nemo_model_config(size)
    config = NanoCodecConfig.from_yaml(data, f"{size} model_config.yaml")
    gen = torch.Generator().manual_seed(seed)
    state = {}
    with torch.device("meta"):          # names and shapes only: nothing allocated
        parts = {"audio_decoder.": _weight_normed(NanoCodecDecoder(config)),
                 "audio_encoder.": _weight_normed(_encoder_skeleton(data["audio_encoder"]))}
    for prefix, module in parts.items():
        for key, value in randomize(module, gen).items():
            if key.endswith(".original0"):
                quiet = prefix == "audio_decoder." and (".skip_conv." in key or key.startswith("post_conv."))
                scale = 0.3 if quiet else 1.0
                value = scale * (0.8 + 0.4 * torch.rand(value.shape, generator=gen))
            elif key.endswith(".alpha"):
                value = 0.5 + torch.rand(value.shape, generator=gen)
            state[prefix + key] = value
    # NeMo's FSQ buffers: levels and mixed-radix bases per dimension, int32, [1, D, 1].
    bases = [math.prod(config.levels[:d]) for d in range(len(config.levels))]
    for group in range(config.num_groups):
        fsq = f"vector_quantizer.fsqs.{group}."
        state[fsq + "num_levels"] = torch.tensor(config.levels, dtype=torch.int32).view(1, -1, 1)
        state[fsq + "dim_base_index"] = torch.tensor(bases, dtype=torch.int32).view(1, -1, 1)
    return state


def write_nemo_archive(path: str | Path, model_config: dict[str, Any], state: dict[str, Tensor]) -> Path:
    """A .nemo archive as NeMo writes one: an uncompressed tar of ./model_config.yaml and
    ./model_weights.ckpt (a torch.save'd state dict) under a "." directory entry. Written
    under a temporary name, then renamed into place."""
    import yaml

    path = Path(path)
    weights = io.BytesIO()
    torch.save(state, weights)
    members = {CONFIG_MEMBER: yaml.safe_dump(model_config, sort_keys=False).encode(),
               WEIGHTS_MEMBER: weights.getvalue()}
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with tarfile.open(tmp, "w") as tar:
        folder = tarfile.TarInfo(".")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for name, payload in members.items():
            info = tarfile.TarInfo("./" + name)
            info.size, info.mode = len(payload), 0o644
            tar.addfile(info, io.BytesIO(payload))
    tmp.replace(path)
    return path


def write_random_nemo_codec(path: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    """A random NanoCodec .nemo archive in the released layout (random_nemo_state's
    weights, nemo_model_config's yaml). `path` is the file, or a folder to write the
    released file name into. tiny: 96 decoder channels (a 50-frame decode well under a
    second on a CPU); released: the real sizes (~250 MB)."""
    if size not in _SIZES:
        raise ValueError(f"size must be one of {sorted(_SIZES)}, got {size!r}")
    path = Path(path)
    if path.is_dir():
        path = path / RELEASED_NAME
    return write_nemo_archive(path, nemo_model_config(size), random_nemo_state(size, seed))
