"""Qwen3-TTS 12 Hz speech-tokenizer decoder ("Code2Wav"): codec codes -> 24 kHz audio.

One codec frame is 16 codes (codebook 0 semantic, 1..15 acoustic, 2048 entries each) at
12.5 Hz and becomes 1920 samples. The path, every part causal:

  codes [B, 16, T]
    --split RVQ--> sum of codebook vectors, two groups (semantic / acoustic), each group
                   projected by its own 1x1 conv            [B, codebook_dim, T]
    --pre_conv (k=3)-->                                     [B, latent_dim, T]
    --transformer: input_proj, layers of sliding-window attention (window 72, RoPE) and a
      gated MLP with layer scale, RMSNorm, output_proj-->    [B, latent_dim, T]
    --upsample: per ratio (2, 2) a transposed conv + ConvNeXt block --> 4 steps per frame
    --decoder: conv, blocks of SnakeBeta + transposed conv (rates 8, 5, 4, 3) + 3 residual
      units (dilation 1, 3, 9), SnakeBeta, conv to 1 channel, clamp to [-1, 1]
  audio [B, T * 1920]

Module and parameter names are the checkpoint's (`decoder.*` in speech_tokenizer/
model.safetensors with the prefix removed), so `load_code2wav` matches keys strictly.

Streaming (`decode_chunk`) is stateless: the caller passes the new frames with some frames
of left context before them. Because every stage is causal, the new audio equals the
whole-utterance audio exactly once that context covers the decoder's receptive field
(`exact_left_context_frames`: 580 frames for the released config, dominated by 8 stacked
attention windows). Only the transformer runs over the whole window; the convolutional
upsampler, which costs ~100x more per frame, runs on the new frames plus the few frames its
kernels reach back (`conv_context_frames`, 10 for the released config).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import CheckpointError, load_strict, require_dir, require_files
from ...nn.qwen3 import RMSNorm, rotate
from ...engine.vllm_talker import chunk_sizes

__all__ = [
    "Code2WavConfig", "Qwen3TTSCode2Wav", "load_code2wav", "decode_chunk", "decode_streaming",
    "plan_chunks", "CONFIG_FILE", "WEIGHTS_FILE", "STATE_DICT_PREFIX",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
STATE_DICT_PREFIX = "decoder."      # the tokenizer model's attribute holding this decoder


@dataclass(frozen=True)
class Code2WavConfig:
    """The `decoder_config` block of speech_tokenizer/config.json.

    Defaults are the reference config class's defaults, used only for keys the file omits
    (so a file that omits one decodes as the reference would). `codebook_dim` has none
    there either. The released file sets codebook_dim 512, hidden_size 512,
    intermediate_size 1024, head_dim 64 (16 heads: attention is 1024 wide, wider than the
    residual stream), latent_dim 1024, decoder_dim 1536.
    """

    codebook_dim: int
    codebook_size: int = 2048
    num_quantizers: int = 16
    latent_dim: int = 1024
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None          # None: hidden_size // num_attention_heads
    attention_bias: bool = False
    sliding_window: int | None = 72
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    max_position_embeddings: int = 8000
    upsampling_ratios: tuple[int, ...] = (2, 2)
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    decoder_dim: int = 1536
    output_sample_rate: int = 24000      # top level of config.json, not decoder_config


    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        object.__setattr__(self, "upsampling_ratios", tuple(int(r) for r in self.upsampling_ratios))
        object.__setattr__(self, "upsample_rates", tuple(int(r) for r in self.upsample_rates))
        problems = []
        if self.codebook_dim % 2:
            problems.append(f"codebook_dim {self.codebook_dim} must be even (codebooks are half of it)")
        if self.num_quantizers < 2:
            problems.append(f"num_quantizers {self.num_quantizers}: one semantic plus at least one acoustic")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                            f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            problems.append(f"head_dim {self.head_dim} must be even for RoPE")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            problems.append(f"decoder_dim {self.decoder_dim} does not halve {len(self.upsample_rates)} times")
        if self.hidden_act not in _ACTIVATIONS:
            problems.append(f"hidden_act {self.hidden_act!r} not supported ({sorted(_ACTIVATIONS)})")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_dict(cls, decoder_config: Mapping[str, Any], output_sample_rate: int = 24000
                  ) -> "Code2WavConfig":
        """From the decoder_config mapping. Keys that are not fields are ignored, as the
        reference's config class keeps but never reads them: the released file's
        semantic_codebook_size (4096) and vector_quantization_hidden_dimension (the
        reference builds both RVQ groups with codebook_size entries: the semantic codebook
        in the checkpoint is [2048, 256]), attention_dropout, and transformers' bookkeeping.
        Settings that would change the computation but are not implemented (RoPE scaling,
        more than one semantic codebook) raise ValueError."""
        d = dict(decoder_config)
        rope_scaling = d.pop("rope_scaling", None) or d.pop("rope_parameters", None)
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type", "default")) != "default":
            raise ValueError(f"rope_scaling {rope_scaling} not supported (plain RoPE only)")
        if isinstance(rope_scaling, Mapping) and "rope_theta" in rope_scaling:
            d.setdefault("rope_theta", rope_scaling["rope_theta"])
        if int(d.pop("num_semantic_quantizers", 1)) != 1:
            raise ValueError("num_semantic_quantizers must be 1 (the decoder's first RVQ group "
                             "has one codebook)")
        if "codebook_dim" not in d:
            raise ValueError("decoder_config has no codebook_dim")
        if float(d.pop("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError("partial_rotary_factor must be 1 (RoPE over the whole head)")
        known = {f.name for f in fields(cls)} - {"output_sample_rate"}
        return cls(**{k: v for k, v in d.items() if k in known},
                   output_sample_rate=int(output_sample_rate))

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)


_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


# --- convolutions ------------------------------------------------------------------------

class CausalConv(nn.Module):
    """Stride-1 conv that pads (kernel - 1) * dilation zeros on the left only, so output t
    sees inputs <= t and the length is kept. The conv sits in `.conv` because that is the
    checkpoint's nesting (`pre_conv.conv.weight`)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int,
                 dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation,
                              groups=groups)
        self.history = (kernel_size - 1) * dilation     # input steps an output reaches back

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (self.history, 0)))

    def earliest_input(self, index: int) -> int:
        return index - self.history


