"""CosyVoice3 flow decoder: speech tokens -> 80-bin mel (inference only, our own implementation).

Data path of `CausalMaskedDiffWithDiT.inference` (upstream class of the same name):

  [prompt tokens ++ new tokens] --input_embedding--> [1, N, 80]
      --pre_lookahead_layer--> [1, N', 80]    (N' = N, or N - 3 when the last 3 tokens are
                                               only lookahead context, finalize=False)
      --repeat x token_mel_ratio--> mu [1, 80, T]
  x-vector [1, 192] --L2 normalise, spk_embed_affine_layer--> spks [1, 80]
  prompt mel [1, T_p, 80] at frames [0, T_p) of cond [1, 80, T], zeros after
  decoder (CausalConditionalCFM): fixed noise, Euler ODE solve on a cosine time grid, each
      step one DiT call on a [conditional, unconditional] batch (classifier-free guidance)
  -> mel [1, 80, T], of which frames [T_p, T) are returned.

Every parameter and persistent buffer carries upstream's name so the released `flow.pt` of
Fun-CosyVoice3-0.5B-2512 loads with strict key matching (`load_flow_state_dict`). The
decoder's fixed noise is not in that file (upstream keeps it as a plain attribute); here it
is a non-persistent buffer, regenerated from the same seed.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...weights.checkpoint import load_strict
from ...nn.dit import AdaLayerNormZeroFinal, DiTBlock, RotaryEmbedding, TimestepEmbedding
from ...weights.hyperpyyaml import kwargs_of

# Upstream draws the decoder noise once, after seeding torch with 0, as randn([1, 80, 50 * 300]):
# 5 minutes of 50 Hz mel. Every call starts from a prefix of that tensor, which is what lets
# a streamed request reproduce the frames of a whole one.
NOISE_SEED = 0
MAX_MEL_FRAMES = 50 * 300


def _cfm_params(params: Any) -> dict[str, Any]:
    """`cfm_params` as a plain dict: accepts {"content": {...}} (the yaml's DictConfig
    wrapper), the inner dict itself, or an attribute object such as an omegaconf DictConfig."""
    if isinstance(params, Mapping):
        params = kwargs_of(params)
        inner = params.get("content")
        return dict(kwargs_of(inner)) if isinstance(inner, Mapping) else dict(params)
    return {k: getattr(params, k) for k in ("sigma_min", "solver", "t_scheduler",
                                             "training_cfg_rate", "inference_cfg_rate")
            if hasattr(params, k)}


# ---------------------------------------------------------------------------- token encoder

class PreLookaheadLayer(nn.Module):
    """Token encoder with a fixed right context: a conv seeing tokens [t, t + L], then a
    causal conv seeing [t - 2, t], added back to the input. In streaming the caller passes
    the L tokens after the chunk as `context`, so the chunk's last outputs are exactly those
    a whole-utterance run computes; without context the lookahead reads zeros."""

    def __init__(self, in_channels: int, channels: int, pre_lookahead_len: int = 1) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.channels = channels
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3)

    def forward(self, inputs: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """inputs [B, T, C] (and optional context [B, L, C]) -> [B, T, C]."""
        h = inputs.transpose(1, 2)
        if context is not None and context.size(1) > 0:
            if context.size(1) != self.pre_lookahead_len:
                raise ValueError(f"lookahead context must hold {self.pre_lookahead_len} "
                                 f"frames, got {context.size(1)}")
            h = torch.cat([h, context.transpose(1, 2)], dim=2)
        else:
            h = F.pad(h, (0, self.pre_lookahead_len))
        h = F.leaky_relu(self.conv1(h))
        h = self.conv2(F.pad(h, (self.conv2.kernel_size[0] - 1, 0)))
        return h.transpose(1, 2) + inputs


# ------------------------------------------- DiT input embedding (blocks: tritontts.nn.dit)

class CausalConvPositionEmbedding(nn.Module):
    """Relative position signal from two left-padded grouped convs (Mish after each);
    causal, so no frame depends on later frames."""

    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError("kernel_size must be odd")
        self.kernel_size = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, D] -> [B, T, D]."""
        h = x.transpose(1, 2)
        h = self.conv1(F.pad(h, (self.kernel_size - 1, 0)))
        h = self.conv2(F.pad(h, (self.kernel_size - 1, 0)))
        return h.transpose(1, 2)


