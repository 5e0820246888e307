"""Voxtral TTS's codec decoder (ours): 37 codes per 12.5 Hz frame -> 1920 samples at 24 kHz.

  codes -> latent   the semantic code picks a row of the codebook (embedding_sum divided by
                    cluster_usage, as the checkpoint stores a k-means codebook); each of the
                    36 acoustic codes is an FSQ level in [0, levels) rescaled to [-1, 1];
                    together 256 + 36 = 292 channels per frame
  decoder           causal conv (k3) to `dim`, then four 2-layer transformers joined by 2x
                    transposed convs (12.5 -> 25 -> 50 -> 100 Hz); attention is causal within
                    a sliding window (2, 4, 8, 16 positions: halved by each encoder downsample
                    from attn_sliding_window_size, doubled back by each decoder upsample) with
                    ALiBi biases, QK-norm over the full width and per-channel layer scales
  output            causal conv (k7) to 240 samples per 100 Hz step: 8 x 240 = 1920 per frame

Everything is causal, so a window with `context_frames` (21) frames of left context decodes
its newer frames exactly as the whole utterance does: the stage decodes chunks statelessly.

Parameter names are the checkpoint's under `audio_tokenizer.` (params.json's
audio_tokenizer_args name the sizes): decoder_blocks.N.conv.parametrizations.weight.
original0/1 (weight norm as torch's parametrization stores it), decoder_blocks.N.layers.M.*,
output_proj.*, quantizer.semantic_codebook.{cluster_usage, embedding_sum}. The encoder
(input_proj, encoder_blocks) is not in the released checkpoint and is not built.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import ConfigFields, load_strict
from ...nn.llama_format import FeedForward

PREFIX = "audio_tokenizer."


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in str(text).split(",") if v.strip())


@dataclass(frozen=True)
class CodecConfig:
    """params.json's multimodal.audio_tokenizer_args (the decoder's part); defaults are
    upstream's."""
    sampling_rate: int = 24000
    patch_size: int = 240                  # pretransform_patch_size: samples per 100 Hz step
    patch_kernel: int = 7                  # patch_proj_kernel_size
    semantic_codebook_size: int = 8192
    semantic_dim: int = 256
    acoustic_codebook_size: int = 21       # FSQ levels
    acoustic_dim: int = 36
    dim: int = 1024
    hidden_dim: int = 4096
    head_dim: int = 128
    n_heads: int = 8
    n_kv_heads: int = 8
    qk_norm: bool = True
    qk_norm_eps: float = 1e-6
    norm_eps: float = 1e-2
    layer_scale: bool = True
    conv_weight_norm: bool = True
    attn_window: int = 16                  # attn_sliding_window_size
    half_window_on_resample: bool = True   # half_attn_window_upon_downsampling
    encoder_strides: tuple[int, ...] = (2, 2, 2, 1)
    decoder_lengths: tuple[int, ...] = (2, 2, 2, 2)
    decoder_kernels: tuple[int, ...] = (3, 4, 4, 4)
    decoder_strides: tuple[int, ...] = (1, 2, 2, 2)

    @classmethod
    def from_dict(cls, data: dict[str, Any], fields: ConfigFields) -> "CodecConfig":
        d = cls()
        f = fields

        def strs(name: str, default: tuple[int, ...]) -> tuple[int, ...]:
            value = data.get(name)
            if value is None:
                return default
            try:
                return _ints(value)
            except ValueError:
                f.fail(name, f"must be comma-separated integers, got {value!r}")

        config = cls(
            sampling_rate=f.int("sampling_rate", d.sampling_rate, low=1),
            patch_size=f.int("pretransform_patch_size", d.patch_size, low=1),
            patch_kernel=f.int("patch_proj_kernel_size", d.patch_kernel, low=1),
            semantic_codebook_size=f.int("semantic_codebook_size", d.semantic_codebook_size, low=1),
            semantic_dim=f.int("semantic_dim", d.semantic_dim, low=1),
            acoustic_codebook_size=f.int("acoustic_codebook_size", d.acoustic_codebook_size, low=2),
            acoustic_dim=f.int("acoustic_dim", d.acoustic_dim, low=1),
            dim=f.int("dim", d.dim, low=1), hidden_dim=f.int("hidden_dim", d.hidden_dim, low=1),
            head_dim=f.int("head_dim", d.head_dim, low=1), n_heads=f.int("n_heads", d.n_heads, low=1),
            n_kv_heads=f.int("n_kv_heads", d.n_kv_heads, low=1), qk_norm=f.bool("qk_norm", d.qk_norm),
            qk_norm_eps=f.float("qk_norm_eps", d.qk_norm_eps), norm_eps=f.float("norm_eps", d.norm_eps),
            layer_scale=f.bool("layer_scale", d.layer_scale),
            conv_weight_norm=f.bool("conv_weight_norm", d.conv_weight_norm),
            attn_window=f.int("attn_sliding_window_size", d.attn_window, low=1),
            half_window_on_resample=f.bool("half_attn_window_upon_downsampling", d.half_window_on_resample),
            encoder_strides=strs("encoder_convs_strides_str", d.encoder_strides),
            decoder_lengths=strs("decoder_transformer_lengths_str", d.decoder_lengths),
            decoder_kernels=strs("decoder_convs_kernels_str", d.decoder_kernels),
            decoder_strides=strs("decoder_convs_strides_str", d.decoder_strides),
        )
        if not f.bool("causal", True):
            f.fail("causal", "is false; only the causal codec is served (streamed in exact chunks)")
        if len(config.decoder_kernels) != len(config.decoder_lengths) or \
                len(config.decoder_strides) != len(config.decoder_lengths):
            f.fail("decoder_convs_kernels_str", "and decoder_convs_strides_str need one entry per decoder transformer")
        if any(s not in (1, 2) for s in (*config.encoder_strides, *config.decoder_strides)):
            f.fail("decoder_convs_strides_str", "strides must be 1 or 2")
        if math.prod(config.encoder_strides) != math.prod(config.decoder_strides):
            f.fail("decoder_convs_strides_str", "must upsample as much as the encoder downsamples")
        if config.n_heads % config.n_kv_heads:
            f.fail("n_kv_heads", f"must divide n_heads ({config.n_heads})")
        return config

    @property
    def latent_dim(self) -> int:
        return self.semantic_dim + self.acoustic_dim

    @property
    def samples_per_frame(self) -> int:
        return self.patch_size * math.prod(self.decoder_strides)

    @property
    def frame_rate(self) -> float:
        return self.sampling_rate / self.samples_per_frame

    def decoder_windows(self) -> list[int]:
        """Each decoder transformer's attention window: the configured window halved by each
        stride-2 encoder conv, then doubled by each stride-2 decoder conv before it."""
        window = self.attn_window
        if self.half_window_on_resample:
            for stride in self.encoder_strides:
                if stride == 2:
                    window //= 2
        windows = []
        for i in range(len(self.decoder_lengths)):
            if self.half_window_on_resample and self.decoder_strides[i] == 2:
                window *= 2
            windows.append(window)
        return windows

    def context_frames(self) -> int:
        """Frames of left context a chunk needs to decode exactly as the whole utterance: the
        receptive field, walked back from the output (k7 at the finest rate), through each
        transformer (layers x window positions) and conv, to the input conv."""
        need = self.patch_kernel - 1                   # output conv, at the finest rate
        for i in reversed(range(len(self.decoder_lengths))):
            need += self.decoder_lengths[i] * self.decoder_windows()[i]
            kernel, stride = self.decoder_kernels[i], self.decoder_strides[i]
            if stride == 2:                            # transposed conv: k4 s2 reaches back 1
                need = math.ceil(need / 2) + (kernel - stride) // stride
            else:
                need += kernel - 1
        return need