class CausalUpsample(nn.Module):
    """Transposed conv by `stride` whose output is cut to exactly T * stride samples.

    Input step i writes outputs i*stride .. i*stride + kernel - 1; dropping the
    kernel - stride samples past the end keeps the output causal (output o depends on inputs
    <= o // stride) and stops a chunk from emitting audio that later frames still add to."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.kernel_size, self.stride = kernel_size, stride

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)[..., :x.shape[-1] * self.stride]

    def earliest_input(self, index: int) -> int:
        # smallest i with i * stride + kernel - 1 >= index
        return -((self.kernel_size - 1 - index) // self.stride)


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta per channel; alpha and beta are stored as logs."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        frequency = self.alpha.exp()[None, :, None]
        magnitude = self.beta.exp()[None, :, None]
        # The 1e-9 guard and the reciprocal-then-multiply order are the reference's, so
        # results match it to the bit.
        return x + (1.0 / (magnitude + 1e-9)) * torch.sin(x * frequency).pow(2)


class ConvNeXtBlock(nn.Module):
    """Residual ConvNeXt block on the latent stream: causal depthwise k=7 conv, LayerNorm
    over channels, 4x pointwise MLP with GELU, per-channel gain `gamma`."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(self.dwconv(x).transpose(1, 2))
        y = self.pwconv2(F.gelu(self.pwconv1(y)))
        return x + (self.gamma * y).transpose(1, 2)

    def earliest_input(self, index: int) -> int:
        return self.dwconv.earliest_input(index)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))

    def earliest_input(self, index: int) -> int:
        return self.conv1.earliest_input(index)


