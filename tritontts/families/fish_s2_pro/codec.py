"""Fish Speech S2 Pro's codec (ours): the "modded causal DAC", 10 codes per frame <-> 44.1 kHz
audio, hop 2048 samples (21.53 frames/s).

Decoding, codes [B, 10, T] -> audio [B, 1, T * 2048]:

  codes -> latent   code 0 picks a row of the semantic codebook (4096 x 8), codes 1..9 rows of
                    the nine residual codebooks (1024 x 8, codes clamped into them); each row
                    goes through its own 1x1 out_proj (8 -> 1024, weight-normed) and the ten
                    results are summed
  post_module       8-layer transformer at the frame rate: RMSNorm (eps 1e-5), fused wqkv,
                    16 heads x 64, interleaved RoPE (base 1e4, tables rounded to bf16),
                    attention causal within a window of 128 frames (the query and 127 before
                    it), SwiGLU 3072, LayerScale on both branches, final RMSNorm
  upsample          2 x [transposed conv k=s=2, ConvNeXt (causal depthwise k7, LayerNorm,
                    4x GELU MLP, gamma)]: 4 latent steps per frame
  decoder           causal conv k7 (1024 -> 1536); per rate (8, 8, 4, 2): Snake, causal
                    transposed conv k=2s (channels halve), residual units with dilations 1, 3, 9
                    (Snake, conv k7, Snake, conv k1); Snake, conv k7 to one channel, tanh

Encoding (a reference clip for voice cloning), audio [B, 1, N] at 44.1 kHz -> codes
[B, 10, ceil(N / 2048)]: right-pad to whole frames; causal conv k7 (1 -> 64); per stride
(2, 4, 8, 8): residual units at half width, Snake, causal conv k=2s (channels double), and
after the last a 4-layer transformer (16 heads x 64, ffn 3072, window 512); Snake, conv k3 to
the latent; downsample 2 x [conv k=s=2, ConvNeXt]; pre_module (as post_module); then the
semantic book picks the nearest (cosine) code for the latent and the nine residual books for
what each leaves over, every search in the book's 8-d in_proj space.

Every convolution is causal (left padding only) and attention never looks ahead, so a
window of codes decodes its newer frames exactly as the whole utterance does once it has
`context_frames()` frames of left context. That is 1026 frames at the released sizes: the
post_module's window compounds over its layers (8 x 127 frames) and the convs after it add
10. Streaming with less (vLLM-Omni uses 25) is an approximation whose error the stage
measures; `decode(codes, first_frame)` keeps RoPE at the frames' absolute positions, which is
what makes enough context exact (the bf16-rounded tables are not exactly shift invariant).

Parameter names are codec.pth's (vLLM-Omni's and upstream's DAC module tree): encoder.block.*,
quantizer.{semantic_quantizer,quantizer}.quantizers.K.{in_proj,out_proj,codebook},
quantizer.{downsample,upsample}.I.{0,1}.*, quantizer.{pre_module,post_module}.*,
decoder.model.*. Causal convs are weight-normed the new way (conv.parametrizations.weight.
original0/1), the quantizer projections the legacy way (weight_g, weight_v). RoPE tables and
attention masks are computed, not stored: files that carry them (*.freqs_cis, *.causal_mask)
have those dropped by load_codec_file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import CheckpointError, ConfigFields, load_strict, read_torch_checkpoint
from ...nn.snake import Snake
from ...nn.llama_format import FeedForward
from ...nn.qwen3 import RMSNorm

__all__ = ["FishCodecConfig", "FishCodec", "load_codec", "load_codec_file", "random_codec_state"]

# Fixed by the architecture (not in any config upstream has): kernels of the residual units,
# the decoder's first and last convs and the encoder's first conv, ConvNeXt's depthwise conv,
# the encoder's last conv; residual-unit dilations; the encoder transformers' head width
# (heads = width // 64, whatever head_dim is) and ffn ratio; ConvNeXt's MLP ratio.
RES_KERNEL = 7
RES_DILATIONS = (1, 3, 9)
IO_KERNEL = 7
CONVNEXT_KERNEL = 7
LATENT_KERNEL = 3
ENCODER_HEAD_WIDTH = 64
ENCODER_FFN_RATIO = 3
CONVNEXT_RATIO = 4

# Derived tables that older upstream code saved with the weights; we compute them instead.
DERIVED_BUFFERS = (".freqs_cis", ".causal_mask")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class FishCodecConfig:
    """Every size of the codec; the defaults are the released S2 Pro codec's (upstream's
    modded_dac_vq config, which the checkpoint's config.json does not repeat)."""
    sample_rate: int = 44100
    encoder_dim: int = 64
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)
    encoder_transformer_layers: tuple[int, ...] = (0, 0, 0, 4)
    encoder_window: int = 512
    encoder_head_dim: int = 64
    latent_dim: int = 1024
    semantic_codebook_size: int = 4096
    n_codebooks: int = 9                   # residual books after the semantic one
    codebook_size: int = 1024
    codebook_dim: int = 8
    downsample_factors: tuple[int, ...] = (2, 2)
    quantizer_layers: int = 8              # pre_module and post_module each
    quantizer_heads: int = 16
    quantizer_head_dim: int = 64
    quantizer_ffn: int = 3072
    quantizer_window: int = 128
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    decoder_dim: int = 1536
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)

    @classmethod
    def from_dict(cls, data: dict[str, Any], fields: ConfigFields | None = None) -> "FishCodecConfig":
        """From a mapping keyed by the field names (a tiny or random checkpoint's override);
        absent keys keep the released values. Errors are CheckpointError via `fields`."""
        f = fields if fields is not None else ConfigFields(data, Path("codec config"))
        d = cls()
        c = cls(
            sample_rate=f.int("sample_rate", d.sample_rate, low=1),
            encoder_dim=f.int("encoder_dim", d.encoder_dim, low=1),
            encoder_rates=f.ints("encoder_rates", d.encoder_rates),
            encoder_transformer_layers=f.ints("encoder_transformer_layers", d.encoder_transformer_layers),
            encoder_window=f.int("encoder_window", d.encoder_window, low=1),
            encoder_head_dim=f.int("encoder_head_dim", d.encoder_head_dim, low=2),
            latent_dim=f.int("latent_dim", d.latent_dim, low=1),
            semantic_codebook_size=f.int("semantic_codebook_size", d.semantic_codebook_size, low=1),
            n_codebooks=f.int("n_codebooks", d.n_codebooks, low=1),
            codebook_size=f.int("codebook_size", d.codebook_size, low=1),
            codebook_dim=f.int("codebook_dim", d.codebook_dim, low=1),
            downsample_factors=f.ints("downsample_factors", d.downsample_factors),
            quantizer_layers=f.int("quantizer_layers", d.quantizer_layers, low=0),
            quantizer_heads=f.int("quantizer_heads", d.quantizer_heads, low=1),
            quantizer_head_dim=f.int("quantizer_head_dim", d.quantizer_head_dim, low=2),
            quantizer_ffn=f.int("quantizer_ffn", d.quantizer_ffn, low=1),
            quantizer_window=f.int("quantizer_window", d.quantizer_window, low=1),
            norm_eps=f.float("norm_eps", d.norm_eps, positive=True),
            rope_base=f.float("rope_base", d.rope_base, positive=True),
            decoder_dim=f.int("decoder_dim", d.decoder_dim, low=1),
            decoder_rates=f.ints("decoder_rates", d.decoder_rates),
        )
        if any(r < 1 for r in (*c.encoder_rates, *c.decoder_rates, *c.downsample_factors)):
            f.fail("encoder_rates", "decoder_rates and downsample_factors must be positive")
        if len(c.encoder_transformer_layers) != len(c.encoder_rates):
            f.fail("encoder_transformer_layers", "needs one entry per encoder rate")
        # Encode and decode must agree on the samples per frame (upstream pads audio to
        # prod(encoder_rates) x 4 and decodes prod(decoder_rates) x 4 per frame).
        if math.prod(c.encoder_rates) != math.prod(c.decoder_rates):
            f.fail("decoder_rates", "must upsample as much as encoder_rates downsample")
        if c.decoder_dim % 2 ** len(c.decoder_rates):
            f.fail("decoder_dim", f"must halve {len(c.decoder_rates)} times")
        for i, layers in enumerate(c.encoder_transformer_layers):
            if layers and c.encoder_width(i) < ENCODER_HEAD_WIDTH:
                f.fail("encoder_transformer_layers",
                       f"block {i} is {c.encoder_width(i)} wide: a transformer needs {ENCODER_HEAD_WIDTH}")
        for rope_dim in (c.quantizer_head_dim, c.encoder_head_dim):
            if rope_dim % 2:
                f.fail("quantizer_head_dim", "and encoder_head_dim must be even (RoPE rotates pairs)")
        return c

    @property
    def num_codebooks(self) -> int:
        return 1 + self.n_codebooks

    @property
    def hop(self) -> int:
        """Samples per frame: the decoder's upsampling times the quantizer's (512 x 4)."""
        return math.prod(self.decoder_rates) * math.prod(self.downsample_factors)

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.hop

    def encoder_width(self, block: int) -> int:
        """Channels out of encoder block `block` (each doubles them)."""
        return self.encoder_dim * 2 ** (block + 1)

    def context_frames(self) -> int:
        """Frames of left context a window needs for its newer frames to decode exactly as in
        the whole utterance: the decode path's receptive field, walked back from the first
        sample of a frame far from the start to the earliest code frame it reads.

        At the released sizes this is 1026: 10 from the convs and 8 x 127 from the
        post_module, whose 128-frame attention window compounds over its 8 layers. That is
        far more than a streaming stage wants to recompute per chunk; the stage uses a
        smaller configurable context (vLLM-Omni: 25) and reports the difference it makes."""
        frame = 1 << 24                              # far enough that no padding is reached
        j = frame * self.hop                         # index of its first sample
        j -= IO_KERNEL - 1                           # decoder's last conv
        for stride in reversed(self.decoder_rates):
            j -= (RES_KERNEL - 1) * sum(RES_DILATIONS)   # the block's residual units
            # Transposed conv k=2s, stride s: output j gets input i when 0 <= j - i*s < 2s.
            j = _ceil_div(j - (2 * stride - 1), stride)
        j -= IO_KERNEL - 1                           # decoder's first conv
        # The upsample stages run in reverse factor order, so walking back meets them in order.
        for factor in self.downsample_factors:
            j -= CONVNEXT_KERNEL - 1                 # ConvNeXt's depthwise conv
            j = _ceil_div(j - (factor - 1), factor)  # transposed conv k=s
        # Each attention layer reads the query's position and window - 1 before it.
        j -= self.quantizer_layers * (self.quantizer_window - 1)
        return frame - j


