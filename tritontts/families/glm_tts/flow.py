"""GLM-TTS flow: speech tokens -> 80-bin mel at 50 Hz (inference only, our own implementation).

Data path of upstream's `Flow.inference_with_cache` (GLM-TTS flow/flow.py):

  tokens = prompt tokens ++ new tokens [1, N]; frames T = N / input_frame_rate * mel_framerate
  cond [1, T, 80]: the prompt mel in frames [0, T_p), zeros after
  speaker: the 192-d CAM++ x-vector, L2-normalised. With `spkr_emb_adaLN` (the released
      model) it is appended to the flow-time embedding that modulates every block; without,
      an affine layer projects it and it joins `cond` on every frame.
  Euler ODE on a cosine time grid (10 steps) of the DiT velocity with classifier-free
      guidance r = 0.7: v = (1 + r) v(x | cond, tokens, speaker) - r v(x | 0, tokens, 0)
  -> mel [1, T, 80], of which frames [T_p, T) are returned.

Streaming (upstream `Token2Wav.token2wav_stream`) re-runs the flow on all tokens so far with
block-causal attention (blocks of [prompt, 25, 50, 200, 200, ...] tokens, see
`block_attention_mask`), and carries the ODE trajectory: the state x entering each Euler step
for the first `override` frames comes from the previous chunk's run (`FlowCache`), so frames
already played keep (almost) their values while later tokens arrive.

The DiT shares its blocks with CosyVoice3's (tritontts.nn.dit); what is GLM-TTS's own is the
token embedding (ConvNeXt-V2 over tokens stretched to the frame rate) and the symmetric conv
position embedding. Parameter names are upstream's (`estimator.*` in flow.pt), so a released
flow.pt loads with strict key matching. The architecture is read from the weights' shapes:
upstream hard-codes it (a `big_model` flag picks 768 or 1024 wide), which no tiny test
checkpoint could satisfy.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...weights.checkpoint import CheckpointError, load_strict
from ...nn.dit import (
    AdaLayerNormZeroFinal, ConvPositionEmbedding, DiTBlock, RotaryEmbedding, TimestepEmbedding)

SPEAKER_DIM = 192           # CAM++ x-vector width
DIM_HEAD = 64               # upstream's DiT always uses 64-wide heads
POSITION_TABLE = 4096       # rows of the token embedding's sinusoid table (upstream's bound)
NOISE_BLOCK_FRAMES = 256    # frame noise is drawn in seeded blocks of this many frames


# ------------------------------------------------------------------------- token embedding

class GRN(nn.Module):
    """Global response normalisation (ConvNeXt-V2) over the time axis."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = torch.norm(x, p=2, dim=1, keepdim=True)
        return self.gamma * (x * (norm / (norm.mean(dim=-1, keepdim=True) + 1e-6))) + self.beta + x