class DecoderBlock(nn.Module):
    """Halves the channels and upsamples by `rate`: SnakeBeta, transposed conv (kernel
    2 * rate), then residual units with dilations 1, 3, 9. `block` is the checkpoint's list."""

    def __init__(self, in_dim: int, rate: int) -> None:
        super().__init__()
        out_dim = in_dim // 2
        self.block = nn.ModuleList([SnakeBeta(in_dim), CausalUpsample(in_dim, out_dim, 2 * rate, rate),
                                    *(ResidualUnit(out_dim, d) for d in (1, 3, 9))])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.block:
            x = layer(x)
        return x


# --- transformer -------------------------------------------------------------------------

class LayerScale(nn.Module):
    def __init__(self, dim: int, initial: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), float(initial)))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class SlidingWindowAttention(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                    cfg.num_key_value_heads, cfg.head_dim)
        width, kv_width, bias = self.heads * self.head_dim, self.kv_heads * self.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, width, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_width, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_width, bias=bias)
        self.o_proj = nn.Linear(width, cfg.hidden_size, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, allowed: Tensor) -> Tensor:
        b, t, _ = x.shape

        def split(proj: nn.Linear, heads: int) -> Tensor:
            return proj(x).view(b, t, heads, self.head_dim).transpose(1, 2)

        q = rotate(split(self.q_proj, self.heads), cos, sin)
        k = rotate(split(self.k_proj, self.kv_heads), cos, sin)
        v = split(self.v_proj, self.kv_heads)
        if self.kv_heads != self.heads:      # grouped-query: query head h reads kv head h // group
            group = self.heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                             scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class GatedMLP(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SlidingWindowAttention(cfg)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, allowed: Tensor) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, allowed))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class LatentTransformer(nn.Module):
    """Pre-norm transformer between latent_dim projections. Each position attends to itself
    and the sliding_window - 1 positions before it, so stacking num_hidden_layers layers
    reaches num_hidden_layers * (sliding_window - 1) frames back."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)

    @property
    def reach(self) -> int:
        """Frames of input before a position that can change its output."""
        window = self.cfg.sliding_window
        return self.cfg.num_hidden_layers * (window - 1) if window else math.inf

    def forward(self, x: Tensor) -> Tensor:
        """x [B, T, latent_dim] -> [B, T, latent_dim], positions 0..T-1 (attention is relative,
        so where a window starts does not matter beyond float rounding)."""
        t, head_dim = x.shape[1], self.cfg.head_dim
        positions = torch.arange(t, device=x.device, dtype=torch.float32)
        # RoPE frequencies, angles and their cos/sin in float32 whatever the model dtype. Not
        # a buffer: module.to(bfloat16) would round the frequencies too.
        exponents = torch.arange(0, head_dim, 2, device=x.device, dtype=torch.float32) / head_dim
        angles = positions[:, None] * (1.0 / self.cfg.rope_theta ** exponents)[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        lag = positions[:, None] - positions[None, :]      # query index - key index
        allowed = lag >= 0
        if self.cfg.sliding_window:
            allowed &= lag < self.cfg.sliding_window
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, allowed)
        return self.output_proj(self.norm(h))


# --- codebooks ---------------------------------------------------------------------------

class Codebook(nn.Module):
    """EMA-trained codebook as stored: vectors are embedding_sum / cluster_usage (usage
    clamped at 1e-5 so a never-used entry cannot divide by zero)."""

    def __init__(self, entries: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(entries))
        self.embedding_sum = nn.Parameter(torch.zeros(entries, dim))

    def vectors(self) -> Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _CodebookSlot(nn.Module):
    """Only nesting: the checkpoint names a codebook `vq.layers.N._codebook.*`."""

    def __init__(self, entries: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(entries, dim)


class _Layers(nn.Module):
    def __init__(self, slots: list[_CodebookSlot]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(slots)


class CodebookGroup(nn.Module):
    """Residual codebooks of half the codebook dim, summed, then one 1x1 conv up to
    codebook_dim. `input_proj` is the encoder-side projection: unused when decoding, kept
    so the checkpoint loads strictly."""

    def __init__(self, count: int, entries: int, dim: int) -> None:
        super().__init__()
        half = dim // 2
        self.input_proj = nn.Conv1d(dim, half, 1, bias=False)
        self.output_proj = nn.Conv1d(half, dim, 1, bias=False)
        self.vq = _Layers([_CodebookSlot(entries, half) for _ in range(count)])

    def forward(self, codes: Tensor) -> Tensor:
        """codes [B, count, T] -> [B, dim, T]"""
        total = 0
        for i, slot in enumerate(self.vq.layers):
            total = total + F.embedding(codes[:, i], slot._codebook.vectors())
        return self.output_proj(total.transpose(1, 2))


class SplitCodebooks(nn.Module):
    """Codebook 0 (semantic) and codebooks 1.. (acoustic) have separate output projections."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.rvq_first = CodebookGroup(1, cfg.codebook_size, cfg.codebook_dim)
        self.rvq_rest = CodebookGroup(cfg.num_quantizers - 1, cfg.codebook_size, cfg.codebook_dim)

    def forward(self, codes: Tensor) -> Tensor:
        return self.rvq_first(codes[:, :1]) + self.rvq_rest(codes[:, 1:])