# --- building blocks -------------------------------------------------------------------

class CausalConv(nn.Module):
    """Conv1d that only looks back: (effective kernel - stride) zeros on the left, and on the
    right just enough that the last output frame is whole, so the output has
    ceil(length / stride) steps. Weight-normed as codec.pth stores it (torch's
    parametrization) unless `weight_norm` is False (the quantizer's plain convs)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1,
                 groups: int = 1, weight_norm: bool = True) -> None:
        super().__init__()
        conv = nn.Conv1d(c_in, c_out, kernel, stride=stride, dilation=dilation, groups=groups)
        self.conv = nn.utils.parametrizations.weight_norm(conv) if weight_norm else conv
        self.stride = stride
        self.left = (kernel - 1) * dilation + 1 - stride

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (self.left, -x.shape[-1] % self.stride)))


class CausalConvTranspose(nn.Module):
    """ConvTranspose1d with its last kernel - stride outputs dropped (the next input step
    would complete them): exactly `stride` outputs per input step, causal."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, weight_norm: bool) -> None:
        super().__init__()
        conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.conv = nn.utils.parametrizations.weight_norm(conv) if weight_norm else conv
        self.trim = kernel - stride

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv(x)
        return out[..., :out.shape[-1] - self.trim]


class ResidualUnit(nn.Module):
    """x + conv1(snake(conv7_dilated(snake(x)))); the causal convs keep the length, so
    upstream's crop of the skip path never applies."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(Snake(dim), CausalConv(dim, dim, RES_KERNEL, dilation=dilation),
                                   Snake(dim), CausalConv(dim, dim, 1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class ConvNeXt(nn.Module):
    """x + gamma * MLP(LayerNorm(causal depthwise conv(x))), per time step; [B, C, T]."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, CONVNEXT_KERNEL, groups=dim, weight_norm=False)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, CONVNEXT_RATIO * dim)
        self.pwconv2 = nn.Linear(CONVNEXT_RATIO * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(self.dwconv(x).transpose(1, 2))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Rope:
    """Interleaved RoPE (pairs 2i, 2i+1) whose cos/sin tables are rounded to bf16, as the
    codec was trained. Tables are computed on the CPU (where upstream builds them) for
    positions 0..n, grown on demand and kept per device; not module state."""

    def __init__(self, head_dim: int, base: float) -> None:
        self.head_dim, self.base = head_dim, base
        self.tables: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def _build(self, n: int) -> tuple[Tensor, Tensor]:
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(n).float(), inv_freq)
        turn = torch.polar(torch.ones_like(angles), angles)
        return turn.real.to(torch.bfloat16), turn.imag.to(torch.bfloat16)

    def __call__(self, x: Tensor, first: int) -> Tensor:
        """Rotate x [B, T, H, D] for positions first .. first + T - 1."""
        end = first + x.shape[1]
        cos, sin = self.tables.get(x.device, (None, None))
        if cos is None or cos.shape[0] < end:
            cos, sin = (t.to(x.device) for t in self._build(max(end, 2 * (0 if cos is None else cos.shape[0]), 256)))
            self.tables[x.device] = (cos, sin)
        # At least fp32 (upstream rotates in fp32; fp64 stays fp64 for exactness checks).
        work = torch.promote_types(x.dtype, torch.float32)
        cos = cos[first:end, None, :].to(work)
        sin = sin[first:end, None, :].to(work)
        pairs = x.to(work).unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        out = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
        return out.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.wqkv = nn.Linear(dim, 3 * heads * head_dim, bias=False)   # rows: q, k, v
        self.wo = nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x: Tensor, rope: Rope, first: int, mask: Tensor,
                past: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x [B, n, C] at positions first.. (after `past`: the rotated keys and values
        [B, m, H, D] of the m positions before) -> (output, all keys and values)."""
        b, n, _ = x.shape
        q, k, v = self.wqkv(x).view(b, n, 3, self.heads, self.head_dim).unbind(2)
        q, k = rope(q, first), rope(k, first)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)), (k, v)


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.attention = Attention(dim, heads, head_dim)
        self.feed_forward = FeedForward(dim, ffn)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)
        self.attention_layer_scale = LayerScale(dim)
        self.ffn_layer_scale = LayerScale(dim)

    def forward(self, x: Tensor, rope: Rope, first: int, mask: Tensor,
                past: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        attended, kv = self.attention(self.attention_norm(x), rope, first, mask, past)
        x = x + self.attention_layer_scale(attended)
        return x + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(x))), kv


class WindowTransformer(nn.Module):
    """Causal transformer whose queries see themselves and the window - 1 steps before;
    channels-first in and out ([B, C, T]), as it sits between convs. `first` is the absolute
    position of the first step (RoPE)."""

    def __init__(self, layers: int, dim: int, heads: int, head_dim: int, ffn: int, window: int,
                 eps: float, rope_base: float) -> None:
        super().__init__()
        self.window = window
        self.layers = nn.ModuleList(TransformerBlock(dim, heads, head_dim, ffn, eps) for _ in range(layers))
        self.norm = RMSNorm(dim, eps)
        self.rope = Rope(head_dim, rope_base)

    def forward(self, x: Tensor, first: int = 0) -> Tensor:
        return self.forward_cached(x, first)[0]

    def forward_cached(self, x: Tensor, first: int = 0, past: list[tuple[Tensor, Tensor]] | None = None
                       ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """x [B, C, n] at positions first.., after `past` (per layer, the rotated keys and
        values of the positions just before) -> (output [B, C, n], per layer the keys and
        values of the last window - 1 positions: what the next steps can still see)."""
        x = x.transpose(1, 2)
        m = 0 if past is None else past[0][0].shape[1]
        queries = torch.arange(m, m + x.shape[1], device=x.device)
        back = queries[:, None] - torch.arange(m + x.shape[1], device=x.device)[None, :]   # query - key
        mask = (back >= 0) & (back < self.window)
        kept = []
        for i, layer in enumerate(self.layers):
            x, (k, v) = layer(x, self.rope, first, mask, None if past is None else past[i])
            keep = max(0, k.shape[1] - (self.window - 1))
            kept.append((k[:, keep:], v[:, keep:]))
        return self.norm(x).transpose(1, 2), kept


# --- quantizer ---------------------------------------------------------------------------

class LegacyWNConv1x1(nn.Module):
    """A 1x1 conv weight-normed the legacy way (codec.pth's weight_g, weight_v): the weight
    is v scaled to norm g per output channel."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.weight_g = nn.Parameter(torch.ones(c_out, 1, 1))
        self.weight_v = nn.Parameter(torch.ones(c_out, c_in, 1))
        self.bias = nn.Parameter(torch.zeros(c_out))

    def forward(self, x: Tensor) -> Tensor:
        weight = self.weight_v * (self.weight_g / self.weight_v.norm(dim=(1, 2), keepdim=True))
        return F.conv1d(x, weight, self.bias)


class VectorQuantizer(nn.Module):
    """One codebook searched (and read) in a low-dimensional projection of the latent."""

    def __init__(self, dim: int, size: int, codebook_dim: int) -> None:
        super().__init__()
        self.size = size
        self.in_proj = LegacyWNConv1x1(dim, codebook_dim)
        self.out_proj = LegacyWNConv1x1(codebook_dim, dim)
        self.codebook = nn.Embedding(size, codebook_dim)

    def lookup(self, codes: Tensor) -> Tensor:
        """codes [B, T] -> latent contribution [B, dim, T]."""
        return self.out_proj(self.codebook(codes).transpose(1, 2))

    def quantize(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """latent [B, dim, T] -> (codes [B, T], the chosen entries' latent [B, dim, T])."""
        low = self.in_proj(z)                                     # [B, d, T]
        b, d, t = low.shape
        query = F.normalize(low.transpose(1, 2).reshape(b * t, d))
        book = F.normalize(self.codebook.weight)
        # Nearest by the squared distance of unit vectors (i.e. largest cosine), written as
        # upstream writes it so near-ties resolve as there.
        dist = query.pow(2).sum(1, keepdim=True) - 2 * query @ book.t() + book.pow(2).sum(1)[None]
        codes = (-dist).argmax(1).view(b, t)
        chosen = self.codebook(codes).transpose(1, 2)
        # Upstream's straight-through form (low + (chosen - low)) rounds like this, and the
        # next residual is taken from it.
        return codes, self.out_proj(low + (chosen - low))


class ResidualQuantizer(nn.Module):
    def __init__(self, dim: int, books: int, size: int, codebook_dim: int) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(VectorQuantizer(dim, size, codebook_dim) for _ in range(books))

    def lookup(self, codes: Tensor) -> Tensor:
        """codes [B, books, T] -> the sum of the books' contributions [B, dim, T]."""
        total = 0.0
        for i, book in enumerate(self.quantizers):
            total = total + book.lookup(codes[:, i])
        return total

    def quantize(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Each book codes what the ones before left: (codes [B, books, T], their sum)."""
        residual, total, codes = z, 0.0, []
        for book in self.quantizers:
            c, zq = book.quantize(residual)
            residual = residual - zq
            total = total + zq
            codes.append(c)
        return torch.stack(codes, dim=1), total


class Quantizer(nn.Module):
    """Downsampled RVQ: frames at a quarter of the latent rate, one semantic book plus
    n_codebooks residual books, transformers on both sides."""

    def __init__(self, c: FishCodecConfig) -> None:
        super().__init__()
        dim = c.latent_dim
        self.semantic_quantizer = ResidualQuantizer(dim, 1, c.semantic_codebook_size, c.codebook_dim)
        self.quantizer = ResidualQuantizer(dim, c.n_codebooks, c.codebook_size, c.codebook_dim)
        self.downsample = nn.Sequential(*(
            nn.Sequential(CausalConv(dim, dim, f, stride=f, weight_norm=False), ConvNeXt(dim))
            for f in c.downsample_factors))
        # Undone in reverse order (upsample.0 undoes the last downsample).
        self.upsample = nn.Sequential(*(
            nn.Sequential(CausalConvTranspose(dim, dim, f, f, weight_norm=False), ConvNeXt(dim))
            for f in reversed(c.downsample_factors)))

        def transformer() -> WindowTransformer:
            return WindowTransformer(c.quantizer_layers, dim, c.quantizer_heads, c.quantizer_head_dim,
                                     c.quantizer_ffn, c.quantizer_window, c.norm_eps, c.rope_base)

        self.pre_module = transformer()
        self.post_module = transformer()
        self.sizes = (c.semantic_codebook_size, c.codebook_size)

    def decode(self, codes: Tensor, first_frame: int) -> Tensor:
        """codes [B, 1 + n, T] -> latent [B, dim, T * prod(factors)]."""
        # Out-of-range codes read the last row, as upstream's clamp does (and never a
        # negative index: the fast AR may sample up to its 4096-way head).
        semantic = codes[:, :1].clamp(0, self.sizes[0] - 1)
        residual = codes[:, 1:].clamp(0, self.sizes[1] - 1)
        z = self.semantic_quantizer.lookup(semantic) + self.quantizer.lookup(residual)
        return self.upsample(self.post_module(z, first_frame))

    def lookup(self, codes: Tensor) -> Tensor:
        """codes [B, 1 + n, T] -> the summed codebook entries [B, dim, T] (decode's first step)."""
        semantic = codes[:, :1].clamp(0, self.sizes[0] - 1)
        residual = codes[:, 1:].clamp(0, self.sizes[1] - 1)
        return self.semantic_quantizer.lookup(semantic) + self.quantizer.lookup(residual)

    def encode(self, z: Tensor) -> Tensor:
        """latent [B, dim, steps] -> codes [B, 1 + n, steps / prod(factors)]."""
        z = self.pre_module(self.downsample(z))
        semantic_codes, semantic_z = self.semantic_quantizer.quantize(z)
        residual_codes, _ = self.quantizer.quantize(z - semantic_z)
        return torch.cat([semantic_codes, residual_codes], dim=1)


# --- encoder, decoder, codec ---------------------------------------------------------------

class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int, transformer: nn.Module) -> None:
        super().__init__()
        half = dim // 2
        self.block = nn.Sequential(*(ResidualUnit(half, d) for d in RES_DILATIONS), Snake(half),
                                   CausalConv(half, dim, 2 * stride, stride=stride), transformer)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, c: FishCodecConfig) -> None:
        super().__init__()
        blocks: list[nn.Module] = [CausalConv(1, c.encoder_dim, IO_KERNEL)]
        for i, (stride, layers) in enumerate(zip(c.encoder_rates, c.encoder_transformer_layers)):
            width = c.encoder_width(i)
            transformer = nn.Identity() if layers == 0 else WindowTransformer(
                layers, width, width // ENCODER_HEAD_WIDTH, c.encoder_head_dim, ENCODER_FFN_RATIO * width,
                c.encoder_window, c.norm_eps, c.rope_base)
            blocks.append(EncoderBlock(width, stride, transformer))
        last = c.encoder_width(len(c.encoder_rates) - 1)
        blocks += [Snake(last), CausalConv(last, c.latent_dim, LATENT_KERNEL)]
        self.block = nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.block = nn.Sequential(Snake(c_in), CausalConvTranspose(c_in, c_out, 2 * stride, stride, True),
                                   *(ResidualUnit(c_out, d) for d in RES_DILATIONS))

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class Decoder(nn.Module):
    def __init__(self, c: FishCodecConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv(c.latent_dim, c.decoder_dim, IO_KERNEL)]
        width = c.decoder_dim
        for stride in c.decoder_rates:
            layers.append(DecoderBlock(width, width // 2, stride))
            width //= 2
        layers += [Snake(width), CausalConv(width, 1, IO_KERNEL), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)


class FishCodec(nn.Module):
    """The whole codec under codec.pth's names (encoder, quantizer, decoder)."""

    def __init__(self, c: FishCodecConfig) -> None:
        super().__init__()
        self.config = c
        self.encoder = Encoder(c)
        self.quantizer = Quantizer(c)
        self.decoder = Decoder(c)

    def fold_weight_norm(self) -> "FishCodec":
        """Replace each weight-norm parametrization by the weight it computes (once); the
        quantizer's 1x1 projections stay as they are (8 x dim: cheap to recompute)."""
        for module in self.modules():
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and nn.utils.parametrize.is_parametrized(module):
                nn.utils.parametrize.remove_parametrizations(module, "weight")
        return self

    def _dtype(self) -> torch.dtype:
        return self.decoder.model[0].conv.bias.dtype

    @torch.inference_mode()
    def decode(self, codes: Tensor, first_frame: int = 0) -> Tensor:
        """codes [B, 10, T] (integer) -> audio [B, 1, T * hop] in the codec's dtype.
        `first_frame`: the absolute index of codes[..., 0] in its utterance (RoPE position);
        0 for a whole utterance."""
        z = self.quantizer.decode(codes.long(), first_frame).to(self._dtype())
        return self.decoder(z)

    @torch.inference_mode()
    def decode_window(self, codes: Tensor, left_context: int, first_frame: int = 0) -> Tensor:
        """The audio of a window's frames after its first `left_context` (context only):
        equal to those frames' audio in a whole decode when left_context >=
        config.context_frames() or the window starts at the utterance's first frame."""
        return self.decode(codes, first_frame)[..., left_context * self.config.hop:]

    def conv_context_frames(self) -> int:
        """Frames of post_module output the convolutions after it look back (10 at released
        size): all of the receptive field but the transformer's."""
        c = self.config
        return c.context_frames() - c.quantizer_layers * (c.quantizer_window - 1)

    @torch.inference_mode()
    def decode_stream(self, codes: Tensor, state: "DecoderStream | None" = None) -> tuple[Tensor, "DecoderStream"]:
        """The next frames of an utterance, codes [B, 10, n] -> (their audio [B, 1, n * hop],
        the state for the frames after them); `state` None starts an utterance. Equal to those
        frames' audio in one whole decode (rounding aside), for the cost of the new frames:
        the post_module attends over its cached keys and values (the last window - 1
        frames of every layer: its whole reach, compounded over the layers, comes through
        them), and the convolutions after it see the last conv_context_frames() of its
        output again."""
        state = state or DecoderStream()
        z = self.quantizer.lookup(codes.long())
        z, past = self.quantizer.post_module.forward_cached(z, state.frames, state.past)
        if state.tail is not None:
            z = torch.cat([state.tail, z], dim=-1)
        context = 0 if state.tail is None else state.tail.shape[-1]
        audio = self.decoder(self.quantizer.upsample(z.to(self._dtype())))
        keep = self.conv_context_frames()
        next_state = DecoderStream(past, z[..., max(0, z.shape[-1] - keep):], state.frames + codes.shape[-1])
        return audio[..., context * self.config.hop:], next_state

    @torch.inference_mode()
    def encode(self, audio: Tensor) -> Tensor:
        """audio [B, 1, N] (or [B, N]) at sample_rate -> codes [B, 10, ceil(N / hop)] (int64).
        The clip is right-padded with silence to whole frames first."""
        if audio.dim() == 2:
            audio = audio[:, None]
        audio = F.pad(audio.to(self._dtype()), (0, -audio.shape[-1] % self.config.hop))
        return self.quantizer.encode(self.encoder(audio))


@dataclass
class DecoderStream:
    """One utterance's decode state between chunks (FishCodec.decode_stream): per
    post_module layer the rotated keys and values of its last window - 1 frames, its last
    outputs (the convolutions' left context), and the frames decoded so far (the next
    chunk's RoPE position)."""
    past: list[tuple[Tensor, Tensor]] | None = None
    tail: Tensor | None = None
    frames: int = 0


# --- checkpoints -------------------------------------------------------------------------

def load_codec_file(path: str | Path) -> dict[str, Tensor]:
    """codec.pth's tensors by name: weights_only load (tensors and plain containers, never
    code), nested "generator" / "state_dict" dicts unwrapped, a "generator." prefix stripped
    (other prefixes, e.g. a training discriminator's, dropped), stored RoPE tables and masks
    dropped. Errors are CheckpointError naming the file."""
    path = Path(path)
    state = read_torch_checkpoint(path, "the codec checkpoint")
    # Training checkpoints nest the weights; unwrap as long as a known wrapper key is there.
    while isinstance(state, dict):
        inner = next((state[k] for k in ("generator", "state_dict") if isinstance(state.get(k), dict)), None)
        if inner is None:
            break
        state = inner
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors by name, got {type(state).__name__}")
    if any(isinstance(k, str) and k.startswith("generator.") for k in state):
        state = {k[len("generator."):]: v for k, v in state.items() if k.startswith("generator.")}
    state = {k: v for k, v in state.items() if not (isinstance(k, str) and k.endswith(DERIVED_BUFFERS))}
    bad = [k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad or not state:
        raise CheckpointError(f"{path}: expected a non-empty dict of tensors by name"
                              + (f"; not tensors: {', '.join(map(str, bad[:5]))}" if bad else ""))
    return state


# codec.pth writers have used both weight-norm styles; each pair is mapped onto the one our
# module uses for that tensor.
_WN_STYLES = ((".parametrizations.weight.original0", ".weight_g"),
              (".parametrizations.weight.original1", ".weight_v"))


def _our_weight_norm_names(state: dict[str, Tensor], expected: set[str]) -> dict[str, Tensor]:
    out = {}
    for key, value in state.items():
        if key not in expected:
            for new, old in _WN_STYLES:
                for a, b in ((old, new), (new, old)):
                    if key.endswith(a) and key[:-len(a)] + b in expected:
                        key = key[:-len(a)] + b
        out[key] = value
    return out


def load_codec(state: dict[str, Tensor], config: FishCodecConfig, what: str,
               device: str | torch.device = "cpu") -> FishCodec:
    """The codec from codec.pth's tensors (as load_codec_file returns them), strictly,
    weight norm folded, fp32, eval mode."""
    codec = FishCodec(config)
    state = _our_weight_norm_names(state, set(codec.state_dict()))
    load_strict(codec, state, what)
    return codec.fold_weight_norm().float().to(device).eval()


def random_codec_state(config: FishCodecConfig, generator: torch.Generator) -> dict[str, Tensor]:
    """Random weights under codec.pth's names that keep every stage near unit scale and the
    audio at a few tenths peak: weight-norm magnitudes 1 (0.3 on each residual unit's
    closing conv, so twelve units do not blow up; 0.08 on the output conv, before tanh),
    random directions, unit-fan-in plain weights, norms near 1, layer scales 0.1, random
    codebooks."""
    with torch.device("meta"):          # names and shapes only: nothing allocated
        model = FishCodec(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    quiet = {name + ".block.3.conv" for name, m in model.named_modules() if isinstance(m, ResidualUnit)}
    out_conv = f"decoder.model.{len(config.decoder_rates) + 2}.conv"

    def randn(shape: tuple[int, ...]) -> Tensor:
        return torch.randn(shape, generator=generator)

    def uniform(shape: tuple[int, ...], low: float, high: float) -> Tensor:
        return low + (high - low) * torch.rand(shape, generator=generator)

    state = {}
    for key, shape in shapes.items():
        owner = key.rsplit(".", 1)[0]
        if key.endswith((".original0", ".weight_g")):
            conv = owner.removesuffix(".parametrizations.weight")
            scale = 0.3 if conv in quiet else 0.08 if conv == out_conv else 1.0
            value = scale * uniform(shape, 0.8, 1.2)
        elif key.endswith((".original1", ".weight_v", "codebook.weight")):
            value = randn(shape)
        elif key.endswith(".alpha"):
            value = uniform(shape, 0.5, 1.5)
        elif key.endswith(".gamma"):
            value = 0.1 * uniform(shape, 0.8, 1.2)
        elif key.endswith(".bias"):
            value = 0.01 * randn(shape)
        elif len(shape) == 1:                                     # norm weights
            value = 1 + 0.05 * randn(shape)
        elif ".upsample." in key:                                 # transposed conv k=s: fan-in = c_in
            value = randn(shape) / math.sqrt(shape[0])
        else:                                                     # linears, plain convs
            value = randn(shape) / math.sqrt(math.prod(shape[1:]))
        state[key] = value.float()
    return state
