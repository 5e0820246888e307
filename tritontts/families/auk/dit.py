"""AuK's DiT: the MMDiT velocity model of its rectified flow, and an Euler sampler that runs
several requests as one batch (our own implementation; torch only).

Network (vLLM-Omni's `auk_transformer.AuKTransformer`, parameter names kept so the released
`transformer.*` tensors load strictly):

  text  [nt, 2048] --txt_proj, RMSNorm--> c [nt, dim]
  audio = [ref latents | noisy target latents], each embedded separately (Linear + masked
      conv position signal), then concatenated: a [np + n, dim]
  `num_layers` double-stream blocks: one joint attention over [a | c] with per-stream
      projections, AdaLN modulation and SwiGLU; rotary positions restart at 0 in each stream
  `num_single_layers` single-stream blocks over [c | a], rotary positions 0..nt+np+n-1
  the target slice -> AdaLN final -> Linear -> velocity [n, 64]

Every block is modulated by the flow-time embedding alone. Attention uses per-head RMSNorm on
Q and K and rotary angles in the adjacent-pair layout over the whole head.

Batching. vLLM-Omni only runs one request at a time (its batch carries the two CFG branches),
so nothing in it is padded. To batch requests with different text, reference and target
lengths we pack each row so that its padding sits only at the END of every sequence: a row's
audio stream is [its ref | its target | pad] and its joint stream [its text | its audio | pad],
gathered from the separately padded pieces. Then each row sees exactly the rotary positions
and conv borders it would see alone, and padding is a key mask plus zeroed outputs. The
gather indices depend only on lengths, so they are built once per trajectory (`Condition`),
together with the text projection and the reference embedding, which do not change across
Euler steps either (the reference recomputes the latter every step).

CFG follows the reference's `cfg_infer`: the unconditional branch zeroes the projected text
(its mask stays: the zero vectors are still attended to) and zeroes the reference latents
BEFORE embedding (so the prompt slot holds the embedding of silence-in-latent-space, not
nothing); the noisy target is shared. v = v_c + cfg * (v_c - v_u). Below cfg 1e-5 the
unconditional branch is skipped, as there.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...weights.checkpoint import CheckpointError, load_strict
from ...nn.dit import (
    AdaLayerNormZero, AdaLayerNormZeroFinal, ConvPositionEmbedding, RotaryEmbedding,
    TimestepEmbedding, apply_rotary)

PREFIX = "transformer."   # the DiT's tensors in auk.safetensors (beside the text-layer fusion)
CFG_OFF = 1e-5            # guidance weights below this skip the unconditional branch
CONFIG_KEYS = ("dim", "heads", "dim_head", "ff_mult", "latent_dim", "text_hidden_dim",
               "num_layers", "num_single_layers", "attn_mask_enabled")


# ------------------------------------------------------------------------------ layers

class SwiGLU(nn.Module):
    """silu(gate) * up, with gate and up from one bias-free projection (gate first)."""

    def __init__(self, dim: int, mult: float) -> None:
        super().__init__()
        inner = int(dim * mult)
        self.linear_in = nn.Linear(dim, 2 * inner, bias=False)
        self.linear_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.linear_in(x).chunk(2, dim=-1)
        return self.linear_out(F.silu(gate) * up)


class AudioEmbedding(nn.Module):
    """Latents -> dim, plus the (padding-aware) conv position signal."""

    def __init__(self, latent_dim: int, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(latent_dim, dim)
        self.conv_pos_embed = ConvPositionEmbedding(dim)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return self.conv_pos_embed(h, valid) + h


def _rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    # Rotation in fp32 whatever the weights: bf16 angles at long positions are radians off.
    return apply_rotary(x.float(), angles).to(x.dtype)


def _split_heads(qkv: torch.Tensor, heads: int, q_norm: nn.Module, k_norm: nn.Module,
                 angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed [B, T, 3 * H * Dh] -> q, k, v [B, H, T, Dh]; RMSNorm per head, then rotary."""
    b, t, _ = qkv.shape
    q, k, v = qkv.view(b, t, 3, heads, -1).permute(2, 0, 3, 1, 4)
    return _rotate(q_norm(q), angles), _rotate(k_norm(k), angles), v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            key_valid: torch.Tensor) -> torch.Tensor:
    """Softmax attention over the valid keys only -> [B, T, H * Dh]. Without padding (one
    request, its CFG rows) no mask is passed: SDPA's unmasked kernels are the faster ones."""
    mask = None if bool(key_valid.all()) else key_valid[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).flatten(2)