# --- the decoder -------------------------------------------------------------------------

class Qwen3TTSCode2Wav(nn.Module):
    """codes [B, num_quantizers, T] (int) -> audio [B, T * samples_per_frame] in [-1, 1]."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitCodebooks(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = LatentTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalUpsample(cfg.latent_dim, cfg.latent_dim, r, r),
                           ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios)
        dims = [cfg.decoder_dim // 2 ** i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList([
            CausalConv(cfg.latent_dim, cfg.decoder_dim, 7),
            *(DecoderBlock(dims[i], rate) for i, rate in enumerate(cfg.upsample_rates)),
            SnakeBeta(dims[-1]),
            CausalConv(dims[-1], 1, 7),
        ])
        self.samples_per_frame = cfg.samples_per_frame
        self.conv_context_frames = self._trace_conv_context()
        # Set by a stage that runs the networks elsewhere (tritontts.nn.runtime: ONNX, TensorRT).
        self.latents_runner = None
        self.vocode_runner = None

    # Receptive field -----------------------------------------------------------------

    def _conv_stack(self) -> list[nn.Module]:
        """The upsampler's layers in order, flattened to those that look back in time."""
        out: list[nn.Module] = []
        for module in [*(m for pair in self.upsample for m in pair), *self.decoder]:
            parts = module.block if isinstance(module, DecoderBlock) else [module]
            out += [p for p in parts if hasattr(p, "earliest_input")]
        return out

    def _trace_conv_context(self) -> int:
        """Latent frames before a frame that the upsampler reads for that frame's audio:
        follow the frame's first output sample back through every layer's kernel."""
        frame = 10 ** 6          # any frame far from the start; sample indices stay aligned
        index = frame * self.samples_per_frame
        for layer in reversed(self._conv_stack()):
            index = layer.earliest_input(index)
        return frame - index

    @property
    def exact_left_context_frames(self) -> int:
        """Left context with which `decode_chunk` equals whole-utterance decoding: the
        upsampler's context, the transformer's stacked windows, and pre_conv's k - 1."""
        return self.conv_context_frames + self.pre_transformer.reach + self.pre_conv.history

    # Forward ---------------------------------------------------------------------------

    def latents(self, codes: Tensor) -> Tensor:
        """codes [B, Q, T] -> transformer output [B, latent_dim, T]."""
        if codes.dim() != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"codes must be [B, {self.cfg.num_quantizers}, T], got {tuple(codes.shape)}")
        # An out-of-range code would be a device-side assert on CUDA (the context is lost);
        # the check's host sync is small next to the upsampler.
        if codes.numel() and not 0 <= int(codes.min()) <= int(codes.max()) < self.cfg.codebook_size:
            raise ValueError(f"codes must lie in [0, {self.cfg.codebook_size}) (padding such as -1 "
                             f"has to be cut off before decoding)")
        return (self.latents_runner or self.latents_network)(codes.long())[0]

    def latents_network(self, codes: Tensor) -> tuple[Tensor]:
        """latents without the checks (what the ONNX/TensorRT export holds): codes
        [B, Q, T] int64 -> ([B, latent_dim, T],)."""
        x = self.pre_conv(self.quantizer(codes))
        return (self.pre_transformer(x.transpose(1, 2)).transpose(1, 2),)

    def vocode(self, latents: Tensor) -> Tensor:
        """[B, latent_dim, T] -> audio [B, T * samples_per_frame], clamped to [-1, 1]."""
        return (self.vocode_runner or self.vocoder_network)(latents)[0]

    def vocoder_network(self, latents: Tensor) -> tuple[Tensor]:
        """vocode as an exportable graph: ([B, T * samples_per_frame],)."""
        x = latents
        for step, convnext in self.upsample:
            x = convnext(step(x))
        for layer in self.decoder:
            x = layer(x)
        return (x.clamp(-1.0, 1.0).squeeze(1),)

    def forward(self, codes: Tensor) -> Tensor:
        return self.vocode(self.latents(codes))


