"""VoxCPM2's per-step local modules: the local encoder (a patch of latents -> one embedding),
the local DiT (velocity of a patch given the talker's hidden states), the flow-matching
sampler around it (Euler with classifier-free guidance) and the scalar quantizer (FSQ) the
talker's hidden states pass through.

Attribute names follow upstream's (voxcpm 2.0.3: VoxCPMLocEnc, VoxCPMLocDiTV2 inside
UnifiedCFM as `estimator`, ScalarQuantizationLayer), so the `feat_encoder.*`,
`feat_decoder.*` and `fsq_layer.*` sub-keys of the released model.safetensors load strictly
into LocEnc, LocalCFM and ScalarQuantizer. Inference only: no training losses, no dropout.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tritontts.families.voxcpm2.minicpm4 import MiniCPM4Config, MiniCPM4Stack


class LocEnc(nn.Module):
    """[B, T, P, D] latent patches -> [B, T, H]: a learned token is put before each patch's
    P latents and its output, after full attention over the P + 1 tokens, is the embedding."""

    def __init__(self, config: MiniCPM4Config, input_dim: int = 64) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, config.hidden_size))
        self.in_proj = nn.Linear(input_dim, config.hidden_size)
        self.encoder = MiniCPM4Stack(config)

    def forward(self, x: Tensor) -> Tensor:
        b, t, p, _ = x.shape
        tokens = torch.cat([self.special_token.expand(b, t, 1, -1), self.in_proj(x)], dim=2)
        out = self.encoder(tokens.reshape(b * t, p + 1, -1))
        return out[:, 0].reshape(b, t, -1)


def timestep_embedding(t: Tensor, dim: int, scale: float = 1000.0) -> Tensor:
    """[N] times in [0, 1] -> [N, dim] sinusoids (sin half, then cos half), t scaled by
    1000 as upstream's SinusoidalPosEmb, computed in t's dtype as there."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device)
                      * -(math.log(10000) / (half - 1)))
    args = scale * t.reshape(-1, 1) * freqs
    return torch.cat((args.sin(), args.cos()), dim=-1)


class TimestepMLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LocDiT(nn.Module):
    """The velocity estimator (upstream's VoxCPMLocDiT v2). Its sequence is
    [mu tokens (the talker's states, k of them), time token, prefix patch, noisy patch];
    the outputs at the noisy patch's positions are the velocity."""

    def __init__(self, config: MiniCPM4Config, in_channels: int = 64) -> None:
        super().__init__()
        h = config.hidden_size
        self.hidden_size = h
        self.in_proj = nn.Linear(in_channels, h)
        self.cond_proj = nn.Linear(in_channels, h)
        self.out_proj = nn.Linear(h, in_channels)
        self.time_mlp = TimestepMLP(h)
        self.delta_time_mlp = TimestepMLP(h)
        self.decoder = MiniCPM4Stack(config)

    def forward(self, x: Tensor, mu: Tensor, t: Tensor, cond: Tensor, dt: Tensor) -> Tensor:
        """x [N, C, P] noisy patch, mu [N, k*H] (k conditioning tokens flattened), t and dt
        [N], cond [N, C, P'] previous patch -> velocity [N, C, P] (upstream's layout)."""
        n = x.size(0)
        x = self.in_proj(x.transpose(1, 2))
        cond = self.cond_proj(cond.transpose(1, 2))
        time = (self.time_mlp(timestep_embedding(t, self.hidden_size).to(x.dtype))
                + self.delta_time_mlp(timestep_embedding(dt, self.hidden_size).to(x.dtype)))
        mu = mu.reshape(n, -1, self.hidden_size)
        seq = torch.cat([mu, time.unsqueeze(1), cond, x], dim=1)
        hidden = self.decoder(seq)[:, mu.size(1) + 1 + cond.size(1):]
        return self.out_proj(hidden).transpose(1, 2)