class ConvNeXtV2Block(nn.Module):
    """Depthwise conv (7 taps, centred) -> LayerNorm -> MLP with GRN, residual."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, hidden)
        self.grn = GRN(hidden)
        self.pwconv2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x.transpose(1, 2)).transpose(1, 2)
        h = self.pwconv2(self.grn(F.gelu(self.pwconv1(self.norm(h)))))
        return x + h


def sinusoid_table(dim: int, rows: int) -> torch.Tensor:
    """[rows, dim]: cos of position * frequency in the first half, sin in the second."""
    freqs = 1.0 / (10000.0 ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(rows), freqs).float()
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class TokenEmbedding(nn.Module):
    """Speech tokens [B, N] -> [B, T, dim] at the mel frame rate: each frame takes the token
    nearest-interpolation assigns it (T = 2N at 25 Hz tokens / 50 Hz mel), then a sinusoid
    position signal and ConvNeXt-V2 blocks. Upstream's row `vocab` (one past the last token)
    is its filler id; it is kept so the weights load."""

    def __init__(self, vocab: int, dim: int, conv_layers: int, conv_mult: int = 2) -> None:
        super().__init__()
        self.text_embed = nn.Embedding(vocab + 1, dim)
        self.register_buffer("freqs_cis", sinusoid_table(dim, POSITION_TABLE), persistent=False)
        self.text_blocks = nn.Sequential(*[ConvNeXtV2Block(dim, dim * conv_mult)
                                           for _ in range(conv_layers)])

    def forward(self, tokens: torch.Tensor, frames: int) -> torch.Tensor:
        # Token ids < 2^24 are exact in float32, so the round trip through interpolate is exact.
        stretched = F.interpolate(tokens[:, None].float(), size=frames, mode="nearest")[:, 0].long()
        h = self.text_embed(stretched)
        positions = torch.arange(frames, device=tokens.device).clamp(max=POSITION_TABLE - 1)
        return self.text_blocks(h + self.freqs_cis[positions])


class InputEmbedding(nn.Module):
    """Per frame [noisy mel, cond, token embedding] -> dim, plus the conv position signal
    (upstream's `emb_concator`)."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_dim, dim)
        self.conv_pos_embed = ConvPositionEmbedding(dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, token_emb: torch.Tensor) -> torch.Tensor:
        h = self.proj(torch.cat([x, cond, token_emb], dim=-1))
        return self.conv_pos_embed(h) + h


# ----------------------------------------------------------------------------------- DiT

class GLMTTSDiT(nn.Module):
    """The velocity estimator (upstream's `estimator`, a flow/dit.py DiT)."""

    def __init__(self, *, dim: int = 768, depth: int = 18, heads: int = 12, ff_mult: int = 2,
                 mel_dim: int = 80, vocab: int = 100000, token_dim: int = 512,
                 conv_layers: int = 4, cond_dim: int = 80, speaker_adaln: bool = True) -> None:
        super().__init__()
        self.dim, self.mel_dim, self.cond_dim = dim, mel_dim, cond_dim
        self.speaker_dim = SPEAKER_DIM if speaker_adaln else 0
        self.time_embed = TimestepEmbedding(dim)
        self.text_emb_layer = TokenEmbedding(vocab, token_dim, conv_layers)
        self.emb_concator = InputEmbedding(mel_dim + token_dim + cond_dim, dim)
        self.rotary_embed = RotaryEmbedding(DIM_HEAD)
        self.transformer_blocks = nn.ModuleList(
            DiTBlock(dim, heads, DIM_HEAD, ff_mult, cond_dim=self.speaker_dim) for _ in range(depth))
        self.norm_out = AdaLayerNormZeroFinal(dim, self.speaker_dim)
        self.proj_out = nn.Linear(dim, mel_dim)

    def velocity(self, x: torch.Tensor, cond: torch.Tensor, token_emb: torch.Tensor,
                 t: torch.Tensor, speaker: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, mel]; cond [B, T, cond_dim]; token_emb [B, T, token_dim] (from
        text_emb_layer, which depends on neither x nor t, so a caller computes it once per
        ODE solve); t [B]; speaker [B, 192] (ignored without speaker AdaLN); attn_mask
        [B or 1, 1, T, T] bool -> velocity [B, T, mel]."""
        t_emb = self.time_embed(t)
        if self.speaker_dim:
            t_emb = torch.cat([t_emb, speaker], dim=-1)
        h = self.emb_concator(x, cond, token_emb)
        angles = self.rotary_embed(x.shape[1])
        valid = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        for block in self.transformer_blocks:
            h = block(h, t_emb, attn_mask, valid, angles)
        return self.proj_out(self.norm_out(h, t_emb))


def _token_blocks_to_frames(tokens: int) -> int:
    # Upstream converts block sizes with a 12.5 Hz / 22.05 kHz / 256-hop ratio (6.89 frames
    # per token) although its mel runs at 2 frames per token; the released model was trained
    # with these masks, so the mask keeps that ratio.
    return int(tokens / 12.5 * 22050 / 256)


def block_attention_mask(block_pattern: list[int], frames: int, device=None) -> torch.Tensor:
    """[1, 1, T, T] bool, True where frame i may attend frame j: every frame before the end
    of i's block, plus a look into the next block for frames near their block's end (up to
    half a block, two thirds for blocks over 172 frames). Blocks after the pattern repeat its
    last size (upstream's block_mask_util, vectorised)."""
    sizes = [_token_blocks_to_frames(b) for b in block_pattern]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"block pattern {block_pattern} gives an empty block")
    sizes += [sizes[-1]] * (frames // sizes[-1] + 2)
    ends = torch.tensor(list(itertools.accumulate(sizes)))
    size = torch.tensor(sizes)
    pos = torch.arange(frames)
    block = torch.searchsorted(ends, pos, right=True)
    start = ends[block] - size[block]
    ahead = size[block] - 1 - (pos - start)
    wanted = torch.where(size[block] <= 172, size[block] // 2, (size[block] / 1.5).long())
    end = start + size[block] + (wanted - ahead).clamp(min=0)
    mask = torch.arange(frames)[None, :] < end[:, None]
    return mask[None, None].to(device)


def frame_noise(seed: int, frames: int, mel_dim: int = 80) -> torch.Tensor:
    """The ODE's starting noise [1, frames, mel_dim], a fixed function of (seed, frame): a
    longer run starts every earlier frame from the same values. (Upstream draws randn_like
    from the global generator on every call.)"""
    blocks = []
    for b in range(-(-frames // NOISE_BLOCK_FRAMES)):
        gen = torch.Generator().manual_seed((seed * 1_000_003 + b) % (1 << 63))
        blocks.append(torch.randn(NOISE_BLOCK_FRAMES, mel_dim, generator=gen))
    noise = torch.cat(blocks) if blocks else torch.zeros(0, mel_dim)
    return noise[:frames][None]


@dataclass
class FlowCache:
    """The ODE state entering each Euler step for the first frames of the previous chunk's
    run: steps[k] is [1, frames, mel]; `override` frames of it are reused."""
    steps: list[torch.Tensor]
    override: int


# ---------------------------------------------------------------------------------- flow

class GLMTTSFlow(nn.Module):
    """Tokens + prompt + speaker -> mel (upstream's Flow, inference only)."""

    def __init__(self, dit: GLMTTSDiT, *, input_frame_rate: float = 25, mel_framerate: float = 50,
                 speaker_concat_dim: int = 0, speech_token_cfg: bool = False,
                 cfg_rate: float = 0.7, t_scheduler: str = "cosine", n_timesteps: int = 10) -> None:
        super().__init__()
        self.estimator = dit
        self.input_frame_rate = float(input_frame_rate)
        self.mel_framerate = float(mel_framerate)
        self.speech_token_cfg = speech_token_cfg
        self.cfg_rate = float(cfg_rate)
        self.t_scheduler = t_scheduler
        self.n_timesteps = int(n_timesteps)
        if speaker_concat_dim:
            self.spk_embed_affine_layer = nn.Linear(SPEAKER_DIM, speaker_concat_dim)
        else:
            self.spk_embed_affine_layer = None

    def frames_for(self, tokens: int) -> int:
        return int(tokens / self.input_frame_rate * self.mel_framerate)

    def time_grid(self) -> torch.Tensor:
        grid = torch.linspace(0, 1, self.n_timesteps + 1)
        if self.t_scheduler == "cosine":
            grid = 1 - torch.cos(grid * 0.5 * torch.pi)
        return grid

    @torch.inference_mode()
    def inference(self, tokens: torch.Tensor, prompt_tokens: torch.Tensor, prompt_mel: torch.Tensor,
                  embedding: torch.Tensor, noise: torch.Tensor,
                  block_pattern: list[int] | None = None, cache: FlowCache | None = None,
                  keep: int = 0) -> tuple[torch.Tensor, FlowCache | None]:
        """tokens [1, N], prompt_tokens [1, P], prompt_mel [1, T_p, 80], embedding [1, 192],
        noise [1, >= T, 80] (T = frames of P + N). block_pattern (token units, prompt first)
        selects block-causal attention; None is full attention (a whole utterance).
        cache: the previous chunk's trajectory; keep: how many leading frames of this run's
        trajectory to return as the next cache (0: none).
        -> (mel [1, T - T_p, 80], FlowCache or None)."""
        dit = self.estimator
        device = tokens.device
        all_tokens = torch.cat([prompt_tokens, tokens], dim=1).long()
        frames = self.frames_for(all_tokens.shape[1])
        prompt_frames = min(prompt_mel.shape[1], frames)
        mel_cond = torch.zeros(1, frames, dit.mel_dim, device=device)
        mel_cond[:, :prompt_frames] = prompt_mel[:, prompt_mel.shape[1] - prompt_frames:]
        speaker = F.normalize(embedding.float(), dim=1)
        cond = mel_cond
        if self.spk_embed_affine_layer is not None:
            projected = self.spk_embed_affine_layer(speaker)
            cond = torch.cat([mel_cond, projected[:, None].expand(-1, frames, -1)], dim=-1)
        if block_pattern is not None:
            attn_mask = block_attention_mask(block_pattern, frames, device)
        else:
            attn_mask = torch.ones(1, 1, frames, frames, dtype=torch.bool, device=device)

        # Conditional and unconditional (CFG) rows in one batch, as vLLM-Omni does.
        uncond_tokens = torch.zeros_like(all_tokens) if self.speech_token_cfg else all_tokens
        token_emb = dit.text_emb_layer(torch.cat([all_tokens, uncond_tokens]), frames)
        cond2 = torch.cat([cond, torch.zeros_like(cond)])
        speaker2 = torch.cat([speaker, torch.zeros_like(speaker)])

        x = noise[:, :frames].to(device=device, dtype=torch.float32).clone()
        grid = self.time_grid().to(device)
        t, dt = grid[0], grid[1] - grid[0]
        steps: list[torch.Tensor] = []
        for k in range(1, grid.numel()):
            if cache is not None:
                reuse = min(frames, cache.override, cache.steps[k - 1].shape[1])
                x[:, :reuse] = cache.steps[k - 1][:, :reuse]
            if keep:
                steps.append(x[:, :keep].clone())
            v = dit.velocity(torch.cat([x, x]), cond2, token_emb, t.expand(2), speaker2, attn_mask)
            if self.cfg_rate > 0:
                v = (1.0 + self.cfg_rate) * v[:1] - self.cfg_rate * v[1:]
            else:
                v = v[:1]
            x = x + dt * v
            t = t + dt
            if k < grid.numel() - 1:
                dt = grid[k + 1] - t
        return x[:, prompt_frames:], (FlowCache(steps, keep) if keep else None)


# ------------------------------------------------------------------------------- loading

def flow_state_dict(obj: Any, path) -> dict[str, torch.Tensor]:
    """flow.pt holds the state dict itself or {"model": state dict} (upstream loads both)."""
    if isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping):
        obj = obj["model"]
    if not isinstance(obj, Mapping) or not any(str(k).startswith("estimator.") for k in obj):
        raise CheckpointError(f"{path}: no `estimator.*` weights (not a GLM-TTS flow state dict)")
    return dict(obj)


def _count(state: Mapping[str, torch.Tensor], prefix: str) -> int:
    indices = {int(k[len(prefix):].split(".")[0]) for k in state if k.startswith(prefix)}
    return max(indices) + 1 if indices else 0


def build_flow(config: Mapping[str, Any], state: Mapping[str, torch.Tensor], path="flow.pt") -> GLMTTSFlow:
    """The flow from flow/config's `flow` block (plain data) and flow.pt's state dict, with
    strict key and shape matching (CheckpointError names what does not fit)."""
    def shape(key: str) -> tuple[int, ...]:
        if key not in state:
            raise CheckpointError(f"{path}: missing {key}")
        return tuple(state[key].shape)

    speaker_adaln = bool(config.get("spkr_emb_adaLN", True))
    concat = not bool(config.get("remove_spkr_concat_condition", True))
    mel_dim = int(config.get("mel_dim", 80))
    dim = shape("estimator.proj_out.weight")[1]
    vocab_rows, token_dim = shape("estimator.text_emb_layer.text_embed.weight")
    hidden = shape("estimator.transformer_blocks.0.ff.ff.0.0.weight")[0]
    cond_dim = shape("estimator.emb_concator.proj.weight")[1] - mel_dim - token_dim
    if dim % DIM_HEAD or hidden % dim:
        raise CheckpointError(f"{path}: DiT width {dim} / feed-forward {hidden} are not "
                              f"multiples of {DIM_HEAD} / the width")
    dit = GLMTTSDiT(dim=dim, depth=_count(state, "estimator.transformer_blocks."),
                    heads=dim // DIM_HEAD, ff_mult=hidden // dim, mel_dim=mel_dim,
                    vocab=vocab_rows - 1, token_dim=token_dim,
                    conv_layers=_count(state, "estimator.text_emb_layer.text_blocks."),
                    cond_dim=cond_dim, speaker_adaln=speaker_adaln)
    flow = GLMTTSFlow(dit, input_frame_rate=config.get("input_frame_rate", 25),
                      mel_framerate=config.get("mel_framerate", 50),
                      speaker_concat_dim=(cond_dim - mel_dim) if concat else 0,
                      speech_token_cfg=bool(config.get("speech_token_cfg", False)),
                      t_scheduler=str(config.get("t_scheduler", "cosine")))
    weights = dict(state)
    # x-transformers' rotary buffer is persistent upstream; it is a function of the head
    # width, so a checkpoint with or without it loads.
    weights.setdefault("estimator.rotary_embed.inv_freq", dit.rotary_embed.inv_freq)
    load_strict(flow, weights, f"{path} (GLM-TTS flow)")
    return flow.eval()