def code2wav_graphs(module: Qwen3TTSCode2Wav, max_batch: int = 16, max_frames: int = 1024):
    """The two networks of decode_chunk as tritontts.nn.runtime Graphs: latents over the
    window (left context + new frames: 1 frame at a stream's start, up to the exact left
    context + a 25-frame chunk), and the upsampler over the new frames + its own context."""
    from ...nn.runtime import Axis, Graph, Method, TensorSpec

    cfg = module.cfg
    window = module.exact_left_context_frames + 25
    vocoder_frames = module.conv_context_frames + 25
    latents = Graph(
        name="qwen3_tts_code2wav_latents", module=Method(module, "latents_network"),
        inputs=(TensorSpec("codes", torch.int64, ("batch", cfg.num_quantizers, "frames"),
                           high=cfg.codebook_size),),
        outputs=("latents",),
        axes={"batch": Axis(1, 1, max_batch),
              "frames": Axis(1, min(window, max_frames), max(window, max_frames))},
        output_axes={"latents": {0: "batch", 2: "frames"}})
    vocoder = Graph(
        name="qwen3_tts_code2wav_vocoder", module=Method(module, "vocoder_network"),
        inputs=(TensorSpec("latents", torch.float32, ("batch", cfg.latent_dim, "frames")),),
        outputs=("audio",),
        axes={"batch": Axis(1, 1, max_batch),
              "frames": Axis(1, vocoder_frames, max(vocoder_frames, max_frames))},
        output_axes={"audio": {0: "batch", 1: "samples"}})
    return latents, vocoder


@torch.no_grad()
def decode_chunk(module: Qwen3TTSCode2Wav, codes_window: Tensor, left_context_frames: int) -> Tensor:
    """Audio of the last N frames of `codes_window` [B, Q, L + N], where the first
    L = left_context_frames frames are context already decoded: [B, N * samples_per_frame].

    Same as decoding the window and dropping its first L * samples_per_frame samples (the
    trimming of the reference's chunked_decode and of vLLM-Omni's stateless path), but
    the upsampler only sees the last N + conv_context_frames latents, and context beyond
    exact_left_context_frames is not computed at all. Equals the
    whole-utterance audio when the window starts at frame 0 or
    L >= module.exact_left_context_frames; with less context the transformer misses
    frames its stacked windows would reach (vLLM-Omni's default of 72 is such a case)."""
    total = codes_window.shape[-1]
    if not 0 <= left_context_frames <= total:
        raise ValueError(f"left_context_frames {left_context_frames} not in 0..{total}")
    new = total - left_context_frames
    surplus = left_context_frames - module.exact_left_context_frames
    if surplus > 0:            # frames that cannot reach the new audio: skip their compute
        codes_window, total, left_context_frames = (codes_window[..., surplus:], total - surplus,
                                                    module.exact_left_context_frames)
    latents = module.latents(codes_window)
    keep = new + min(left_context_frames, module.conv_context_frames)
    audio = module.vocode(latents[..., total - keep:])
    return audio[..., audio.shape[-1] - new * module.samples_per_frame:]