class Attention(nn.Module):
    """Self-attention of the single-stream blocks."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * heads * dim_head)
        self.q_norm = nn.RMSNorm(dim_head)
        self.k_norm = nn.RMSNorm(dim_head)
        self.to_out = nn.ModuleList([nn.Linear(heads * dim_head, dim)])  # `to_out.0` upstream

    def forward(self, x: torch.Tensor, valid: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        q, k, v = _split_heads(self.to_qkv(x), self.heads, self.q_norm, self.k_norm, angles)
        return self.to_out[0](_attend(q, k, v, valid)).masked_fill(~valid[..., None], 0.0)


class JointAttention(Attention):
    """One attention over [audio | text] with separate projections and norms per stream."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__(dim, heads, dim_head)
        self.to_qkv_c = nn.Linear(dim, 3 * heads * dim_head)
        self.c_q_norm = nn.RMSNorm(dim_head)
        self.c_k_norm = nn.RMSNorm(dim_head)
        self.to_out_c = nn.Linear(heads * dim_head, dim)

    def forward(  # type: ignore[override]  # the joint form takes the text stream as well
            self, x: torch.Tensor, c: torch.Tensor, x_valid: torch.Tensor, c_valid: torch.Tensor,
            x_angles: torch.Tensor, c_angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xq, xk, xv = _split_heads(self.to_qkv(x), self.heads, self.q_norm, self.k_norm, x_angles)
        cq, ck, cv = _split_heads(self.to_qkv_c(c), self.heads, self.c_q_norm, self.c_k_norm,
                                  c_angles)
        out = _attend(torch.cat([xq, cq], 2), torch.cat([xk, ck], 2), torch.cat([xv, cv], 2),
                      torch.cat([x_valid, c_valid], 1))
        n = x.shape[1]
        x_out = self.to_out[0](out[:, :n]).masked_fill(~x_valid[..., None], 0.0)
        c_out = self.to_out_c(out[:, n:]).masked_fill(~c_valid[..., None], 0.0)
        return x_out, c_out


def _gated_ff(x: torch.Tensor, norm: nn.Module, ff: nn.Module, shift: torch.Tensor,
              scale: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x + gate * ff(LayerNorm(x) * (1 + scale) + shift): every block's second half."""
    return x + gate[:, None] * ff(norm(x) * (1 + scale[:, None]) + shift[:, None])


class DoubleStreamBlock(nn.Module):
    """MMDiT block: joint attention; modulation, residuals and feed-forward per stream."""

    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: float) -> None:
        super().__init__()
        self.attn_norm_c = AdaLayerNormZero(dim)
        self.attn_norm_x = AdaLayerNormZero(dim)
        self.attn = JointAttention(dim, heads, dim_head)
        self.ff_norm_c = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff_c = SwiGLU(dim, ff_mult)
        self.ff_norm_x = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff_x = SwiGLU(dim, ff_mult)

    def forward(self, x: torch.Tensor, c: torch.Tensor, t_emb: torch.Tensor,
                layout: "Layout") -> tuple[torch.Tensor, torch.Tensor]:
        hx, gate_x, shift_fx, scale_fx, gate_fx = self.attn_norm_x(x, t_emb)
        hc, gate_c, shift_fc, scale_fc, gate_fc = self.attn_norm_c(c, t_emb)
        ax, ac = self.attn(hx, hc, layout.audio_valid, layout.text_valid,
                           layout.audio_angles, layout.text_angles)
        x = _gated_ff(x + gate_x[:, None] * ax, self.ff_norm_x, self.ff_x, shift_fx, scale_fx,
                      gate_fx)
        c = _gated_ff(c + gate_c[:, None] * ac, self.ff_norm_c, self.ff_c, shift_fc, scale_fc,
                      gate_fc)
        return x, c


class SingleStreamBlock(nn.Module):
    """DiT block over the joint [text | audio] sequence."""

    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: float) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = SwiGLU(dim, ff_mult)

    def forward(self, h: torch.Tensor, t_emb: torch.Tensor, layout: "Layout") -> torch.Tensor:
        a, gate, shift_f, scale_f, gate_f = self.attn_norm(h, t_emb)
        h = h + gate[:, None] * self.attn(a, layout.joint_valid, layout.joint_angles)
        return _gated_ff(h, self.ff_norm, self.ff, shift_f, scale_f, gate_f)


