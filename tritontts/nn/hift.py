"""HiFT vocoder, 80-bin mel at 50 Hz -> 24 kHz audio, inference only, in its two variants.

HiFT = neural source filter + iSTFTNet (https://arxiv.org/abs/2309.09493). Per utterance:

  mel --ConvRNNF0Predictor--> f0 per frame
      --HarmonicNoiseSource--> one excitation signal at the audio rate (sines of f0 and its
                                harmonics where voiced, fixed noise everywhere)
  mel --conv_pre--> [leaky-relu, upsampling conv, + excitation STFT brought to this rate,
                     mean of residual blocks] per upsampling stage
      --conv_post--> log-magnitude + phase for a 16-point iSTFT --> audio

`HiFTGenerator(causal=True)` (the default) is CosyVoice3's CausalHiFTGenerator: every conv
is causal except conv_pre (4 frames of look-right) and the f0 predictor's first conv (3
frames), upsampling is nearest-neighbour + conv, the f0 path runs in float64, and the sine
phase is held per frame. Streaming re-runs it on all mel received so far with
`finalize=False`: the look-right frames then come from real mel instead of zero padding,
and only audio that later mel can no longer change is returned (see `stream_hift`).

`HiFTGenerator(causal=False)` is CosyVoice2's HiFTGenerator at 24 kHz, which GLM-TTS ships:
"same"-padded convs, transposed-conv upsampling, the f0 path in the model's dtype, the sine
phase interpolated linearly between frames and Gaussian noise. It has no streaming contract;
a caller that streams re-runs it on all mel so far and cross-fades (finalize=True only).

Both variants have the same module, parameter and buffer names, upstream's
(FunAudioLLM/CosyVoice cosyvoice/hifigan/generator.py, and cosyvoice/hifigan_cosy2 in
zai-org/GLM-TTS), so a released `hift.pt` loads with strict key matching through
`load_hift_state_dict`, which folds upstream's weight norm into plain weights.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.signal import get_window
from torch import Tensor, nn

from ..weights.checkpoint import CheckpointError
from ..weights.hyperpyyaml import kwargs_of

__all__ = [
    "CausalConv1d", "CausalDownsampleConv1d", "CausalUpsampleConv1d", "Snake", "ResBlock",
    "ConvRNNF0Predictor", "HarmonicNoiseSource", "HiFTGenerator",
    "load_hift_state_dict", "stream_hift", "spectrum_graph", "DEFAULT_NOISE_SEED",
]

# Upstream draws its noise tables from the global RNG when the module is built, so they are
# fixed per instance but differ between processes. A seeded table keeps "fixed per instance"
# (what makes a re-run on a longer mel reproduce the earlier samples) and adds "the same in
# every process and Triton instance".
DEFAULT_NOISE_SEED = 0
_NOISE_BLOCK_ROWS = 1 << 16    # noise is generated in seeded blocks of this many samples


class CausalConv1d(nn.Conv1d):
    """Stride-1 conv whose output has the input's length, padded on one side only.

    `side="left"`: output t sees inputs <= t (plain causal). `side="right"`: output t sees
    inputs t .. t + pad (look-right). `forward(x, context)` pads with `context` (the real
    frames beyond that side) instead of zeros when given.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int,
                 dilation: int = 1, side: str = "left") -> None:
        super().__init__(in_channels, out_channels, kernel_size, dilation=dilation)
        if side not in ("left", "right"):
            raise ValueError(f"side must be 'left' or 'right', not {side!r}")
        self.side = side
        self.pad = (kernel_size - 1) * dilation

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if context is None:
            context = x.new_zeros(x.shape[0], x.shape[1], self.pad)
        elif context.shape[2] != self.pad:
            raise ValueError(f"context has {context.shape[2]} frames, this conv needs {self.pad}")
        x = torch.cat([context, x] if self.side == "left" else [x, context], dim=2)
        return super().forward(x)