def euler_time_grid(n_timesteps: int, sway_sampling_coef: float = 1.0,
                    dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> Tensor:
    """Upstream's [n + 1] times from 1 (noise) to 0 (data): uniform, then sway-sampled,
    t + s * (cos(pi t / 2) - 1 + t), which crowds the steps near t = 1."""
    t = torch.linspace(1, 0, n_timesteps + 1, device=device, dtype=dtype)
    return t + sway_sampling_coef * (torch.cos(torch.pi / 2 * t) - 1 + t)


class LocalCFM(nn.Module):
    """Conditional flow matching sampler around a LocDiT (upstream's UnifiedCFM, whose only
    weights are the estimator's). The starting noise is an argument, so a caller can draw
    it from a per-request generator."""

    def __init__(self, estimator: LocDiT, in_channels: int = 64, mean_mode: bool = False) -> None:
        super().__init__()
        self.estimator = estimator
        self.in_channels = in_channels
        self.mean_mode = mean_mode

    def guided_velocity(self, x: Tensor, mu: Tensor, t: Tensor, cond: Tensor, dt: Tensor,
                        cfg_value: float | Tensor, use_cfg_zero_star: bool = True) -> Tensor:
        """One estimator call on [conditional; unconditional] (mu zeroed, prefix patch kept),
        combined as CFG-Zero*: the unconditional velocity is first rescaled by its optimal
        projection onto the conditional one, per sample."""
        b = x.size(0)
        times = t.reshape(1).expand(2 * b).to(x.dtype)
        # dt only conditions a mean-velocity model; upstream feeds zeros otherwise.
        dts = (dt.reshape(1).expand(2 * b).to(x.dtype) if self.mean_mode
               else torch.zeros(2 * b, dtype=x.dtype, device=x.device))
        v = self.estimator(torch.cat([x, x]), torch.cat([mu, torch.zeros_like(mu)]), times,
                           torch.cat([cond, cond]), dts)
        pos, neg = v[:b], v[b:]
        if use_cfg_zero_star:
            pf, nf = pos.reshape(b, -1), neg.reshape(b, -1)
            st = ((pf * nf).sum(1, keepdim=True) / ((nf ** 2).sum(1, keepdim=True) + 1e-8))
            neg = neg * st.view(b, *([1] * (pos.dim() - 1)))
        if isinstance(cfg_value, Tensor):     # one value per sample
            cfg_value = cfg_value.to(pos.dtype).reshape(b, *([1] * (pos.dim() - 1)))
        return neg + cfg_value * (pos - neg)

    @torch.no_grad()
    def forward(self, mu: Tensor, cond: Tensor, noise: Tensor, n_timesteps: int = 10,
                cfg_value: float | Tensor = 2.0, temperature: float = 1.0,
                sway_sampling_coef: float = 1.0, use_cfg_zero_star: bool = True) -> Tensor:
        """mu [B, k*H], cond [B, C, P'] (previous patch), noise [B, C, P] standard normal
        -> the generated patch [B, C, P]."""
        x = noise.to(mu.dtype) * temperature
        grid = euler_time_grid(n_timesteps, sway_sampling_coef, mu.dtype, mu.device)
        # CFG-Zero* "zero init": the first ~4% of steps (at least one) take no step at all,
        # since the early velocity estimate is poor.
        zero_init_steps = max(1, int(len(grid) * 0.04))
        # The same recurrence for t and dt as upstream (t -= dt; dt = t - next grid point),
        # so the times match to the last bit in low precision too.
        t, dt = grid[0], grid[0] - grid[1]
        for step in range(1, len(grid)):
            if not (use_cfg_zero_star and step <= zero_init_steps):
                x = x - dt * self.guided_velocity(x, mu, t, cond, dt, cfg_value, use_cfg_zero_star)
            t = t - dt
            if step < len(grid) - 1:
                dt = t - grid[step + 1]
        return x


class ScalarQuantizer(nn.Module):
    """FSQ bottleneck (upstream's ScalarQuantizationLayer): project down, tanh, round to a
    grid of 2 * scale + 1 levels in [-1, 1], project back up."""

    def __init__(self, in_dim: int, out_dim: int, latent_dim: int = 512, scale: int = 9) -> None:
        super().__init__()
        self.scale = scale
        self.in_proj = nn.Linear(in_dim, latent_dim)
        self.out_proj = nn.Linear(latent_dim, out_dim)

    def forward(self, hidden: Tensor) -> Tensor:
        z = torch.tanh(self.in_proj(hidden))
        return self.out_proj(torch.round(z * self.scale) / self.scale)