# ------------------------------------------------------------------------------ batch layout

def _lengths_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


def _pack_index(first: torch.Tensor, first_width: int, second: torch.Tensor,
                width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row i of cat([A, B], dim=1) (A padded to first_width) read as [A_i | B_i | pad]:
    indices [R, width] for take_along_dim and the valid mask. Padding reads index 0 (any
    finite value does: it is masked everywhere downstream)."""
    j = torch.arange(width, device=first.device)[None, :]
    index = torch.where(j < first[:, None], j, first_width + j - first[:, None])
    valid = j < (first + second)[:, None]
    return index.masked_fill(~valid, 0), valid


def _take(seq: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.take_along_dim(seq, index[..., None], dim=1)


@dataclass
class Layout:
    """Where every row's pieces sit in the packed sequences, and the rotary angles for each
    sequence; a function of the lengths only, so one serves a whole trajectory."""
    text_valid: torch.Tensor     # [R, Nt]
    ref_valid: torch.Tensor      # [R, Np]
    target_valid: torch.Tensor   # [R, N]
    audio_index: torch.Tensor    # [R, La] into cat([ref, target], 1)
    audio_valid: torch.Tensor
    joint_index: torch.Tensor    # [R, Lj] into cat([text, audio], 1)
    joint_valid: torch.Tensor
    target_index: torch.Tensor   # [R, N] the target frames in the joint sequence
    text_angles: torch.Tensor    # [Nt, Dh]
    audio_angles: torch.Tensor   # [La, Dh]
    joint_angles: torch.Tensor   # [Lj, Dh]


@dataclass
class Condition:
    """What stays fixed across the Euler steps of a batch: its layout, the projected text
    (zeroed on unconditional rows) and the embedded reference latents."""
    layout: Layout
    context: torch.Tensor        # [R, Nt, dim]
    ref_embedded: torch.Tensor   # [R, Np, dim]


# ------------------------------------------------------------------------------ model

class AuKTransformer(nn.Module):
    """The velocity model. `condition` builds the per-trajectory state once, `velocity` is
    one evaluation; `forward` does both (tests, one-off calls)."""

    def __init__(self, *, dim: int, heads: int, dim_head: int, ff_mult: float,
                 text_hidden_dim: int, num_layers: int, num_single_layers: int,
                 latent_dim: int = 64, attn_mask_enabled: bool = True) -> None:
        super().__init__()
        # attn_mask_enabled is accepted for config compatibility and otherwise unused: the
        # reference never pads (one request, all masks full), where the flag changes nothing;
        # our batches do pad, and only masking padded keys keeps a row equal to itself alone.
        self.dim, self.dim_head, self.latent_dim = dim, dim_head, latent_dim
        self.text_hidden_dim = text_hidden_dim
        self.time_embed = TimestepEmbedding(dim)
        self.txt_proj = nn.Linear(text_hidden_dim, dim)
        self.txt_norm = nn.RMSNorm(dim)
        self.audio_embed = AudioEmbedding(latent_dim, dim)
        self.rotary_embed = RotaryEmbedding(dim_head)
        self.transformer_blocks = nn.ModuleList(
            DoubleStreamBlock(dim, heads, dim_head, ff_mult) for _ in range(num_layers))
        self.single_transformer_blocks = nn.ModuleList(
            SingleStreamBlock(dim, heads, dim_head, ff_mult) for _ in range(num_single_layers))
        self.norm_out = AdaLayerNormZeroFinal(dim)
        self.proj_out = nn.Linear(dim, latent_dim)

    def _angles(self, n: int) -> torch.Tensor:
        if self.rotary_embed.inv_freq.dtype == torch.float32:
            return self.rotary_embed(n)
        # Cast below fp32 (a bf16 model): recompute the frequencies rather than trust rounded
        # ones, as upstream does.
        inv_freq = 1.0 / 10000.0 ** (torch.arange(0, self.dim_head, 2, device=self.device,
                                                  dtype=torch.float32) / self.dim_head)
        pos = torch.arange(n, device=self.device, dtype=torch.float32)
        return torch.outer(pos, inv_freq).repeat_interleave(2, dim=-1)

    @property
    def device(self) -> torch.device:
        return self.proj_out.weight.device

    def layout(self, text_lens: torch.Tensor, ref_lens: torch.Tensor,
               target_lens: torch.Tensor, text_width: int, ref_width: int,
               target_width: int) -> Layout:
        """The packing for rows of these lengths, padded to these widths."""
        audio_len = ref_lens + target_lens
        audio_width = int(audio_len.max())
        joint_width = int((text_lens + audio_len).max())
        audio_index, audio_valid = _pack_index(ref_lens, ref_width, target_lens, audio_width)
        joint_index, joint_valid = _pack_index(text_lens, text_width, audio_len, joint_width)
        k = torch.arange(target_width, device=text_lens.device)[None, :]
        target_valid = k < target_lens[:, None]
        target_index = (text_lens + ref_lens)[:, None] + k
        return Layout(
            text_valid=_lengths_mask(text_lens, text_width),
            ref_valid=_lengths_mask(ref_lens, ref_width),
            target_valid=target_valid,
            audio_index=audio_index, audio_valid=audio_valid,
            joint_index=joint_index, joint_valid=joint_valid,
            target_index=target_index.masked_fill(~target_valid, 0),
            text_angles=self._angles(text_width), audio_angles=self._angles(audio_width),
            joint_angles=self._angles(joint_width))

    def condition(self, text: torch.Tensor, text_lens: torch.Tensor, ref: torch.Tensor,
                  ref_lens: torch.Tensor, target_lens: torch.Tensor, target_width: int,
                  drop: torch.Tensor | None = None) -> Condition:
        """text [R, Nt, text_hidden], ref [R, Np, latent] (Np may be 0), each padded at the
        end to its lengths; drop [R] bool marks CFG-unconditional rows."""
        layout = self.layout(text_lens, ref_lens, target_lens, text.shape[1], ref.shape[1],
                             target_width)
        context = self.txt_norm(self.txt_proj(text))
        if drop is not None:
            context = context.masked_fill(drop[:, None, None], 0.0)
            ref = ref.masked_fill(drop[:, None, None], 0.0)
        if ref.shape[1]:
            ref_embedded = self.audio_embed(ref, layout.ref_valid)
        else:
            ref_embedded = ref.new_zeros(ref.shape[0], 0, self.dim)
        return Condition(layout, context, ref_embedded)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, cond: Condition) -> torch.Tensor:
        """x [R, N, latent] noisy targets (padded at the end), t [R] -> velocity [R, N,
        latent]; padded frames hold zeros."""
        lay = cond.layout
        t_emb = self.time_embed(t)
        target = self.audio_embed(x, lay.target_valid)
        audio = _take(torch.cat([cond.ref_embedded, target], 1), lay.audio_index)
        c = cond.context
        for block in self.transformer_blocks:
            audio, c = block(audio, c, t_emb, lay)
        h = _take(torch.cat([c, audio], 1), lay.joint_index)
        for block in self.single_transformer_blocks:
            h = block(h, t_emb, lay)
        h = _take(h, lay.target_index)
        v = self.proj_out(self.norm_out(h, t_emb))
        return v.masked_fill(~lay.target_valid[..., None], 0.0)

    def forward(self, x: torch.Tensor, text: torch.Tensor, t: torch.Tensor, *,
                ref: torch.Tensor | None = None, text_lens: torch.Tensor | None = None,
                ref_lens: torch.Tensor | None = None, target_lens: torch.Tensor | None = None,
                drop: torch.Tensor | None = None) -> torch.Tensor:
        """One velocity evaluation; lengths default to the full widths, t may be a scalar."""
        rows, device = x.shape[0], x.device

        def full(lens: torch.Tensor | None, width: int) -> torch.Tensor:
            return torch.full((rows,), width, device=device) if lens is None else lens

        if ref is None:
            ref = x.new_zeros(rows, 0, self.latent_dim)
        cond = self.condition(text, full(text_lens, text.shape[1]), ref,
                              full(ref_lens, ref.shape[1]), full(target_lens, x.shape[1]),
                              x.shape[1], drop)
        return self.velocity(x, t.expand(rows) if t.ndim == 0 else t, cond)


def load_transformer(tensors: Mapping[str, torch.Tensor], config: Mapping) -> AuKTransformer:
    """The DiT from auk.safetensors' tensors (its `transformer.*` ones; the text-layer fusion
    beside them is not the DiT's) and the config's `dit` section (+ `latent_dim`)."""
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise CheckpointError(f"AuK DiT config has unknown keys {unknown}; expected a subset "
                              f"of {list(CONFIG_KEYS)}")
    dit = AuKTransformer(**config)
    state = {name[len(PREFIX):]: value for name, value in tensors.items()
             if name.startswith(PREFIX)}
    load_strict(dit, state, "AuK DiT (transformer.*)")
    return dit.eval()


# ------------------------------------------------------------------------------ sampling

def time_grid(nfe: int, sway: float | None, t_grid: Sequence[float] | None = None
              ) -> torch.Tensor:
    """The Euler time points: `t_grid` when given (AuK-Flash's distilled grid), else nfe + 1
    uniform points bent by sway (t + sway * (cos(pi t / 2) - 1 + t); -1 crowds them near
    t = 0, where the flow is least straight). fp32 on CPU."""
    if t_grid is not None:
        grid = torch.tensor([float(v) for v in t_grid], dtype=torch.float32)
        what = f"t_grid {grid.tolist()}"
    else:
        if int(nfe) != nfe or nfe < 1:
            raise ValueError(f"AuK needs nfe >= 1 Euler steps; got {nfe!r}")
        grid = torch.linspace(0, 1, int(nfe) + 1, dtype=torch.float32)
        if sway is not None:
            grid = grid + sway * (torch.cos(math.pi / 2 * grid) - 1 + grid)
        what = f"the grid of nfe={nfe} sway={sway} ({grid.tolist()})"
    if grid.ndim != 1 or grid.numel() < 2:
        raise ValueError(f"{what}: give at least two time points, e.g. [0.0, 1.0]")
    if not bool(torch.all(grid[1:] > grid[:-1])):
        raise ValueError(f"{what} is not strictly increasing: each time point must exceed "
                         "the one before (for a sway grid, use a coefficient in [-1, 1])")
    if not bool(torch.isfinite(grid).all()):
        raise ValueError(f"{what} holds a non-finite value")
    return grid


@dataclass
class SampleRequest:
    """One request's share of a batched trajectory."""
    text: torch.Tensor   # [nt, text_hidden_dim], the fused text condition
    ref: torch.Tensor    # [np, latent_dim] reference latents; np = 0 for none
    frames: int          # target latent frames
    seed: int


def _pad_rows(tensors: Sequence[torch.Tensor], width: int, channels: int, device,
              dtype) -> torch.Tensor:
    out = torch.zeros(len(tensors), width, channels, device=device, dtype=dtype)
    for i, tensor in enumerate(tensors):
        out[i, :tensor.shape[0]] = tensor
    return out


def _check(dit: AuKTransformer, requests: Sequence[SampleRequest]) -> None:
    if not requests:
        raise ValueError("sample_latents needs at least one request")
    for i, r in enumerate(requests):
        if r.text.ndim != 2 or r.text.shape[1] != dit.text_hidden_dim or r.text.shape[0] < 1:
            raise ValueError(f"request {i}: text must be [nt >= 1, {dit.text_hidden_dim}]; "
                             f"got {tuple(r.text.shape)}")
        if r.ref.ndim != 2 or r.ref.shape[1] != dit.latent_dim:
            raise ValueError(f"request {i}: ref must be [np, {dit.latent_dim}] (np may be 0); "
                             f"got {tuple(r.ref.shape)}")
        if int(r.frames) != r.frames or r.frames < 1:
            raise ValueError(f"request {i}: frames must be a positive integer; got {r.frames!r}")


@torch.no_grad()
def sample_latents(dit: AuKTransformer, requests: Sequence[SampleRequest], t_grid: torch.Tensor,
                   cfg: float, cancelled: Callable[[], bool] = lambda: False) -> list[torch.Tensor]:
    """Euler-integrate the flow from each request's seeded noise to its latents [frames,
    latent_dim] (fp32), all requests in one batch sharing `t_grid` (from `time_grid`) and the
    guidance weight `cfg`. Each row equals what the request gives alone, to rounding.

    Noise: torch.randn(frames, latent_dim) in fp32 from a generator seeded with the request's
    seed on the model's device, as vLLM-Omni draws it (so a seed means the same start there).
    The trajectory is kept in fp32; the model sees it in its own dtype.
    """
    _check(dit, requests)
    grid = time_grid(0, None, t_grid.tolist() if torch.is_tensor(t_grid) else t_grid)
    device, dtype = dit.device, dit.proj_out.weight.dtype
    n = len(requests)

    noise = []
    for r in requests:
        generator = torch.Generator(device=device).manual_seed(int(r.seed))
        noise.append(torch.randn(int(r.frames), dit.latent_dim, generator=generator,
                                 device=device, dtype=torch.float32))
    frames = torch.tensor([int(r.frames) for r in requests], device=device)
    width = int(frames.max())
    x = _pad_rows(noise, width, dit.latent_dim, device, torch.float32)

    text_lens = torch.tensor([r.text.shape[0] for r in requests], device=device)
    ref_lens = torch.tensor([r.ref.shape[0] for r in requests], device=device)
    text = _pad_rows([r.text for r in requests], int(text_lens.max()), dit.text_hidden_dim,
                     device, dtype)
    ref = _pad_rows([r.ref for r in requests], int(ref_lens.max()), dit.latent_dim, device,
                    dtype)

    guided = cfg >= CFG_OFF
    drop = None
    if guided:  # rows [cond..., uncond...]: one forward for both branches
        text, ref = text.repeat(2, 1, 1), ref.repeat(2, 1, 1)
        text_lens, ref_lens, rows_frames = text_lens.repeat(2), ref_lens.repeat(2), frames.repeat(2)
        drop = torch.arange(2 * n, device=device) >= n
    else:
        rows_frames = frames
    cond = dit.condition(text, text_lens, ref, ref_lens, rows_frames, width, drop)
    grid = grid.to(device)
    rows = 2 * n if guided else n
    for i in range(grid.numel() - 1):
        if cancelled():         # asked between steps: a client that left stops its trajectory
            raise InterruptedError("cancelled")
        inp = (x.repeat(2, 1, 1) if guided else x).to(dtype)
        v = dit.velocity(inp, grid[i].expand(rows), cond).float()
        if guided:
            v_cond, v_uncond = v.chunk(2)
            v = v_cond + (v_cond - v_uncond) * cfg
        x = x + (grid[i + 1] - grid[i]) * v
    return [x[i, :int(r.frames)] for i, r in enumerate(requests)]