class CausalConv(nn.Module):
    """Conv1d with left padding (kernel - stride; replicate or reflect), weight-normed as the
    checkpoint stores it (torch's parametrization)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, pad_mode: str, weight_norm: bool) -> None:
        super().__init__()
        conv = nn.Conv1d(c_in, c_out, kernel, bias=False)
        self.conv = nn.utils.parametrizations.weight_norm(conv) if weight_norm else conv
        self.pad = kernel - 1
        self.pad_mode = pad_mode

    def forward(self, x: Tensor) -> Tensor:
        if self.pad_mode == "reflect" and x.shape[-1] <= self.pad:
            # Reflection needs more samples than the pad: zeros first (upstream's pad1d).
            extra = self.pad - x.shape[-1] + 1
            x = F.pad(F.pad(x, (0, extra)), (self.pad, 0), mode="reflect")[..., :-extra]
        else:
            x = F.pad(x, (self.pad, 0), mode=self.pad_mode)
        return self.conv(x)


class CausalConvTranspose(nn.Module):
    """ConvTranspose1d whose last kernel - stride outputs (which the next frame would
    complete) are dropped: length x stride, causal."""

    def __init__(self, dim: int, kernel: int, stride: int, weight_norm: bool) -> None:
        super().__init__()
        conv = nn.ConvTranspose1d(dim, dim, kernel, stride=stride, bias=False)
        self.conv = nn.utils.parametrizations.weight_norm(conv) if weight_norm else conv
        self.trim = kernel - stride

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv(x)
        return out[..., :out.shape[-1] - self.trim]


def alibi_slopes(heads: int) -> Tensor:
    """ALiBi's per-head slopes: 2^(-8 i / n) for a power-of-two head count n; otherwise
    those of the largest power of two below, then every other one of twice that."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * i / n) for i in range(n)]

    if math.log2(heads).is_integer():
        return torch.tensor(geometric(heads))
    m = 2 ** math.floor(math.log2(heads))
    return torch.tensor(geometric(m) + geometric(2 * m)[::2][:heads - m])