class CausalDownsampleConv1d(nn.Conv1d):
    """Strided conv (kernel 2*stride) after `stride - 1` zeros on the left: output t sees only
    inputs up to its own stride window's end."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__(in_channels, out_channels, 2 * stride, stride=stride)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(F.pad(x, (self.stride[0] - 1, 0)))


class CausalUpsampleConv1d(nn.Conv1d):
    """Nearest-neighbour upsampling by `rate`, then a left-padded stride-1 conv.

    Upstream's CausalConv1dUpsample. It replaces a transposed conv, whose output near the end
    would depend on later input frames."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, rate: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size)
        self.rate = rate

    def forward(self, x: Tensor) -> Tensor:
        x = x.repeat_interleave(self.rate, dim=2)
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


def _same_length_conv(in_channels: int, out_channels: int, kernel_size: int,
                      dilation: int = 1, causal: bool = True) -> nn.Conv1d:
    """A stride-1 conv keeping the length: left-padded if causal, else centred ("same")."""
    if causal:
        return CausalConv1d(in_channels, out_channels, kernel_size, dilation=dilation)
    return nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation,
                     padding=(kernel_size - 1) * dilation // 2)


class Snake(nn.Module):
    """Snake activation x + sin(alpha x)^2 / alpha, one trainable alpha per channel (linear
    scale, as CosyVoice's ResBlocks use it)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.alpha[None, :, None]
        # 1e-9 keeps a zero alpha finite; same operation order as upstream for equal bits.
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """HiFi-GAN residual block: per dilation d, x += conv(snake(conv_d(snake(x)))), causal or
    "same"-padded."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int],
                 causal: bool = True) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            _same_length_conv(channels, channels, kernel_size, d, causal) for d in dilations)
        self.convs2 = nn.ModuleList(
            _same_length_conv(channels, channels, kernel_size, 1, causal) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2,
                                            self.activations1, self.activations2):
            x = conv2(act2(conv1(act1(x)))) + x
        return x


class ConvRNNF0Predictor(nn.Module):
    """Mel [B, in_channels, T] -> f0 in Hz [B, T'] (five ELU convs and a linear head; |.|).

    causal=True (upstream's CausalConvRNNF0Predictor): the first conv (kernel 4) looks
    `look_right` (3) frames ahead, the others (kernel 3) look back only. With
    `finalize=False` the last `look_right` input frames only serve as that look-ahead, so
    T' = T - look_right; with `finalize=True` zeros stand in for frames past the end and
    T' = T. causal=False (upstream's ConvRNNF0Predictor): five centred kernel-3 convs,
    T' = T, finalize=True only.
    """

    def __init__(self, num_class: int = 1, in_channels: int = 80, cond_channels: int = 512,
                 causal: bool = True) -> None:
        super().__init__()
        self.num_class = num_class
        self.causal = causal
        first = (CausalConv1d(in_channels, cond_channels, 4, side="right") if causal
                 else _same_length_conv(in_channels, cond_channels, 3, causal=False))
        layers: list[nn.Module] = [first, nn.ELU()]
        for _ in range(4):
            layers += [_same_length_conv(cond_channels, cond_channels, 3, causal=causal),
                       nn.ELU()]
        # Sequential indices (ELUs at odd positions) give upstream's condnet.{0,2,4,6,8} keys.
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    @property
    def look_right(self) -> int:
        """Frames the causal variant's first conv looks ahead."""
        if not self.causal:
            raise ValueError("look_right is defined for the causal f0 predictor only")
        return self.condnet[0].pad

    def forward(self, mel: Tensor, finalize: bool = True) -> Tensor:
        first, *rest = self.condnet
        if finalize:
            x = first(mel)
        else:
            cut = mel.shape[2] - self.look_right
            x = first(mel[:, :, :cut], mel[:, :, cut:])
        for layer in rest:
            x = layer(x)
        return self.classifier(x.transpose(1, 2)).squeeze(-1).abs()