class InputEmbedding(nn.Module):
    """Per frame [noisy mel, cond mel, mu, speaker] -> dim, plus the conv position signal."""

    def __init__(self, mel_dim: int, text_dim: int, out_dim: int, spk_dim: int | None = None) -> None:
        super().__init__()
        self.spk_dim = spk_dim or 0
        self.proj = nn.Linear(mel_dim * 2 + text_dim + self.spk_dim, out_dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(dim=out_dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, mu: torch.Tensor,
                spks: torch.Tensor) -> torch.Tensor:
        """x, cond, mu [B, T, *]; spks [B, spk_dim] -> [B, T, out_dim]."""
        parts = [x, cond, mu]
        if self.spk_dim > 0:
            parts.append(spks.unsqueeze(1).expand(-1, x.size(1), -1))
        h = self.proj(torch.cat(parts, dim=-1))
        return self.conv_pos_embed(h) + h


def chunk_attention_mask(valid: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Streaming mask [B, 1, T, T]: frame i sees every valid frame up to the end of its own
    chunk of `chunk_size` frames (chunks counted from frame 0, all left chunks visible).

    So a frame's view never extends past its chunk: a request cut at a chunk boundary sees,
    for every frame it has, exactly what the whole request sees. Rows that would see nothing
    (only possible inside padding) see everything instead, as upstream does, to keep softmax
    finite; those frames are discarded anyway.
    """
    t = valid.size(1)
    pos = torch.arange(t, device=valid.device)
    chunk_end = (pos // chunk_size + 1) * chunk_size
    mask = valid[:, None, :] & (pos[None, :] < chunk_end[:, None])[None]
    mask = mask | ~mask.any(dim=-1, keepdim=True)
    return mask.unsqueeze(1)


class DiT(nn.Module):
    """The CFM velocity estimator: a diffusion transformer over mel frames, conditioned on
    the flow time (AdaLN), mu, the prompt mel and the speaker vector (input concatenation)."""

    def __init__(self, *, dim: int, depth: int = 8, heads: int = 8, dim_head: int = 64,
                 dropout: float = 0.1, ff_mult: float = 4, mel_dim: int = 80,
                 mu_dim: int | None = None, long_skip_connection: bool = False,
                 spk_dim: int | None = None, out_channels: int | None = None,
                 static_chunk_size: int = 50, num_decoding_left_chunks: int = 2) -> None:
        super().__init__()
        self.dim = dim
        self.depth = depth
        self.mel_dim = mel_dim
        self.dropout = dropout  # training-only; inference applies none
        self.out_channels = out_channels
        self.static_chunk_size = int(static_chunk_size)
        # Accepted for config compatibility only: upstream's DiT always lets a chunk see
        # every chunk to its left (it passes -1), whatever the yaml says; so do we.
        self.num_decoding_left_chunks = num_decoding_left_chunks
        self.time_embed = TimestepEmbedding(dim)
        self.input_embed = InputEmbedding(mel_dim, mu_dim if mu_dim is not None else mel_dim, dim, spk_dim)
        self.rotary_embed = RotaryEmbedding(dim_head)
        self.transformer_blocks = nn.ModuleList(
            [DiTBlock(dim, heads, dim_head, ff_mult) for _ in range(depth)])
        self.long_skip_connection = nn.Linear(dim * 2, dim, bias=False) if long_skip_connection else None
        self.norm_out = AdaLayerNormZeroFinal(dim)
        self.proj_out = nn.Linear(dim, mel_dim)
        # Set by a stage that runs `velocity` elsewhere (tritontts.nn.runtime: ONNX, TensorRT);
        # same call, same result tuple.
        self.velocity_runner = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor,
                spks: torch.Tensor, cond: torch.Tensor, streaming: bool = False) -> torch.Tensor:
        """x, mu, cond [B, 80, T]; mask [B, 1, T]; t [B] or scalar; spks [B, 80] ->
        velocity [B, mel_dim, T]. streaming=True applies the static chunk mask."""
        if t.ndim == 0:
            t = t.repeat(x.shape[0])
        velocity = self.velocity_runner or self.velocity
        return velocity(x, mask, mu, t, spks, cond, self.attention_mask(mask, streaming))[0]

    def attention_mask(self, mask: torch.Tensor, streaming: bool) -> torch.Tensor:
        """[B, 1, T, T], True where a frame may attend: the valid frames, and with
        streaming only those up to the end of the frame's own chunk."""
        valid = mask[:, 0].bool()
        if streaming and self.static_chunk_size > 0:
            return chunk_attention_mask(valid, self.static_chunk_size)
        length = valid.shape[1]
        return valid[:, None, None, :].expand(valid.shape[0], 1, length, length)

    def velocity(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor,
                 spks: torch.Tensor, cond: torch.Tensor,
                 attn_mask: torch.Tensor) -> tuple[torch.Tensor]:
        """The network alone (what the ONNX/TensorRT export holds; the mask is built
        outside so one graph serves streaming and whole requests): t [B] ->
        (velocity [B, mel_dim, T],)."""
        x, mu, cond = x.transpose(1, 2), mu.transpose(1, 2), cond.transpose(1, 2)
        t_emb = self.time_embed(t)
        h = self.input_embed(x, cond, mu, spks)
        angles = self.rotary_embed(x.shape[1])
        valid = mask[:, 0].bool()
        skip = h
        for block in self.transformer_blocks:
            h = block(h, t_emb, attn_mask, valid, angles)
        if self.long_skip_connection is not None:
            h = self.long_skip_connection(torch.cat([h, skip], dim=-1))
        return (self.proj_out(self.norm_out(h, t_emb)).transpose(1, 2),)


def velocity_graph(dit: DiT, max_batch: int = 16, max_frames: int = 3000):
    """DiT.velocity as a tritontts.nn.runtime Graph. Batch rows come in conditional /
    unconditional pairs (CFG), so 2 per request; frames are prompt plus speech so far,
    which the streaming chunks grow 50 at a time (opt: a few chunks after a short prompt).
    max_frames bounds TensorRT's profile (60 s: attention memory grows with its square)."""
    from ...nn.runtime import Axis, Graph, Method, TensorSpec

    f32 = torch.float32
    mu_dim = dit.input_embed.proj.in_features - 2 * dit.mel_dim - dit.input_embed.spk_dim
    return Graph(
        name="cosyvoice3_flow_velocity", module=Method(dit, "velocity"),
        inputs=(TensorSpec("x", f32, ("batch", dit.mel_dim, "frames")),
                TensorSpec("mask", f32, ("batch", 1, "frames")),
                TensorSpec("mu", f32, ("batch", mu_dim, "frames")),
                TensorSpec("t", f32, ("batch",)),
                TensorSpec("spks", f32, ("batch", max(dit.input_embed.spk_dim, 1))),
                TensorSpec("cond", f32, ("batch", dit.mel_dim, "frames")),
                TensorSpec("attn_mask", torch.bool, ("batch", 1, "frames", "frames"))),
        outputs=("velocity",),
        axes={"batch": Axis(2, 2, max_batch), "frames": Axis(2, 300, max_frames)},
        output_axes={"velocity": {0: "batch", 2: "frames"}})


# -------------------------------------------------------------------------------- CFM solver

class CausalConditionalCFM(nn.Module):
    """Conditional flow matching decoder: integrates dx/dt = v(x, t) from the fixed noise
    (t = 0) to the mel (t = 1) with Euler steps, v being the classifier-free guided DiT:
    v = (1 + r) * v(x | mu, spks, cond) - r * v(x | 0, 0, 0), r = inference_cfg_rate."""

    def __init__(self, in_channels: int, cfm_params: Any, n_spks: int = 1, spk_emb_dim: int = 64,
                 estimator: nn.Module | Mapping[str, Any] | None = None) -> None:
        super().__init__()
        params = _cfm_params(cfm_params)
        if params.get("solver", "euler") != "euler":
            raise ValueError(f"only the euler solver is implemented, got {params['solver']!r}")
        self.n_feats = in_channels  # training-time bookkeeping upstream; unused here
        self.n_spks = n_spks
        self.spk_emb_dim = spk_emb_dim
        self.t_scheduler = str(params.get("t_scheduler", "cosine"))
        self.inference_cfg_rate = float(params.get("inference_cfg_rate", 0.7))
        if estimator is None:
            raise ValueError("decoder needs an `estimator` (a DiT or its kwargs)")
        self.estimator = estimator if isinstance(estimator, nn.Module) else DiT(**kwargs_of(estimator))
        channels = getattr(self.estimator, "mel_dim", 80)
        generator = torch.Generator(device="cpu").manual_seed(NOISE_SEED)
        # Same values as upstream's seed-0 randn([1, 80, 15000]) (a fresh CPU generator
        # seeded 0 draws what the seeded global one does), without touching global RNG.
        # Not persistent: flow.pt does not hold it.
        noise = torch.randn([1, channels, MAX_MEL_FRAMES], generator=generator, device="cpu")
        self.register_buffer("rand_noise", noise, persistent=False)

    def time_grid(self, n_timesteps: int, like: torch.Tensor) -> torch.Tensor:
        """n_timesteps + 1 points from 0 to 1; the cosine schedule takes small early steps."""
        grid = torch.linspace(0, 1, n_timesteps + 1, device=like.device, dtype=like.dtype)
        if self.t_scheduler == "cosine":
            grid = 1 - torch.cos(grid * 0.5 * torch.pi)
        return grid

    def forward(self, mu: torch.Tensor, mask: torch.Tensor, n_timesteps: int,
                spks: torch.Tensor, cond: torch.Tensor, streaming: bool = False,
                temperature: float = 1.0) -> torch.Tensor:
        """mu, cond [B, 80, T]; mask [B, 1, T]; spks [B, 80] -> mel [B, 80, T] (float32)."""
        if n_timesteps < 1:
            raise ValueError("n_timesteps must be >= 1")
        b, _, length = mu.shape
        if length > self.rand_noise.size(2):
            raise ValueError(f"{length} mel frames exceed the fixed noise ({self.rand_noise.size(2)})")
        x = self.rand_noise[:, :, :length].to(device=mu.device, dtype=mu.dtype).expand(b, -1, -1)
        x = x * temperature
        return self.solve_euler(x, self.time_grid(n_timesteps, mu), mu, mask, spks, cond, streaming)

    def solve_euler(self, x: torch.Tensor, t_grid: torch.Tensor, mu: torch.Tensor,
                    mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
                    streaming: bool = False) -> torch.Tensor:
        """Fixed-grid Euler. Rows [0, B) of each estimator batch are conditional, rows
        [B, 2B) unconditional (mu, spks, cond zeroed). t advances by t += dt with
        dt = grid[k] - t, the same accumulation as upstream, so rounding matches."""
        b = x.size(0)
        mask2 = torch.cat([mask, mask], dim=0)
        mu2 = torch.cat([mu, torch.zeros_like(mu)], dim=0)
        spks2 = torch.cat([spks, torch.zeros_like(spks)], dim=0)
        cond2 = torch.cat([cond, torch.zeros_like(cond)], dim=0)
        r = self.inference_cfg_rate
        t = t_grid[:1]
        for k in range(1, t_grid.numel()):
            dt = t_grid[k] - t
            v = self.estimator(torch.cat([x, x], dim=0), mask2, mu2, t.expand(2 * b), spks2, cond2,
                               streaming=streaming)
            v_cond, v_uncond = v[:b], v[b:]
            x = x + dt * ((1.0 + r) * v_cond - r * v_uncond)
            t = t + dt
        return x.float()


# ------------------------------------------------------------------------------ flow model

class CausalMaskedDiffWithDiT(nn.Module):
    """CosyVoice3's token-to-mel flow: token embedding, lookahead encoder, speaker
    projection and the CFM/DiT decoder. Keyword names are those of the yaml `flow:` block;
    nested blocks may be modules or kwargs dicts (an optional "__class__" key is ignored)."""

    def __init__(self, input_size: int = 512, output_size: int = 80, spk_embed_dim: int = 192,
                 output_type: str = "mel", vocab_size: int = 4096, input_frame_rate: int = 50,
                 only_mask_loss: bool = True, token_mel_ratio: int = 2, pre_lookahead_len: int = 3,
                 pre_lookahead_layer: nn.Module | Mapping[str, Any] | None = None,
                 decoder: nn.Module | Mapping[str, Any] | None = None,
                 decoder_conf: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if pre_lookahead_layer is None or decoder is None:
            raise ValueError("flow needs `pre_lookahead_layer` and `decoder`")
        self.input_size = input_size
        self.output_size = output_size
        self.output_type = output_type
        self.vocab_size = vocab_size
        self.input_frame_rate = input_frame_rate
        self.only_mask_loss = only_mask_loss      # training-only
        self.decoder_conf = decoder_conf          # upstream keeps it; unused at inference
        self.token_mel_ratio = token_mel_ratio
        self.pre_lookahead_len = pre_lookahead_len
        self.input_embedding = nn.Embedding(vocab_size, input_size)
        self.spk_embed_affine_layer = nn.Linear(spk_embed_dim, output_size)
        self.pre_lookahead_layer = (pre_lookahead_layer if isinstance(pre_lookahead_layer, nn.Module)
                                    else PreLookaheadLayer(**kwargs_of(pre_lookahead_layer)))
        if isinstance(decoder, nn.Module):
            self.decoder = decoder
        else:
            decoder = kwargs_of(decoder)
            self.decoder = CausalConditionalCFM(**decoder)
        inner_len = getattr(self.pre_lookahead_layer, "pre_lookahead_len", pre_lookahead_len)
        if inner_len != pre_lookahead_len:
            # inference() splits the context by the outer value, the layer checks the inner one.
            raise ValueError(f"pre_lookahead_len {pre_lookahead_len} != pre_lookahead_layer's {inner_len}")

    @torch.inference_mode()
    def inference(self, token: torch.Tensor, token_len: torch.Tensor, prompt_token: torch.Tensor,
                  prompt_token_len: torch.Tensor, prompt_feat: torch.Tensor,
                  prompt_feat_len: torch.Tensor, embedding: torch.Tensor, streaming: bool,
                  finalize: bool, n_timesteps: int = 10) -> tuple[torch.Tensor, None]:
        """Mel for `token` given the prompt, as upstream's CausalMaskedDiffWithDiT.inference.

        token [B, N] and prompt_token [B, P] (speech codes), their lengths [B];
        prompt_feat [B, T_p, 80] (T_p = token_mel_ratio * P normally); embedding [B, 192].
        B > 1 (the flow stage's batch): rows of equal N, P and T_p, each computed as alone
        (upstream takes one request at a time);
        streaming: chunk-masked attention (what streamed requests use);
        finalize=False: the last pre_lookahead_len tokens are lookahead context only.
        Returns (mel [B, 80, ratio * (P + N - lookahead) - T_p], None); prompt frames are cut.
        prompt_feat_len is accepted for signature compatibility (upstream ignores it too).
        """
        rows = token.size(0)
        if prompt_token.size(0) != rows or prompt_feat.size(0) != rows or embedding.size(0) != rows:
            raise ValueError(f"token, prompt_token, prompt_feat and embedding need the same {rows} rows")
        spks = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))

        tokens = torch.cat([prompt_token, token], dim=1)
        lengths = (prompt_token_len + token_len).to(tokens.device)
        valid = torch.arange(tokens.size(1), device=tokens.device)[None, :] < lengths[:, None]
        emb = self.input_embedding(tokens.clamp(min=0)) * valid.unsqueeze(-1).to(spks.dtype)

        if finalize:
            h = self.pre_lookahead_layer(emb)
        else:
            look = self.pre_lookahead_len
            if emb.size(1) <= look:
                raise ValueError(f"finalize=False needs more than {look} tokens (prompt included)")
            h = self.pre_lookahead_layer(emb[:, :-look], context=emb[:, -look:])
        h = h.repeat_interleave(self.token_mel_ratio, dim=1)

        prompt_frames = prompt_feat.size(1)
        total = h.size(1)
        if total < prompt_frames:
            raise ValueError(f"prompt_feat has {prompt_frames} frames but tokens give only {total}")
        cond = torch.zeros(rows, total, self.output_size, device=h.device, dtype=h.dtype)
        cond[:, :prompt_frames] = prompt_feat.to(h.dtype)
        mask = torch.ones(rows, 1, total, device=h.device, dtype=h.dtype)

        mel = self.decoder(mu=h.transpose(1, 2).contiguous(), mask=mask, n_timesteps=n_timesteps,
                           spks=spks, cond=cond.transpose(1, 2), streaming=streaming)
        return mel[:, :, prompt_frames:].float(), None


def build_flow(flow_kwargs: Mapping[str, Any]) -> CausalMaskedDiffWithDiT:
    """The flow model from the yaml `flow:` block given as plain data (nested blocks as
    kwargs dicts, "__class__" tags allowed). Weights are random until load_flow_state_dict."""
    return CausalMaskedDiffWithDiT(**kwargs_of(flow_kwargs))


def load_flow_state_dict(model: CausalMaskedDiffWithDiT, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Load a flow.pt state dict with strict key and shape matching (CheckpointError names
    every missing, unexpected and wrongly shaped key; nothing is loaded in that case)."""
    load_strict(model, state_dict, "flow state dict")