def plan_chunks(total_frames: int, chunk_frames: int = 25, initial_chunk_frames: int = 0,
                growth: int | None = None) -> list[tuple[int, int]]:
    """[start, end) frame ranges a stream of total_frames emits (chunk_sizes), the last one
    short."""
    bounds = [0]
    for size in chunk_sizes(chunk_frames, initial_chunk_frames, growth):
        if bounds[-1] >= total_frames:
            break
        bounds.append(min(bounds[-1] + size, total_frames))
    return list(zip(bounds, bounds[1:]))


@torch.no_grad()
def decode_streaming(module: Qwen3TTSCode2Wav, codes: Tensor, chunk_frames: int = 25,
                     left_context_frames: int | None = None, initial_chunk_frames: int = 0,
                     growth: int | None = None) -> Tensor:
    """Decode [B, Q, T] chunk by chunk as a stream would (plan_chunks, decode_chunk on each
    with up to left_context_frames frames before it) and concatenate. None means
    module.exact_left_context_frames."""
    context = module.exact_left_context_frames if left_context_frames is None else left_context_frames
    pieces = []
    for start, end in plan_chunks(codes.shape[-1], chunk_frames, initial_chunk_frames, growth):
        first = max(0, start - context)
        pieces.append(decode_chunk(module, codes[..., first:end], start - first))
    if not pieces:
        return codes.new_zeros((codes.shape[0], 0), dtype=torch.float32)
    return torch.cat(pieces, dim=-1)


# --- checkpoint --------------------------------------------------------------------------

def _read_config(path: Path) -> Code2WavConfig:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    decoder = raw.get("decoder_config") if isinstance(raw, dict) else None
    if not isinstance(decoder, dict):
        raise CheckpointError(f"{path}: no decoder_config object")
    try:
        cfg = Code2WavConfig.from_dict(decoder, raw.get("output_sample_rate", 24000))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: decoder_config: {exc}") from None
    declared = raw.get("decode_upsample_rate")
    if declared is not None and int(declared) != cfg.samples_per_frame:
        raise CheckpointError(f"{path}: decode_upsample_rate {declared} but the decoder's rates "
                              f"multiply to {cfg.samples_per_frame}")
    return cfg


def _read_decoder_weights(path: Path) -> dict[str, Tensor]:
    """The `decoder.*` tensors with the prefix removed; the encoder's are never read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k[len(STATE_DICT_PREFIX):]: f.get_tensor(k)
                    for k in f.keys() if k.startswith(STATE_DICT_PREFIX)}
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def load_code2wav(speech_tokenizer_dir: str | Path, device: str | torch.device = "cpu",
                  dtype: torch.dtype = torch.float32) -> Qwen3TTSCode2Wav:
    """The decoder from a speech_tokenizer/ folder (config.json + model.safetensors), in
    eval mode on `device` / `dtype`. Missing or malformed files and any missing, extra or
    wrongly shaped decoder.* tensor raise CheckpointError naming them."""
    root = require_dir(speech_tokenizer_dir, "Qwen3-TTS speech tokenizer")
    require_files(root, (CONFIG_FILE, WEIGHTS_FILE), "Qwen3-TTS speech tokenizer")
    cfg = _read_config(root / CONFIG_FILE)
    weights = _read_decoder_weights(root / WEIGHTS_FILE)
    if not weights:
        raise CheckpointError(f"{root / WEIGHTS_FILE}: no {STATE_DICT_PREFIX}* tensors")
    module = Qwen3TTSCode2Wav(cfg)
    load_strict(module, weights, f"{root / WEIGHTS_FILE} ({STATE_DICT_PREFIX}*)")
    return module.to(device=device, dtype=dtype).eval()
