"""VoxCPM2's AudioVAE v2: a causal DAC-style VAE, 16 kHz audio -> 64-dim latents at 25 Hz
-> 48 kHz audio, its decoder conditioned on a sample-rate bucket.

Module and parameter names follow upstream's (voxcpm.modules.audiovae.audio_vae_v2), so
`audiovae.safetensors` loads strictly; its weight-normed convolutions (weight_g, weight_v)
are folded into plain weights after loading. Every convolution is causal (left padding
only), so the decoder streams exactly: each stateful layer carries the last inputs its
kernel reaches back to, and decoding chunk by chunk gives the samples of one whole decode.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.weights.checkpoint import CheckpointError, ConfigFields, load_strict


@dataclass(frozen=True)
class AudioVAEConfig:
    """The checkpoint's `audio_vae_config`; defaults are upstream's (the released model)."""
    encoder_dim: int = 128
    encoder_rates: tuple[int, ...] = (2, 5, 8, 8)
    latent_dim: int = 64
    decoder_dim: int = 2048
    decoder_rates: tuple[int, ...] = (8, 6, 5, 2, 2, 2)
    depthwise: bool = True
    sample_rate: int = 16000
    out_sample_rate: int = 48000
    use_noise_block: bool = False
    sr_bin_boundaries: tuple[int, ...] | None = (20000, 30000, 40000)
    cond_type: str = "scale_bias"
    cond_dim: int = 128
    cond_out_layer: bool = False

    @property
    def encode_hop(self) -> int:
        """Input samples per latent frame (640 at 16 kHz: 25 Hz)."""
        return math.prod(self.encoder_rates)

    @property
    def decode_hop(self) -> int:
        """Output samples per latent frame (1920 at 48 kHz)."""
        return math.prod(self.decoder_rates)

    @classmethod
    def from_dict(cls, data: Any, path: str | Path = "config.json",
                  where: str = "audio_vae_config.") -> "AudioVAEConfig":
        fields = ConfigFields(data, Path(path), where)
        d = cls()
        boundaries = d.sr_bin_boundaries
        # An explicit null switches the sample-rate conditioning off; absent means the default.
        if isinstance(data, dict) and "sr_bin_boundaries" in data and data["sr_bin_boundaries"] is None:
            boundaries = None
        else:
            boundaries = fields.ints("sr_bin_boundaries", boundaries)
        config = cls(
            encoder_dim=fields.int("encoder_dim", d.encoder_dim, low=1),
            encoder_rates=fields.ints("encoder_rates", d.encoder_rates),
            latent_dim=fields.int("latent_dim", d.latent_dim, low=1),
            decoder_dim=fields.int("decoder_dim", d.decoder_dim, low=1),
            decoder_rates=fields.ints("decoder_rates", d.decoder_rates),
            depthwise=fields.bool("depthwise", d.depthwise),
            sample_rate=fields.int("sample_rate", d.sample_rate, low=1),
            out_sample_rate=fields.int("out_sample_rate", d.out_sample_rate, low=1),
            use_noise_block=fields.bool("use_noise_block", d.use_noise_block),
            sr_bin_boundaries=boundaries,
            cond_type=fields.str("cond_type", d.cond_type,
                                 choices=("scale_bias", "scale_bias_init", "add", "concat")),
            cond_dim=fields.int("cond_dim", d.cond_dim, low=1),
            cond_out_layer=fields.bool("cond_out_layer", d.cond_out_layer),
        )
        if config.use_noise_block:
            # Upstream's noise block injects fresh randn at every decode: not reproducible,
            # and no released VoxCPM2 checkpoint turns it on.
            fields.fail("use_noise_block", "is true; the noise block is not supported")
        if config.cond_type == "concat" and not config.cond_out_layer:
            fields.fail("cond_type", "is 'concat', which needs cond_out_layer true")
        if any(r < 1 for r in (*config.encoder_rates, *config.decoder_rates)):
            fields.fail("decoder_rates", "and encoder_rates must be positive")
        if config.decoder_dim % 2 ** len(config.decoder_rates):
            fields.fail("decoder_dim", f"must be divisible by 2**{len(config.decoder_rates)}")
        return config

    def to_dict(self) -> dict:
        out = asdict(self)
        for k, v in out.items():
            if isinstance(v, tuple):
                out[k] = list(v)
        return out


RELEASED_CONFIG = AudioVAEConfig()
# Small enough for CPU parity tests; odd and even strides exercise both trims.
TINY_CONFIG = AudioVAEConfig(encoder_dim=4, encoder_rates=(2, 3), latent_dim=8, decoder_dim=32,
                             decoder_rates=(3, 3, 2), cond_dim=8)
# Tiny widths with the released rates (16 kHz in, 25 latents/s, 48 kHz out): the random
# checkpoint's, so served audio and reference clips have their real durations.
TINY_RELEASED_RATES_CONFIG = AudioVAEConfig(encoder_dim=2, latent_dim=8, decoder_dim=64, cond_dim=8)


# Streaming state: stateful layer index -> the inputs it saw last (its left context).
StreamState = dict


class WNConv(nn.Module):
    """A causal Conv1d (or ConvTranspose1d) stored weight-normed as upstream stores it.

    Conv: left-pads (kernel-1)*dilation (stride 1), or `stride` for the encoder's
    kernel-2s downsamplers, as upstream's padding*2 - output_padding works out to.
    Transposed (kernel 2s, stride s): each input frame writes 2s samples, half onto the
    next frame's span, so one previous input frame is the whole left context; upstream
    drops the last s samples, which only the not-yet-seen next frame would complete.
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, *, stride: int = 1,
                 dilation: int = 1, groups: int = 1, bias: bool = True,
                 transpose: bool = False) -> None:
        super().__init__()
        self.stride, self.dilation, self.groups, self.transpose = stride, dilation, groups, transpose
        shape = (c_in, c_out // groups, kernel) if transpose else (c_out, c_in // groups, kernel)
        self.weight_g = nn.Parameter(torch.ones(shape[0], 1, 1))
        self.weight_v = nn.Parameter(torch.zeros(shape))
        self.bias = nn.Parameter(torch.zeros(c_out)) if bias else None
        if transpose:
            assert kernel == 2 * stride and groups == 1
            self.context = 1                       # input frames
        else:
            self.context = stride if stride > 1 else (kernel - 1) * dilation
        self.slot: int | None = None              # set by the decoder for streaming

    def fold_weight_norm(self) -> None:
        """Replace weight_g/weight_v by the weight they stand for. torch._weight_norm is the
        kernel torch.nn.utils.weight_norm evaluates each forward, so the bits match."""
        if hasattr(self, "weight_g"):
            weight = torch._weight_norm(self.weight_v.data, self.weight_g.data, 0)
            del self.weight_g, self.weight_v
            self.weight = nn.Parameter(weight)

    def _weight(self) -> Tensor:
        if hasattr(self, "weight_g"):
            return torch._weight_norm(self.weight_v, self.weight_g, 0)
        return self.weight

    def forward(self, x: Tensor, state: StreamState | None = None) -> Tensor:
        ctx = self.context
        if ctx:
            prev = state.get(self.slot) if state is not None else None
            if prev is None:
                prev = x.new_zeros(x.shape[0], x.shape[1], ctx)
            x = torch.cat([prev, x], dim=-1)
            if state is not None:
                state[self.slot] = x[..., -ctx:]
        if not self.transpose:
            return F.conv1d(x, self._weight(), self.bias, self.stride, 0, self.dilation, self.groups)
        s = self.stride
        return F.conv_transpose1d(x, self._weight(), self.bias, s)[..., s:-s]


class Snake1d(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor, state: StreamState | None = None) -> Tensor:
        # Same expression (and epsilon) as upstream, so fp32 results agree to rounding.
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class _Stack(nn.Sequential):
    """nn.Sequential (for upstream's `block.N` names) that threads the stream state."""

    def forward(self, x: Tensor, state: StreamState | None = None) -> Tensor:
        for layer in self:
            x = layer(x, state)
        return x


class CausalResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = _Stack(Snake1d(dim), WNConv(dim, dim, 7, dilation=dilation, groups=groups),
                            Snake1d(dim), WNConv(dim, dim, 1))

    def forward(self, x: Tensor, state: StreamState | None = None) -> Tensor:
        return x + self.block(x, state)


class CausalEncoderBlock(nn.Module):
    def __init__(self, output_dim: int, stride: int, groups: int) -> None:
        super().__init__()
        dim = output_dim // 2
        self.block = _Stack(*(CausalResidualUnit(dim, d, groups) for d in (1, 3, 9)),
                            Snake1d(dim), WNConv(dim, output_dim, 2 * stride, stride=stride))

    def forward(self, x: Tensor, state: StreamState | None = None) -> Tensor:
        return self.block(x, state)


class CausalDecoderBlock(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, stride: int, groups: int) -> None:
        super().__init__()
        self.input_channels = input_dim
        self.block = _Stack(Snake1d(input_dim),
                            WNConv(input_dim, output_dim, 2 * stride, stride=stride, transpose=True),
                            *(CausalResidualUnit(output_dim, d, groups) for d in (1, 3, 9)))

    def forward(self, x: Tensor, state: StreamState | None = None) -> Tensor:
        return self.block(x, state)


class CausalEncoder(nn.Module):
    def __init__(self, c: AudioVAEConfig) -> None:
        super().__init__()
        d = c.encoder_dim
        layers: list[nn.Module] = [WNConv(1, d, 7)]
        for stride in c.encoder_rates:
            d *= 2
            layers.append(CausalEncoderBlock(d, stride, d // 2 if c.depthwise else 1))
        self.block = _Stack(*layers)
        self.fc_mu = WNConv(d, c.latent_dim, 3)
        self.fc_logvar = WNConv(d, c.latent_dim, 3)   # loaded for strictness; inference uses mu


class SampleRateConditionLayer(nn.Module):
    """Per-channel conditioning on the output sample-rate bucket, before each decoder block."""

    def __init__(self, dim: int, buckets: int, c: AudioVAEConfig) -> None:
        super().__init__()
        self.cond_type = c.cond_type
        if c.cond_type in ("scale_bias", "scale_bias_init"):
            self.scale_embed = nn.Embedding(buckets, dim)
            self.bias_embed = nn.Embedding(buckets, dim)
            out_in = dim
        else:
            self.cond_embed = nn.Embedding(buckets, dim if c.cond_type == "add" else c.cond_dim)
            out_in = dim if c.cond_type == "add" else dim + c.cond_dim
        self.out_layer = (_Stack(Snake1d(out_in), WNConv(out_in, dim, 1))
                          if c.cond_out_layer else None)

    def forward(self, x: Tensor, bucket: Tensor) -> Tensor:
        if self.cond_type == "add":
            x = x + self.cond_embed(bucket).unsqueeze(-1)
        elif self.cond_type == "concat":
            cond = self.cond_embed(bucket).unsqueeze(-1).expand(-1, -1, x.shape[-1])
            x = torch.cat([x, cond], dim=1)
        else:
            x = x * self.scale_embed(bucket).unsqueeze(-1) + self.bias_embed(bucket).unsqueeze(-1)
        # Only 1x1 convs and pointwise ops here: stateless, safe to apply per chunk.
        return self.out_layer(x) if self.out_layer is not None else x


class CausalDecoder(nn.Module):
    def __init__(self, c: AudioVAEConfig) -> None:
        super().__init__()
        latent, channels = c.latent_dim, c.decoder_dim
        if c.depthwise:
            layers: list[nn.Module] = [WNConv(latent, latent, 7, groups=latent),
                                       WNConv(latent, channels, 1)]
        else:
            layers = [WNConv(latent, channels, 7)]
        for i, stride in enumerate(c.decoder_rates):
            out_dim = channels // 2 ** (i + 1)
            layers.append(CausalDecoderBlock(channels // 2 ** i, out_dim, stride,
                                             out_dim if c.depthwise else 1))
        layers += [Snake1d(out_dim), WNConv(out_dim, 1, 7), _Tanh()]
        if c.sr_bin_boundaries is None:
            self.model = _Stack(*layers)
            self.sr_bin_boundaries = None
        else:
            self.model = nn.ModuleList(layers)
            self.register_buffer("sr_bin_boundaries",
                                 torch.tensor(c.sr_bin_boundaries, dtype=torch.int32))
            buckets = len(c.sr_bin_boundaries) + 1
            # Indexed like `model`, so keys read sr_cond_model.<index of its decoder block>.
            self.sr_cond_model = nn.ModuleList(
                SampleRateConditionLayer(layer.input_channels, buckets, c)
                if isinstance(layer, CausalDecoderBlock) else None for layer in layers)
        for slot, conv in enumerate(m for m in self.modules() if isinstance(m, WNConv) and m.context):
            conv.slot = slot

    def forward(self, z: Tensor, sample_rate: int, state: StreamState | None = None) -> Tensor:
        if self.sr_bin_boundaries is None:
            return self.model(z, state)
        rate = torch.tensor([sample_rate], dtype=torch.int32, device=z.device)
        bucket = torch.bucketize(rate, self.sr_bin_boundaries)
        x = z
        for layer, cond in zip(self.model, self.sr_cond_model):
            if cond is not None:
                x = cond(x, bucket)
            x = layer(x, state)
        return x


class _Tanh(nn.Module):
    def forward(self, x: Tensor, state: StreamState | None = None) -> Tensor:
        return torch.tanh(x)


class AudioVAE(nn.Module):
    """Inference-only AudioVAE v2. `decode` for whole utterances, `stream` for chunks."""

    def __init__(self, config: AudioVAEConfig = RELEASED_CONFIG) -> None:
        super().__init__()
        self.config = config
        self.encoder = CausalEncoder(config)
        self.decoder = CausalDecoder(config)

    def fold_weight_norm(self) -> "AudioVAE":
        for m in self.modules():
            if isinstance(m, WNConv):
                m.fold_weight_norm()
        return self

    @torch.inference_mode()
    def decode(self, latents: Tensor, sample_rate: int | None = None) -> Tensor:
        """latents [B, latent_dim, T] -> audio [B, T * decode_hop] in [-1, 1]."""
        return self.stream(sample_rate).decode_chunk(latents)

    def stream(self, sample_rate: int | None = None) -> "AudioVAEStream":
        return AudioVAEStream(self, sample_rate)

    @torch.inference_mode()
    def encode(self, audio: Tensor) -> Tensor:
        """audio [B, N] (or [B, 1, N]) at config.sample_rate -> latent means [B, D, ceil(N/hop)]."""
        if audio.ndim == 2:
            audio = audio.unsqueeze(1)
        hop = self.config.encode_hop
        audio = F.pad(audio, (0, -audio.shape[-1] % hop))
        return self.encoder.fc_mu(self.encoder.block(audio))


def decoder_context_frames(config: AudioVAEConfig) -> int:
    """Latent frames of left context that make a window's decode of its newer frames equal
    a whole decode (the decoder is causal, and this is its receptive field): the input
    conv's 6, each upsampler's one previous input sample, each block's residual units
    (kernel 7 at dilations 1, 3, 9: 78 samples at the block's output rate), the output
    conv's 6 samples."""
    frames, rate = 6.0, 1
    for stride in config.decoder_rates:
        frames += 1 / rate
        rate *= stride
        frames += 6 * (1 + 3 + 9) / rate
    return math.ceil(frames + 6 / rate)


class AudioVAEStream:
    """Chunk-by-chunk decoding of one batch of utterances. Every causal layer keeps the last
    inputs its kernel reaches back to, so the concatenated chunks equal one whole decode
    (up to float rounding); each chunk costs only its own frames."""

    def __init__(self, vae: AudioVAE, sample_rate: int | None = None) -> None:
        self.vae = vae
        self.sample_rate = vae.config.out_sample_rate if sample_rate is None else sample_rate
        self.state: StreamState = {}

    @torch.inference_mode()
    def decode_chunk(self, latents: Tensor) -> Tensor:
        """New latents [B, latent_dim, t] -> their audio [B, t * decode_hop]."""
        return self.vae.decoder(latents, self.sample_rate, self.state).squeeze(1)


def load_audio_vae(path: str | Path, config: AudioVAEConfig,
                   device: str | torch.device = "cpu") -> AudioVAE:
    """audiovae.safetensors -> an fp32 AudioVAE with weight norm folded. A file that does
    not match `config` exactly raises CheckpointError naming the keys."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: AudioVAE weights not found")
    try:
        tensors = load_file(str(path), device="cpu")
    except Exception as exc:  # noqa: BLE001 - any failure is a bad file
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    model = AudioVAE(config)
    load_strict(model, tensors, f"{path}")
    return model.fold_weight_norm().float().to(device).eval()


def random_audio_vae_state(model: AudioVAE, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """Seeded random values for every tensor of `model` (weight-normed, as upstream stores
    it), on the model's device, scaled so that activations stay O(1) through the network
    (unit-norm filter rows, Snake alphas near 1, sample-rate scales near 1). `generator`
    (on that device; None: torch's global one) draws them in the state dict's order."""
    out: dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        leaf = name.rsplit(".", 1)[-1]
        rand = lambda: torch.rand(t.shape, generator=generator, device=t.device)     # noqa: E731
        randn = lambda: torch.randn(t.shape, generator=generator, device=t.device)   # noqa: E731
        if name.endswith("sr_bin_boundaries"):
            value = t.clone()
        elif leaf == "weight_g":
            value = 0.5 + 0.5 * rand()
        elif leaf == "alpha" or name.endswith("scale_embed.weight"):
            value = 1.0 + 0.3 * (rand() - 0.5)
        elif leaf in ("bias",) or name.endswith("bias_embed.weight") or name.endswith("cond_embed.weight"):
            value = 0.05 * randn()
        else:
            value = randn()
        out[name] = value.to(t.dtype).contiguous()
    return out


def write_random_audio_vae(path: str | Path, config: AudioVAEConfig = TINY_CONFIG,
                           seed: int = 0) -> Path:
    """Write an audiovae.safetensors of seeded random weights (random_audio_vae_state)
    under upstream's key names."""
    from safetensors.torch import save_file

    out = random_audio_vae_state(AudioVAE(config), torch.Generator().manual_seed(seed))
    path = Path(path)
    if path.is_dir():
        path = path / "audiovae.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path))
    return path