class _NoiseBank:
    """The fixed noise HarmonicNoiseSource uses, as a deterministic function of sample index.

    Upstream's causal SineGen2 keeps `rand_ini` (an initial phase per harmonic, the
    fundamental's forced to 0) and a [1, 300 s * 24 kHz, 9] table of U[0, 1) noise made
    once at construction and sliced from sample 0 on every call; that is what lets a re-run on
    a longer mel reproduce earlier samples. Here block b of the table comes from its own
    generator seeded by (seed, b), and blocks are made only when a call first needs them:
    same values whatever order or lengths calls come in, no 300 s limit, and no 260 MB up
    front. (Upstream's second table, SourceModuleHnNSF.uv, feeds only a noise output that
    inference discards, so it has no counterpart here.)

    `normal=True` gives N(0, 1) noise instead, the distribution of the non-causal SineGen2's
    torch.randn_like (its rand_ini is U[0, 1) as in the causal one).
    """

    def __init__(self, harmonics: int, seed: int, normal: bool = False) -> None:
        self.harmonics = harmonics
        self.seed = seed
        self.normal = normal
        gen = torch.Generator().manual_seed(seed)
        rand_ini = torch.rand(1, harmonics, generator=gen, device="cpu")   # host noise, whatever the default device
        rand_ini[:, 0] = 0
        self.rand_ini = rand_ini
        self._table = torch.empty(1, 0, harmonics, device="cpu")

    def _block(self, index: int) -> Tensor:
        # Distinct seeds per (seed, block); the +1 keeps block 0 apart from rand_ini's stream.
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + index + 1) % (1 << 63))
        draw = torch.randn if self.normal else torch.rand
        return draw(_NOISE_BLOCK_ROWS, self.harmonics, generator=gen, device="cpu")

    def sine_noise(self, length: int, device: torch.device) -> Tensor:
        """The noise of samples 0 .. length-1: [1, length, harmonics], float32."""
        table = self._table
        if table.shape[1] < length:
            # Grow at least geometrically so a long stream copies the table O(log n) times.
            want = max(length, 2 * table.shape[1])
            have_blocks = table.shape[1] // _NOISE_BLOCK_ROWS
            new_blocks = [self._block(b) for b in
                          range(have_blocks, -(-want // _NOISE_BLOCK_ROWS))]
            table = torch.cat([table.cpu(), torch.cat(new_blocks)[None]], dim=1)
        if table.device != device:
            table = table.to(device)
        self._table = table    # one assignment: concurrent readers keep a consistent table
        return table[:, :length]


class HarmonicNoiseSource(nn.Module):
    """f0 per frame -> the NSF excitation at the audio rate, [B, 1, T * samples_per_frame].

    Upstream's SourceModuleHnNSF with SineGen2 (the 24 kHz variant). Sines of f0 and
    `nb_harmonics` overtones, their phase accumulated per frame; unvoiced samples (f0 <=
    threshold) keep only noise. A linear layer + tanh merges the harmonics into one channel.
    causal=True holds each frame's phase for the frame's samples (so it never depends on
    later frames) and uses U[0, 1) noise, as upstream's causal SineGen2 does; causal=False
    interpolates the phase linearly between frames and uses Gaussian noise.

    Upstream's non-causal SineGen2 draws its initial phases and its noise afresh on every
    call (torch.rand, torch.randn_like); both variants here read a fixed seeded table
    instead (`_NoiseBank`), on purpose: the same mel gives the same audio in every call,
    process and Triton instance, and a re-run on a longer mel gets the same noise at the
    samples it shares with the shorter run, which a cross-fade between the two relies on.
    """

    def __init__(self, sampling_rate: int, samples_per_frame: int, nb_harmonics: int,
                 sine_amp: float, noise_std: float, voiced_threshold: float,
                 noise_seed: int = DEFAULT_NOISE_SEED, causal: bool = True) -> None:
        super().__init__()
        self.sampling_rate = sampling_rate
        self.samples_per_frame = samples_per_frame
        self.sine_amp = sine_amp
        self.noise_std = noise_std
        self.voiced_threshold = voiced_threshold
        self.harmonics = nb_harmonics + 1
        self.causal = causal
        self.noise = _NoiseBank(self.harmonics, noise_seed, normal=not causal)
        self.l_linear = nn.Linear(self.harmonics, 1)

    def forward(self, f0: Tensor) -> Tensor:
        spf = self.samples_per_frame
        device = f0.device
        f0 = f0.repeat_interleave(spf, dim=1)[:, :, None]                     # [B, L, 1]
        multiples = torch.arange(1, self.harmonics + 1, dtype=f0.dtype, device=device)
        # Phase increment per sample in cycles; only the fraction matters for sin().
        cycles = (f0 * multiples / self.sampling_rate) % 1                    # [B, L, H]
        # Initial phases on sample 0. The resampling below never reads sample 0 when a frame
        # is more than 2 samples (480 in CosyVoice3), so this is inert there; kept so other
        # rates behave as upstream.
        cycles[:, 0, :] = cycles[:, 0, :] + self.noise.rand_ini.to(device)
        # Upstream's frame-rate step: linear resampling to one value per frame, a running
        # sum over frames, then back to the audio rate (x spf because the sum skipped spf - 1
        # samples per frame). Kept op for op: equal bits, equal audio.
        per_frame = F.interpolate(cycles.transpose(1, 2), scale_factor=1 / spf,
                                  mode="linear").transpose(1, 2)
        phase = torch.cumsum(per_frame, dim=1) * 2 * math.pi
        # Channels-first, as upstream does, so the [B, L, H] view has upstream's memory
        # layout: l_linear then sums the harmonics in the same order, to the same bits.
        phase = phase.transpose(1, 2) * spf
        if self.causal:
            phase = phase.repeat_interleave(spf, dim=2)     # held: no look at the next frame
        else:
            phase = F.interpolate(phase, scale_factor=spf, mode="linear")
        phase = phase.transpose(1, 2)
        sines = torch.sin(phase) * self.sine_amp
        voiced = (f0 > self.voiced_threshold).to(sines.dtype)
        # Voiced samples get faint noise; unvoiced ones noise of about the sines' amplitude.
        noise_amp = voiced * self.noise_std + (1 - voiced) * self.sine_amp / 3
        noise = noise_amp * self.noise.sine_noise(sines.shape[1], device)
        excitation = torch.tanh(self.l_linear(sines * voiced + noise))        # [B, L, 1]
        return excitation.transpose(1, 2)


class HiFTGenerator(nn.Module):
    """The HiFT vocoder. Keyword arguments are exactly the `hift:` block of cosyvoice3.yaml
    plus `causal`; the defaults are that file's values (CosyVoice3's released 24 kHz model).
    GLM-TTS's non-causal vocoder: tritontts.families.glm_tts.vocoder.GLM_HIFT_CONFIG.

    `f0_predictor` is a ConvRNNF0Predictor, or a mapping of its keyword arguments (a
    "__class__" entry, as a parsed yaml `!new:` tag leaves it, is ignored; `causal` follows
    the generator's). `conv_pre_look_right` is the causal variant's (default 4); the
    non-causal conv_pre is centred instead.
    """

    def __init__(
        self,
        *,
        in_channels: int = 80,
        base_channels: int = 512,
        nb_harmonics: int = 8,
        sampling_rate: int = 24000,
        nsf_alpha: float = 0.1,
        nsf_sigma: float = 0.003,
        nsf_voiced_threshold: float = 10,
        upsample_rates: Sequence[int] = (8, 5, 3),
        upsample_kernel_sizes: Sequence[int] = (16, 11, 7),
        istft_params: Mapping[str, int] | None = None,
        resblock_kernel_sizes: Sequence[int] = (3, 7, 11),
        resblock_dilation_sizes: Sequence[Sequence[int]] = ((1, 3, 5),) * 3,
        source_resblock_kernel_sizes: Sequence[int] = (7, 7, 11),
        source_resblock_dilation_sizes: Sequence[Sequence[int]] = ((1, 3, 5),) * 3,
        lrelu_slope: float = 0.1,
        audio_limit: float = 0.99,
        conv_pre_look_right: int | None = None,
        f0_predictor: nn.Module | Mapping[str, Any] | None = None,
        causal: bool = True,
    ) -> None:
        super().__init__()
        istft_params = dict(istft_params or {"n_fft": 16, "hop_len": 4})
        stages = len(upsample_rates)
        if len(upsample_kernel_sizes) != stages or len(source_resblock_kernel_sizes) != stages \
                or len(source_resblock_dilation_sizes) != stages:
            raise ValueError("upsample_rates, upsample_kernel_sizes and the source_resblock_* "
                             "lists need one entry per upsampling stage")
        if len(resblock_kernel_sizes) != len(resblock_dilation_sizes):
            raise ValueError("resblock_kernel_sizes and resblock_dilation_sizes differ in length")
        if sampling_rate == 22050:
            raise ValueError("22.05 kHz HiFT (CosyVoice 1) uses a different sine generator; "
                             "this module implements the 24 kHz one")
        if causal:
            conv_pre_look_right = 4 if conv_pre_look_right is None else conv_pre_look_right
        elif conv_pre_look_right:
            raise ValueError("conv_pre_look_right is a causal HiFT option")

        self.causal = causal
        self.sample_rate = sampling_rate
        self.n_fft = int(istft_params["n_fft"])
        self.hop_len = int(istft_params["hop_len"])
        self.lrelu_slope = lrelu_slope
        self.audio_limit = audio_limit
        # Mel frames appended to spectrum's input as look-ahead: none when non-causal.
        self.conv_pre_look_right = conv_pre_look_right if causal else 0
        self.num_kernels = len(resblock_kernel_sizes)
        # One mel frame = prod(upsample_rates) STFT hops = that many * hop_len samples.
        self.frames_per_mel = int(np.prod(upsample_rates))
        self.samples_per_mel = self.frames_per_mel * self.hop_len

        self.f0_predictor = _build_f0_predictor(f0_predictor, in_channels, causal)
        if causal:
            # Upstream computes the causal f0 in float64. In float32 a frame's f0 can differ
            # by an ulp between runs of different length (conv summation order), and the sine
            # phase, a running sum of f0, would carry that into every later sample; float64
            # differences vanish in the cast back to float32, so a streamed run gets the whole
            # run's excitation exactly.
            self.f0_predictor.double()
        self.m_source = HarmonicNoiseSource(sampling_rate, self.samples_per_mel, nb_harmonics,
                                            nsf_alpha, nsf_sigma, nsf_voiced_threshold,
                                            causal=causal)
        self.conv_pre = (CausalConv1d(in_channels, base_channels, conv_pre_look_right + 1,
                                      side="right") if causal
                         else _same_length_conv(in_channels, base_channels, 7, causal=False))

        channels = [base_channels // 2 ** (i + 1) for i in range(stages)]
        self.ups = nn.ModuleList(
            CausalUpsampleConv1d(base_channels // 2 ** i, channels[i], k, rate) if causal
            else nn.ConvTranspose1d(base_channels // 2 ** i, channels[i], k, rate,
                                    padding=(k - rate) // 2)
            for i, (rate, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes)))
        # The excitation enters every stage as its STFT (n_fft + 2 channels: real, imag),
        # brought from the STFT frame rate down to that stage's rate.
        spec_channels = self.n_fft + 2
        self.source_downs = nn.ModuleList()
        for i in range(stages):
            down = int(np.prod(upsample_rates[i + 1:]))
            if down == 1:
                conv = _same_length_conv(spec_channels, channels[i], 1, causal=causal)
            elif causal:
                conv = CausalDownsampleConv1d(spec_channels, channels[i], down)
            else:
                conv = nn.Conv1d(spec_channels, channels[i], 2 * down, down, padding=down // 2)
            self.source_downs.append(conv)
        self.source_resblocks = nn.ModuleList(
            ResBlock(channels[i], k, d, causal)
            for i, (k, d) in enumerate(zip(source_resblock_kernel_sizes,
                                           source_resblock_dilation_sizes)))
        # Flat list, num_kernels blocks per stage, as upstream indexes it.
        self.resblocks = nn.ModuleList(
            ResBlock(ch, k, d, causal) for ch in channels
            for k, d in zip(resblock_kernel_sizes, resblock_dilation_sizes))
        self.conv_post = _same_length_conv(channels[-1], spec_channels, 7, causal=causal)
        window = get_window("hann", self.n_fft, fftbins=True).astype(np.float32)
        self.register_buffer("stft_window", torch.from_numpy(window), persistent=False)
        # Set by a stage that runs `spectrum` elsewhere (tritontts.nn.runtime: ONNX, TensorRT).
        self.spectrum_runner = None

    @classmethod
    def from_config(cls, hift_block: Mapping[str, Any]) -> HiFTGenerator:
        """Build from the parsed `hift:` block of cosyvoice3.yaml ("__class__" ignored)."""
        return cls(**kwargs_of(hift_block))

    def _require_causal(self, what: str) -> None:
        if not self.causal:
            raise ValueError(f"{what} is defined for the causal HiFT only; re-run the "
                             "non-causal one on all mel so far (finalize=True)")

    @property
    def f0_look_right(self) -> int:
        """Mel frames the causal f0 predictor's first conv looks ahead (3)."""
        self._require_causal("f0_look_right")
        first = self.f0_predictor.condnet[0]
        # `causal_padding`: an upstream-built predictor passed in as a module.
        return first.pad if isinstance(first, CausalConv1d) else int(first.causal_padding)

    @property
    def min_partial_frames(self) -> int:
        """Fewest mel frames `inference(..., finalize=False)` accepts (it yields no audio
        until one frame more): both look-right windows plus one frame to decode."""
        return self.f0_look_right + self.conv_pre_look_right + 1

    def reseed_noise(self, seed: int) -> None:
        """Use another fixed noise table (default DEFAULT_NOISE_SEED)."""
        source = self.m_source
        source.noise = _NoiseBank(source.harmonics, seed, normal=source.noise.normal)

    def _stft(self, x: Tensor) -> Tensor:
        spec = torch.stft(x, self.n_fft, self.hop_len, self.n_fft, window=self.stft_window,
                          return_complex=True)
        return torch.cat([spec.real, spec.imag], dim=1)

    def _istft(self, log_magnitude: Tensor, phase_code: Tensor) -> Tensor:
        magnitude = torch.exp(log_magnitude).clamp(max=1e2)
        phase = torch.sin(phase_code)    # phase in [-1, 1] rad: trained that way upstream
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return torch.istft(spec, self.n_fft, self.hop_len, self.n_fft, window=self.stft_window)

    def decode(self, mel: Tensor, source: Tensor, finalize: bool = True) -> Tensor:
        """Mel [B, C, T] + excitation [B, 1, T * samples_per_mel] -> audio [B, N].

        finalize=True: N = T * samples_per_mel. finalize=False (causal only): the last
        conv_pre_look_right frames are look-ahead only, and the last decoded frame's audio
        is withheld because its iSTFT overlap-add still lacks the following frames: N =
        (T - look_right - 1) * samples_per_mel.
        """
        if not finalize:
            self._require_causal("finalize=False")
        spec = self._stft(source.squeeze(1))
        look_right = self.conv_pre_look_right
        if not self.causal:
            mel_ahead = mel
        elif finalize:
            mel_ahead = torch.cat([mel, mel.new_zeros(mel.shape[0], mel.shape[1], look_right)],
                                  dim=2)
        else:
            # Only the decoded frames' excitation: the look-ahead frames are not decoded (and
            # their centred STFT frames would reach into the reflect-padded end).
            mel_ahead = mel
            spec = spec[:, :, :spec.shape[2] - self.frames_per_mel * look_right]
        spectrum = self.spectrum_runner or self.spectrum
        x = spectrum(mel_ahead, spec)[0]
        bins = self.n_fft // 2 + 1
        audio = self._istft(x[:, :bins], x[:, bins:])
        if not finalize:
            audio = audio[:, :audio.shape[1] - self.samples_per_mel]
        return audio.clamp(-self.audio_limit, self.audio_limit)

    def spectrum(self, mel_ahead: Tensor, spec: Tensor) -> tuple[Tensor]:
        """The network alone (what the ONNX/TensorRT export holds; STFT and iSTFT stay in
        torch, where they export poorly): mel with its conv_pre_look_right frames of
        look-ahead (none when non-causal) [B, C, T + look_right], excitation STFT [B, n_fft
        + 2, T * frames_per_mel + 1] -> (log-magnitude and phase code [B, n_fft + 2,
        T * frames_per_mel + 1],)."""
        # The plain Conv1d forward: a causal conv_pre's right padding is the look-ahead
        # already appended, a non-causal one pads itself (Conv1d padding=3).
        x = nn.Conv1d.forward(self.conv_pre, mel_ahead)
        last = len(self.ups) - 1
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, self.lrelu_slope))
            if i == last:
                # One extra frame in front: the centred iSTFT needs T * frames_per_mel + 1.
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](spec))
            blocks = self.resblocks[i * self.num_kernels:(i + 1) * self.num_kernels]
            total = blocks[0](x)
            for block in blocks[1:]:
                total = total + block(x)
            x = total / self.num_kernels
        # Upstream uses leaky_relu's default slope (0.01) here, not lrelu_slope.
        return (self.conv_post(F.leaky_relu(x)),)

    def forward(self, mel: Tensor) -> Tensor:
        """Mel [B, C, T] -> audio [B, T * samples_per_mel]: `inference` of a whole
        utterance, the mel -> audio call tritontts.families.glm_tts.vocoder.Vocoder describes."""
        return self.inference(mel)[0]

    @torch.inference_mode()
    def inference(self, speech_feat: Tensor, finalize: bool = True) -> tuple[Tensor, Tensor]:
        """Mel [B, in_channels, T] (float32) -> (audio [B, N], excitation [B, 1, M]).

        finalize=True (last or only call; the only mode of the non-causal variant): N = T *
        samples_per_mel, frames past the end read as zeros. finalize=False (causal: more mel
        will follow): the last f0_look_right + conv_pre_look_right frames serve as
        look-ahead only and one more frame is withheld, N = (T - min_partial_frames) *
        samples_per_mel; those N samples equal the first N of any later run on a longer mel
        (upstream's streaming contract).
        """
        frames = speech_feat.shape[2]
        if not self.causal:
            if not finalize:
                self._require_causal("finalize=False")
            if frames < 1:
                raise ValueError("no mel frames to decode")
            f0 = self.f0_predictor(speech_feat)
            source = self.m_source(f0)
            return self.decode(speech_feat, source), source
        if frames < (1 if finalize else self.min_partial_frames):
            raise ValueError(f"{frames} mel frames are too few for finalize={finalize}")
        predictor = self.f0_predictor
        if next(predictor.parameters()).dtype != torch.float64:
            # Someone called .float()/.to(dtype) on the whole model. Convert back outside
            # inference mode, or the parameters would become inference tensors that a later
            # load_state_dict may not write into.
            with torch.inference_mode(False), torch.no_grad():
                predictor.double()
        f0 = predictor(speech_feat.double(), finalize=finalize).to(speech_feat.dtype)
        source = self.m_source(f0)
        mel = speech_feat if finalize else speech_feat[:, :, :frames - self.f0_look_right]
        return self.decode(mel, source, finalize), source


def spectrum_graph(hift: HiFTGenerator, max_batch: int = 16, max_frames: int = 3000,
                   name: str | None = None):
    """HiFTGenerator.spectrum as a tritontts.nn.runtime Graph, named `name` (default
    "cosyvoice3_hift_spectrum" for the causal variant, "hift_spectrum" otherwise). Stages
    re-run the vocoder on all mel so far, so frames range like the flow's (opt: a few
    50-frame chunks). The excitation STFT has frames_per_mel hops per decoded mel frame
    plus one: an axis derived from the mel's."""
    from .runtime import Axis, Graph, Method, TensorSpec

    look = hift.conv_pre_look_right
    hops = hift.frames_per_mel
    f32 = torch.float32
    if name is None:
        name = "cosyvoice3_hift_spectrum" if hift.causal else "hift_spectrum"
    return Graph(
        name=name, module=Method(hift, "spectrum"),
        inputs=(TensorSpec("mel_ahead", f32, ("batch", hift.conv_pre.in_channels, "mel_frames")),
                TensorSpec("spec", f32, ("batch", hift.n_fft + 2, "stft_frames"))),
        outputs=("spectrum",),
        axes={"batch": Axis(1, 1, max_batch),
              "mel_frames": Axis(1 + look, 300 + look, max_frames + look)},
        derived={"stft_frames": lambda sizes: (sizes["mel_frames"] - look) * hops + 1},
        output_axes={"spectrum": {0: "batch", 2: "stft_frames"}})


def _build_f0_predictor(spec: nn.Module | Mapping[str, Any] | None, in_channels: int,
                        causal: bool) -> nn.Module:
    if spec is None:
        return ConvRNNF0Predictor(in_channels=in_channels, causal=causal)
    if isinstance(spec, nn.Module):
        return spec
    return ConvRNNF0Predictor(**kwargs_of(spec), causal=causal)


# Upstream key suffixes of a weight-normed `weight` (old torch.nn.utils.weight_norm, and
# torch.nn.utils.parametrizations.weight_norm) -> which half of the pair it is.
_WEIGHT_NORM_SUFFIXES = {
    ".weight_g": "g", ".weight_v": "v",
    ".parametrizations.weight.original0": "g", ".parametrizations.weight.original1": "v",
}


def load_hift_state_dict(model: nn.Module, state_dict: Mapping[str, Tensor]) -> nn.Module:
    """Load an upstream hift state dict into `model` strictly; returns `model`.

    Accepts weight-normed layers as `X.weight_g`/`X.weight_v`, as
    `X.parametrizations.weight.original0`/`original1`, or already plain as `X.weight`.
    Weight norm is folded as torch computes it (dim=0: g * v / ||v|| over all other dims),
    in the dtype of the receiving parameter, so the f0 predictor gets the float64 weights
    upstream's float64 f0 path computes. A leading "generator." (a GAN checkpoint, which
    upstream's loader strips too) is dropped. Missing or unexpected keys raise
    CheckpointError naming them; no parameter is changed then.
    """
    expected = model.state_dict()
    plain: dict[str, Tensor] = {}
    origin: dict[str, list[str]] = {}       # plain key -> the key(s) it came from
    halves: dict[str, dict[str, tuple[str, Tensor]]] = {}
    for key, value in state_dict.items():
        name = key.removeprefix("generator.")
        for suffix, half in _WEIGHT_NORM_SUFFIXES.items():
            if name.endswith(suffix):
                halves.setdefault(name[:-len(suffix)] + ".weight", {})[half] = (key, value)
                break
        else:
            plain[name] = value
            origin[name] = [key]

    unpaired: list[str] = []
    for name, pair in halves.items():
        if set(pair) != {"g", "v"}:
            unpaired += [key for key, _ in pair.values()]
            continue
        (g_key, g), (v_key, v) = pair["g"], pair["v"]
        origin[name] = [g_key, v_key]
        if name in plain:
            raise CheckpointError(f"hift state dict: {name} given both plain and weight-normed")
        dtype = expected[name].dtype if name in expected else v.dtype
        # torch._weight_norm is the kernel both weight_norm APIs evaluate on every forward,
        # so the folded weight has the bits upstream's modules compute.
        plain[name] = torch._weight_norm(v.to(dtype), g.to(dtype), 0)

    missing = sorted(set(expected) - set(plain))
    unexpected = sorted(k for name in set(plain) - set(expected) for k in origin[name])
    if missing or unexpected or unpaired:
        raise CheckpointError("hift state dict does not match the model: "
                       f"missing {missing}, unexpected {unexpected}, "
                       f"weight norm half without its pair {sorted(unpaired)}")
    model.load_state_dict(plain, strict=True)
    return model


def stream_hift(model: HiFTGenerator, mel_so_far: Tensor, emitted_samples: int,
                finalize: bool) -> tuple[Tensor, int]:
    """One streaming step of CosyVoice3Model.token2wav's vocoder part, stateless; causal
    HiFT only.

    Runs the vocoder on all mel received so far ([B, C, T]) and returns the audio not yet
    emitted, (new_audio [B, n], emitted_samples + n). Pass finalize=True exactly once, with
    the complete mel. Before min_partial_frames frames a partial step yields no audio
    (upstream would fail there).
    """
    model._require_causal("stream_hift")
    if not finalize and mel_so_far.shape[2] < model.min_partial_frames:
        return mel_so_far.new_zeros(mel_so_far.shape[0], 0), emitted_samples
    audio, _ = model.inference(mel_so_far, finalize=finalize)
    new_audio = audio[:, emitted_samples:]
    return new_audio, emitted_samples + new_audio.shape[1]