class WindowAttention(nn.Module):
    def __init__(self, c: CodecConfig, window: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.window = c.n_heads, c.n_kv_heads, c.head_dim, window
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)
        self.qk_norm = c.qk_norm
        if c.qk_norm:     # over the whole projection, before the heads are split
            self.q_norm = nn.RMSNorm(c.n_heads * c.head_dim, eps=c.qk_norm_eps)
            self.k_norm = nn.RMSNorm(c.n_kv_heads * c.head_dim, eps=c.qk_norm_eps)
        self.register_buffer("slopes", alibi_slopes(c.n_heads), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        pos = torch.arange(n, device=x.device)
        offset = pos[None, :] - pos[:, None]                   # key - query
        bias = self.slopes.to(x.dtype)[:, None, None] * offset.to(x.dtype)
        bias = bias.masked_fill((offset > 0) | (offset < -self.window), float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])
        return self.wo(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class Block(nn.Module):
    def __init__(self, c: CodecConfig, window: int) -> None:
        super().__init__()
        self.attention = WindowAttention(c, window)
        self.feed_forward = FeedForward(c.dim, c.hidden_dim)
        self.attention_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.ffn_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.layer_scale = c.layer_scale
        if c.layer_scale:     # per-channel scales on both branches
            self.attention_scale = nn.Parameter(torch.ones(c.dim))
            self.ffn_scale = nn.Parameter(torch.ones(c.dim))

    def forward(self, x: Tensor) -> Tensor:
        r = self.attention(self.attention_norm(x))
        x = x + (self.attention_scale * r if self.layer_scale else r)
        r = self.feed_forward(self.ffn_norm(x))
        return x + (self.ffn_scale * r if self.layer_scale else r)


class Transformer(nn.Module):
    def __init__(self, c: CodecConfig, layers: int, window: int) -> None:
        super().__init__()
        # A ModuleDict keyed "0", "1", ...: the checkpoint's `layers.N` names.
        self.layers = nn.ModuleDict({str(i): Block(c, window) for i in range(layers)})

    def forward(self, x: Tensor) -> Tensor:       # [B, T, D]
        for layer in self.layers.values():
            x = layer(x)
        return x


class SemanticCodebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embedding_sum", torch.zeros(size, dim))

    def table(self) -> Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class Quantizer(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        self.semantic_codebook = SemanticCodebook(c.semantic_codebook_size, c.semantic_dim)
        self.levels = c.acoustic_codebook_size

    def decode(self, codes: Tensor, dtype: torch.dtype) -> Tensor:
        """codes [B, 1 + acoustic_dim, T] (0-based) -> latent [B, semantic_dim + acoustic_dim, T]."""
        semantic = F.embedding(codes[:, 0], self.semantic_codebook.table()).transpose(1, 2)
        acoustic = codes[:, 1:] * 2 / (self.levels - 1) - 1
        return torch.cat([semantic.to(dtype), acoustic.to(dtype)], dim=1)


class VoxtralCodec(nn.Module):
    """The decoder half of VoxtralTTSAudioTokenizer, under its parameter names."""

    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        self.config = c
        blocks: list[nn.Module] = [CausalConv(c.latent_dim, c.dim, c.decoder_kernels[0], "replicate",
                                              c.conv_weight_norm)]
        for i, (layers, window) in enumerate(zip(c.decoder_lengths, c.decoder_windows())):
            blocks.append(Transformer(c, layers, window))
            last = i + 1 == len(c.decoder_lengths)
            if not last and (c.decoder_kernels[i + 1] != 1 or c.decoder_strides[i + 1] != 1):
                blocks.append(CausalConvTranspose(c.dim, c.decoder_kernels[i + 1], c.decoder_strides[i + 1],
                                                  c.conv_weight_norm))
        self.decoder_blocks = nn.ModuleList(blocks)
        self.quantizer = Quantizer(c)
        self.output_proj = CausalConv(c.dim, c.patch_size, c.patch_kernel, "reflect", c.conv_weight_norm)

    def fold_weight_norm(self) -> "VoxtralCodec":
        """Replace each weight-norm parametrization by the weight it computes (once)."""
        for module in self.modules():
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and nn.utils.parametrize.is_parametrized(module):
                nn.utils.parametrize.remove_parametrizations(module, "weight")
        return self

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, 1 + acoustic_dim, T] (0-based: the talker's codes minus 2) -> audio
        [B, T * samples_per_frame]."""
        x = self.quantizer.decode(codes.long(), self.output_proj.conv.weight.dtype)
        for block in self.decoder_blocks:
            if isinstance(block, Transformer):
                x = block(x.transpose(1, 2)).transpose(1, 2)
            else:
                x = block(x)
        x = self.output_proj(x)                          # [B, patch_size, steps]
        return x.transpose(1, 2).reshape(x.shape[0], -1)

    @torch.inference_mode()
    def decode_window(self, codes: Tensor, left_context: int) -> Tensor:
        """The audio of a window's frames after its first `left_context` (which only give
        context): equal to those frames' audio in a whole decode when left_context >=
        config.context_frames() or the window starts at the utterance's first frame."""
        return self.decode(codes)[:, left_context * self.config.samples_per_frame:]


def load_codec(state: dict[str, Tensor], config: CodecConfig, what: str,
               device: str | torch.device = "cpu") -> VoxtralCodec:
    """The codec from a checkpoint's tensors (`audio_tokenizer.*`, encoder ones ignored),
    strictly, weight norm folded, fp32."""
    codec = VoxtralCodec(config)
    skip = (PREFIX + "input_proj.", PREFIX + "encoder_blocks.")
    ours = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX) and not k.startswith(skip)}
    load_strict(codec, ours, f"{what} ({PREFIX}*)")
    return codec.fold_weight_norm().float().to(device).eval()
