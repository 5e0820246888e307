"""AuK's VAE (ours): BigVGAN-flow codec between 24 kHz mono audio and 50 Hz latents.

  encode   waveform [B, T] -> a stack of weight-normed strided convs (rates 2,2,2,3,4,5, each
           followed by a six-deep dilated residual stack) -> per frame a posterior mean and
           log-std -> the mean (or a draw from the posterior) -> normalised by the release's
           global statistics -> latents [B, T / 480, 64].
  decode   latents [B, N, 64] -> de-normalised -> a centred k7 conv -> per up-sample rate a
           causal transposed conv (kernel 2r, the r-sample overhang cut) and the mean of
           parallel AMP blocks (anti-aliased snake + causal dilated convs) -> anti-aliased
           snake, a causal k7 conv to one channel, clamp to [-1, 1] -> [B, N * 480].

The state-dict names are the release's (vae.safetensors), so after weight norm is folded the
file loads strictly; the release keeps the legacy weight_g / weight_v pairs and training-only
flow.* tensors (a residual coupling flow for the KL term), which load_vae skips.

Streaming: the decoder is causal except for conv_pre (3 frames either side) and the
anti-aliased activations, whose centred up-sampling filter looks 2 samples ahead at every
rate. decoder_reach() walks the decoder backwards to find how many latent frames of left
context and right lookahead a window needs to reproduce the whole decode (released: 52 and 7);
decode_range() / decode_chunks() decode windows with that margin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import (
    CheckpointError, ConfigFields, fold_weight_norm, load_strict, read_tensors)

WEIGHTS_FILE = "vae.safetensors"
TRAINING_ONLY_PREFIX = "flow."
SAMPLE_RATE = 24000

# The anti-aliased activation's geometry is not in model_init_kwargs: the release always
# oversamples by 2 with 12-tap Kaiser-sinc filters.
OVERSAMPLE = 2
FILTER_TAPS = 12
SNAKE_EPS = 1e-9
# Encoder slopes: 0.2 between stages; the residual stacks use torch's default 0.01.
STAGE_SLOPE = 0.2
STACK_SLOPE = 0.01
STACK_DEPTH = 6            # dilations 1, 2, 4, ..., 32 with kernel 3
PROJ_KERNEL = 3            # the encoder's first and last convs
PRE_KERNEL = 7             # conv_pre (centred) and conv_post (causal)

# model_init_kwargs the release carries for training only.
IGNORED_INIT_KWARGS = frozenset({"flow_hidden_channels"})

# Streaming plan (decode_chunks, the auk_vae stage): a small first chunk so audio starts
# early, then each chunk twice the one before, up to CHUNK_FRAMES: few chunks, so the context
# each decodes again stays a small overhead.
FIRST_CHUNK_FRAMES = 10
CHUNK_FRAMES = 200


# --- config ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class VAEConfig:
    """model_init_kwargs of the release (defaults are the released values)."""
    upsample_rates: tuple[int, ...] = (5, 4, 3, 2, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (10, 8, 6, 4, 4, 4)
    upsample_initial_channel: int = 1536
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5),) * 3
    downsample_rates: tuple[int, ...] = (2, 2, 2, 3, 4, 5)
    downsample_channels: tuple[int, ...] = (12, 24, 48, 96, 192, 384, 768)
    snake_logscale: bool = True
    latent_dim: int = 64

    @property
    def hop(self) -> int:
        return math.prod(self.upsample_rates)

    def channels(self, stage: int) -> int:
        """Decoder width after `stage` up-samplings (each halves it)."""
        return self.upsample_initial_channel >> stage

    @classmethod
    def from_init_kwargs(cls, kwargs: Mapping, source: str | Path = "model_init_kwargs") -> "VAEConfig":
        """Checked model_init_kwargs; errors are CheckpointError naming `source` and the field.
        Only the released variant is built: use_vae, causal and act_causal must be true (the
        streaming plan below is derived for causal convs and causal decimation)."""
        # Tuples (a Python caller's) read as the JSON lists ConfigFields expects.
        f = ConfigFields({k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}, Path(source))
        known = {name for name in cls.__dataclass_fields__} | {"use_vae", "causal", "act_causal", "sample_rate"}
        unknown = sorted(set(kwargs) - known - IGNORED_INIT_KWARGS)
        if unknown:
            raise CheckpointError(f"{source}: unknown VAE init kwargs {unknown}")
        for flag in ("use_vae", "causal", "act_causal"):
            if not f.bool(flag, True):
                f.fail(flag, "must be true (only the released causal VAE is supported)")
        if f.int("sample_rate", SAMPLE_RATE) != SAMPLE_RATE:
            f.fail("sample_rate", f"must be {SAMPLE_RATE}")
        d = cls()
        dilations = kwargs.get("resblock_dilation_sizes", d.resblock_dilation_sizes)
        if not isinstance(dilations, (list, tuple)) or not all(
                isinstance(row, (list, tuple)) and row and all(isinstance(x, int) and x > 0 for x in row)
                for row in dilations):
            f.fail("resblock_dilation_sizes", f"must be a list of lists of positive integers, got {dilations!r}")
        config = cls(upsample_rates=f.ints("upsample_rates", d.upsample_rates),
                     upsample_kernel_sizes=f.ints("upsample_kernel_sizes", d.upsample_kernel_sizes),
                     upsample_initial_channel=f.int("upsample_initial_channel", d.upsample_initial_channel, 1),
                     resblock_kernel_sizes=f.ints("resblock_kernel_sizes", d.resblock_kernel_sizes),
                     resblock_dilation_sizes=tuple(tuple(row) for row in dilations),
                     downsample_rates=f.ints("downsample_rates", d.downsample_rates),
                     downsample_channels=f.ints("downsample_channels", d.downsample_channels),
                     snake_logscale=f.bool("snake_logscale", d.snake_logscale),
                     latent_dim=f.int("latent_dim", d.latent_dim, 1))
        if len(config.upsample_kernel_sizes) != len(config.upsample_rates) or any(
                k != 2 * r for k, r in zip(config.upsample_kernel_sizes, config.upsample_rates)):
            f.fail("upsample_kernel_sizes", "must be twice each upsample rate (the causal transposed conv)")
        if len(config.resblock_dilation_sizes) != len(config.resblock_kernel_sizes):
            f.fail("resblock_dilation_sizes", "needs one row per resblock kernel size")
        if len(config.downsample_channels) != len(config.downsample_rates) + 1:
            f.fail("downsample_channels", "needs one more entry than downsample_rates")
        if math.prod(config.downsample_rates) != config.hop:
            f.fail("downsample_rates", f"must multiply to the decoder's hop {config.hop}")
        if config.upsample_initial_channel % (1 << len(config.upsample_rates)):
            f.fail("upsample_initial_channel", "must halve evenly at every up-sampling")
        return config


# --- building blocks ------------------------------------------------------------------------

def kaiser_sinc_taps(taps: int, cutoff: float, half_width: float) -> Tensor:
    """A [1, 1, taps] low-pass FIR: an ideal low-pass (sinc) at `cutoff` cycles per sample,
    truncated by a Kaiser window whose beta is Kaiser's empirical choice for the stop-band
    attenuation a transition band of 2 * `half_width` affords with this many taps; scaled to
    unit DC gain so a constant passes unchanged. (The release stores these as buffers; this
    only fills a freshly built module.)"""
    attenuation = 2.285 * (taps // 2 - 1) * math.pi * 4 * half_width + 7.95
    if attenuation > 50:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21)
    else:
        beta = 0.0
    centre = torch.arange(taps, dtype=torch.float64) - (taps - 1) / 2     # half-integers when even
    ideal = 2 * cutoff * torch.sinc(2 * cutoff * centre)
    fir = ideal * torch.kaiser_window(taps, periodic=False, beta=beta, dtype=torch.float64)
    return (fir / fir.sum()).float().view(1, 1, taps)


class _Filter(nn.Module):
    """Holds one FIR as the buffer `filter` (the release's name for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("filter", kaiser_sinc_taps(FILTER_TAPS, 0.5 / OVERSAMPLE, 0.6 / OVERSAMPLE))


class _Decimator(nn.Module):
    """Only a name holder: the release keeps the decimation filter at `downsample.lowpass.filter`."""

    def __init__(self) -> None:
        super().__init__()
        self.lowpass = _Filter()


class _SnakeBeta(nn.Module):
    """x + sin^2(a x) / b per channel, a = exp(alpha) and b = exp(beta) when log-scaled."""

    def __init__(self, channels: int, logscale: bool) -> None:
        super().__init__()
        self.logscale = logscale
        self.alpha = nn.Parameter(torch.zeros(channels) if logscale else torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels) if logscale else torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:
        a, b = (self.alpha.exp(), self.beta.exp()) if self.logscale else (self.alpha, self.beta)
        # One reciprocal per channel instead of a division per sample.
        return x + (1.0 / (b + SNAKE_EPS))[:, None] * torch.sin(a[:, None] * x) ** 2


# Interpolation geometry: the input is edge-extended by `_UP_EXTEND` samples (replicate) so
# the 12-tap filter sees plausible signal at the ends; the transposed conv's output is then
# cut by `_UP_CUT` on each side, which centres the filter (it is symmetric) on the input.
_UP_EXTEND = FILTER_TAPS // OVERSAMPLE - 1
_UP_CUT = (_UP_EXTEND * OVERSAMPLE + (FILTER_TAPS - OVERSAMPLE) // 2,
           _UP_EXTEND * OVERSAMPLE + (FILTER_TAPS - OVERSAMPLE + 1) // 2)


class _AntiAliasedSnake(nn.Module):
    """Snake at twice the sample rate: interpolate, apply, low-pass and decimate, so the
    harmonics snake creates above the original Nyquist are filtered instead of aliasing.
    The decimation filter is causal (left edge replicated); the interpolation is centred,
    which is where the decoder's small per-activation lookahead comes from."""

    def __init__(self, channels: int, logscale: bool) -> None:
        super().__init__()
        self.act = _SnakeBeta(channels, logscale)
        self.upsample = _Filter()
        self.downsample = _Decimator()

    def forward(self, x: Tensor) -> Tensor:
        channels = x.shape[1]
        up_fir = self.upsample.filter.expand(channels, -1, -1)
        up = F.conv_transpose1d(F.pad(x, (_UP_EXTEND, _UP_EXTEND), mode="replicate"), up_fir,
                                stride=OVERSAMPLE, groups=channels)
        # Zero-stuffing spreads the energy over OVERSAMPLE samples; the gain restores it.
        up = OVERSAMPLE * up[..., _UP_CUT[0]:up.shape[-1] - _UP_CUT[1]]
        y = F.pad(self.act(up), (FILTER_TAPS - 1, 0), mode="replicate")
        down_fir = self.downsample.lowpass.filter.expand(channels, -1, -1)
        return F.conv1d(y, down_fir, stride=OVERSAMPLE, groups=channels)


class _CausalConv(nn.Conv1d):
    """A conv that sees only the present and the past: zeros on the left, none on the right."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, bias: bool = True) -> None:
        super().__init__(c_in, c_out, kernel, dilation=dilation, bias=bias)
        self.history = dilation * (kernel - 1)

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(F.pad(x, (self.history, 0)), self.weight, self.bias)


class _CausalUpsample(nn.ConvTranspose1d):
    """Transposed conv, kernel 2r, stride r: each input frame writes 2r samples, so output
    sample t mixes frames t // r and t // r - 1. The last frame's second half would overlap a
    frame not yet seen; dropping it keeps the output exactly r samples per input frame."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x)[..., :x.shape[-1] * self.stride[0]]


class _AmpBlock(nn.Module):
    """Residual pairs (snake, dilated causal conv, snake, causal conv) for each dilation."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], logscale: bool) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(_CausalConv(channels, channels, kernel, d) for d in dilations)
        self.convs2 = nn.ModuleList(_CausalConv(channels, channels, kernel) for _ in dilations)
        # The release interleaves them: activation 2i precedes convs1[i], 2i + 1 convs2[i].
        self.activations = nn.ModuleList(_AntiAliasedSnake(channels, logscale) for _ in range(2 * len(dilations)))

    def forward(self, x: Tensor) -> Tensor:
        for i, (first, second) in enumerate(zip(self.convs1, self.convs2)):
            x = x + second(self.activations[2 * i + 1](first(self.activations[2 * i](x))))
        return x


class _Wrapped(nn.Module):
    """The release keeps each encoder conv one level down, under `layer`."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        self.layer = conv

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)


def _encoder_conv(c_in: int, c_out: int, kernel: int, stride: int = 1) -> _Wrapped:
    # (k - 1) // 2 zeros each side: a stride-r conv of kernel 2r then maps r * n samples to n.
    return _Wrapped(nn.Conv1d(c_in, c_out, kernel, stride=stride, padding=(kernel - 1) // 2))


class _DilatedStack(nn.Module):
    """Residual units, dilation doubling from 1: each is lrelu, k3 dilated conv, lrelu, k3 conv
    (indices 1 and 3 of `layers.i` are the convs, as the release names them)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LeakyReLU(STACK_SLOPE), nn.Conv1d(channels, channels, 3, dilation=2 ** i, padding=2 ** i),
                          nn.LeakyReLU(STACK_SLOPE), nn.Conv1d(channels, channels, 3, padding=1))
            for i in range(STACK_DEPTH))

    def forward(self, x: Tensor) -> Tensor:
        for unit in self.layers:
            x = x + unit(x)
        return x


class _Encoder(nn.Module):
    def __init__(self, config: VAEConfig) -> None:
        super().__init__()
        widths = config.downsample_channels
        # One flat Sequential, because the release numbers its tensors by position in it:
        # conv, lrelu, then (strided conv, residual stack, lrelu) per rate, then the head.
        layers: list[nn.Module] = [_encoder_conv(1, widths[0], PROJ_KERNEL), nn.LeakyReLU(STAGE_SLOPE)]
        for c_in, c_out, rate in zip(widths, widths[1:], config.downsample_rates):
            layers += [_encoder_conv(c_in, c_out, 2 * rate, rate), _DilatedStack(c_out), nn.LeakyReLU(STAGE_SLOPE)]
        layers.append(_encoder_conv(widths[-1], 2 * config.latent_dim, PROJ_KERNEL))
        self.generator = nn.Sequential(*layers)

    def forward(self, wav: Tensor) -> Tensor:
        return self.generator(wav)


# --- the VAE --------------------------------------------------------------------------------

class AuKVAE(nn.Module):
    """Plain weights (weight norm folded), fp32 numerics as the release's reference."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__()
        c = self.config = config or VAEConfig()
        self.hop = c.hop
        self.left_context_frames, self.lookahead_frames = decoder_reach(c)
        # The release's latent statistics. Despite its name, global_log_std is used as a
        # variance: latents are divided by its square root (kept as the release does it).
        self.register_buffer("global_mean", torch.zeros(c.latent_dim))
        self.register_buffer("global_log_std", torch.ones(c.latent_dim))
        self.audio_encoder = _Encoder(c)
        self.conv_pre = nn.Conv1d(c.latent_dim, c.channels(0), PRE_KERNEL, padding=PRE_KERNEL // 2)
        # Each stage's transposed conv sits alone in a Sequential: the release's `ups.<i>.0.*`.
        self.ups = nn.ModuleList(
            nn.Sequential(_CausalUpsample(c.channels(i), c.channels(i + 1), 2 * rate, stride=rate))
            for i, rate in enumerate(c.upsample_rates))
        self.resblocks = nn.ModuleList(
            _AmpBlock(c.channels(i + 1), kernel, dilations, c.snake_logscale)
            for i in range(len(c.upsample_rates))
            for kernel, dilations in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes))
        last = c.channels(len(c.upsample_rates))
        self.activation_post = _AntiAliasedSnake(last, c.snake_logscale)
        self.conv_post = _CausalConv(last, 1, PRE_KERNEL, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.conv_pre.weight.dtype

    # -- encode --

    @torch.inference_mode()
    def encode(self, wav: Tensor, sample: bool = False, generator: torch.Generator | None = None) -> Tensor:
        """wav [B, T] at 24 kHz -> normalised latents [B, T // 480, latent_dim], fp32: the
        posterior mean, or with `sample` mean + noise * exp(log_std), the noise drawn as one
        randn over [B, latent_dim, frames] from `generator` (on its device), as the release's
        pipeline draws it, so equal generators give equal latents."""
        if wav.ndim != 2:
            raise ValueError(f"encode expects a [batch, samples] waveform, got {tuple(wav.shape)}")
        moments = self.audio_encoder(wav[:, None].to(self.dtype)).float()
        mean, log_std = moments.chunk(2, dim=1)
        if sample:
            device = mean.device if generator is None else generator.device
            noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=device)
            mean = mean + noise.to(mean.device) * log_std.exp()
        return (mean.transpose(1, 2) - self.global_mean.float()) / self.global_log_std.float().sqrt()

    # -- decode --

    @torch.inference_mode()
    def decode(self, latents: Tensor) -> Tensor:
        """Normalised latents [B, N, latent_dim] -> audio [B, N * hop] in [-1, 1], in the
        module's dtype (the de-normalisation is fp32)."""
        if latents.ndim != 3 or latents.shape[-1] != self.config.latent_dim:
            raise ValueError(f"decode expects [batch, frames, {self.config.latent_dim}] latents, "
                             f"got {tuple(latents.shape)}")
        if latents.shape[1] == 0:
            return latents.new_zeros(latents.shape[0], 0, dtype=self.dtype)
        x = latents.float() * self.global_log_std.float().sqrt() + self.global_mean.float()
        x = self.conv_pre(x.transpose(1, 2).to(self.dtype))
        per_stage = len(self.config.resblock_kernel_sizes)
        for stage, up in enumerate(self.ups):
            x = up(x)
            branches = self.resblocks[stage * per_stage:(stage + 1) * per_stage]
            x = sum(block(x) for block in branches) / per_stage
        x = self.conv_post(self.activation_post(x))
        return x.clamp(-1.0, 1.0)[:, 0]

    def window(self, frames: int, start: int, end: int) -> tuple[int, int]:
        """The latent frames [lo, hi) whose decode holds frames [start, end) exactly."""
        if not 0 <= start < end <= frames:
            raise ValueError(f"frames [{start}, {end}) not within a sequence of {frames}")
        return max(0, start - self.left_context_frames), min(frames, end + self.lookahead_frames)

    def decode_range(self, latents: Tensor, start: int, end: int) -> Tensor:
        """The audio of latent frames [start, end) [B, (end - start) * hop], what decode(latents)
        gives those samples: a window with left_context_frames before and lookahead_frames
        after (clipped at the sequence's ends, where the whole decode sees the same edges)
        is decoded and cut."""
        lo, hi = self.window(latents.shape[1], start, end)
        audio = self.decode(latents[:, lo:hi])
        return audio[:, (start - lo) * self.hop:(end - lo) * self.hop]

    def decode_chunks(self, latents: Tensor, first: int = FIRST_CHUNK_FRAMES,
                      most: int = CHUNK_FRAMES) -> Iterator[Tensor]:
        """decode(latents) in pieces, in order, as chunk_bounds plans them."""
        for start, end in chunk_bounds(latents.shape[1], first, most):
            yield self.decode_range(latents, start, end)


# --- streaming plan -------------------------------------------------------------------------

def anti_aliased_reach() -> tuple[int, int]:
    """(past, future) input samples one _AntiAliasedSnake output depends on, by walking its
    taps: decimated output k reads interpolated samples 2k - 11 .. 2k (causal filter), and
    interpolated sample j reads the inputs whose zero-stuffed image falls under the centred
    filter. Released geometry: (8, 2)."""
    def inputs_of(j: int) -> range:
        # Interpolated j (after the cut) is transposed-conv output m = j + cut, which takes the
        # extended input i through tap m - OVERSAMPLE * i in [0, FILTER_TAPS).
        m = j + _UP_CUT[0]
        lo = -(-(m - FILTER_TAPS + 1) // OVERSAMPLE)
        return range(lo - _UP_EXTEND, m // OVERSAMPLE - _UP_EXTEND + 1)

    k = 100                                                  # any output far from the edges
    reads = [i for j in range(OVERSAMPLE * k - FILTER_TAPS + 1, OVERSAMPLE * k + 1) for i in inputs_of(j)]
    return k - min(reads), max(reads) - k


def decoder_reach(config: VAEConfig) -> tuple[int, int]:
    """(left context, lookahead) in latent frames for which a window's decode of its inner
    frames equals the whole decode. Walked backwards from the output, in samples at each
    stage's rate: the causal convs add history, every anti-aliased snake adds (8, 2), a
    parallel AMP stage adds its widest branch; a causal transposed conv of rate r maps b
    samples of history to ceil(b / r) + 1 inputs (its sample t mixes frames t // r and
    t // r - 1) and a samples of lookahead to ceil(a / r); conv_pre adds 3 frames each way."""
    act_past, act_future = anti_aliased_reach()
    past = (PRE_KERNEL - 1) + act_past                       # conv_post, activation_post
    future = act_future
    for stage in reversed(range(len(config.upsample_rates))):
        past += max(sum(2 * act_past + (k - 1) * (d + 1) for d in dilations)
                    for k, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes))
        future += max(2 * act_future * len(dilations) for dilations in config.resblock_dilation_sizes)
        rate = config.upsample_rates[stage]
        past, future = -(-past // rate) + 1, -(-future // rate)
    return past + PRE_KERNEL // 2, future + PRE_KERNEL // 2


def chunk_bounds(frames: int, first: int = FIRST_CHUNK_FRAMES, most: int = CHUNK_FRAMES) -> Iterator[tuple[int, int]]:
    """[start, end) latent frames per chunk: `first` frames, then each chunk twice the one
    before, up to `most` (the talkers' chunk_sizes with growth 2)."""
    from ...engine.vllm_talker import chunk_sizes

    if first < 1 or most < 1:
        raise ValueError(f"chunk sizes must be positive, got {first} and {most}")
    start = 0
    for size in chunk_sizes(most, first, growth=2):
        if start >= frames:
            return
        yield start, min(frames, start + size)
        start += size


# --- checkpoint -----------------------------------------------------------------------------

def _normed_convs(module: AuKVAE) -> list[str]:
    """Every conv of the release is weight-normed (the FIR filters are buffers, not convs)."""
    return [name for name, m in module.named_modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]


def load_vae(path: str | Path, init_kwargs: Mapping | VAEConfig, device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32) -> AuKVAE:
    """The VAE from a released vae.safetensors (and the model's model_init_kwargs), eval mode:
    flow.* (training only) skipped, weight norm folded (in float64), loaded strictly. A missing
    or unreadable file and any missing, unexpected or wrongly shaped tensor raise
    CheckpointError naming the file and the keys."""
    path = Path(path)
    config = init_kwargs if isinstance(init_kwargs, VAEConfig) else VAEConfig.from_init_kwargs(init_kwargs)
    if not path.is_file():
        raise CheckpointError(f"{path}: AuK VAE weights not found")
    tensors = read_tensors(path, "", skip=(TRAINING_ONLY_PREFIX,))
    if not tensors:
        raise CheckpointError(f"{path}: no AuK VAE tensors (only training-only {TRAINING_ONLY_PREFIX}* or none)")
    # fp32 before the fold, so the folded weights come out fp32 whatever the file's dtype.
    state = fold_weight_norm({k: v.float() for k, v in tensors.items()}, str(path))
    module = AuKVAE(config)
    load_strict(module, state, f"{path}")
    return module.to(device=device, dtype=dtype).eval()


def released_state_dict(module: AuKVAE, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """`module`'s weights in the release's layout: each conv weight w as (weight_g, weight_v)
    with v = w scaled by a random factor in [0.5, 2) per output slice and g = |w| per slice,
    so g != |v| and only a correct fold gives w back; buffers and snake parameters as they
    are; plus two flow.* tensors standing in for the training-only flow."""
    generator = generator or torch.Generator().manual_seed(0)
    normed = set(_normed_convs(module))
    out: dict[str, Tensor] = {}
    for name, tensor in module.state_dict().items():
        stem, _, leaf = name.rpartition(".")
        if leaf != "weight" or stem not in normed:
            out[name] = tensor.detach().clone()
            continue
        w = tensor.detach().double()
        shape = (-1,) + (1,) * (w.ndim - 1)
        scale = 0.5 + 1.5 * torch.rand(w.shape[0], generator=generator, dtype=torch.float64)
        out[stem + ".weight_v"] = (w * scale.view(shape)).to(tensor.dtype)
        out[stem + ".weight_g"] = w.flatten(1).norm(dim=1).view(shape).to(tensor.dtype)
    hidden = 8
    out[TRAINING_ONLY_PREFIX + "flows.0.pre.weight"] = 0.05 * torch.randn(hidden, module.config.latent_dim, 1,
                                                                          generator=generator)
    out[TRAINING_ONLY_PREFIX + "flows.0.pre.bias"] = torch.zeros(hidden)
    return out
