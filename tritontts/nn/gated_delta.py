"""The Gated-DeltaNet token mixer's core (Qwen3.5 / Qwen3-Next linear-attention layers), in
plain torch at any dtype (computed in fp32), one sequence at a time with explicit state:

  conv       a depthwise causal convolution (kernel K, SiLU) over the projected q | k | v;
             its state is the last K - 1 inputs
  delta      per head, with q and k L2-normalised and q scaled by 1/sqrt(d_k):
                 S <- S * exp(g_t)                 g_t = -exp(A_log) * softplus(a_t + dt_bias)
                 S <- S + k_t (beta_t (v_t - S^T k_t))^T        beta_t = sigmoid(b_t)
                 o_t = S^T q_t
             S is [heads, d_k, d_v]; k heads are shared by num_v / num_k value heads in order

vLLM's CPU kernels for this core take bfloat16 only; this is what Gepard's vLLM talker runs
instead, so that it computes in the model's dtype (fp32 for parity with transformers).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_conv(x: Tensor, history: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """x [n, D] new inputs, history [K - 1, D] the ones before them, weight [D, K] ->
    (SiLU(conv) [n, D], the new history [K - 1, D])."""
    k = weight.shape[1]
    seq = torch.cat([history.to(x.dtype), x])                        # [K - 1 + n, D]
    windows = seq.T.unfold(1, k, 1)                                  # [D, n, K]
    y = (windows * weight[:, None, :]).sum(-1).T                     # [n, D]
    if bias is not None:
        y = y + bias
    return F.silu(y), seq[seq.shape[0] - (k - 1):]


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """q, k [n, Hk, dk]; v [n, Hv, dv]; g, beta [n, Hv]; state [Hv, dk, dv] (fp32) ->
    (o [n, Hv, dv], the new state)."""
    group = v.shape[1] // q.shape[1]
    q = l2_normalize(q.float()).repeat_interleave(group, dim=1) / q.shape[-1] ** 0.5
    k = l2_normalize(k.float()).repeat_interleave(group, dim=1)
    v, g, beta = v.float(), g.float(), beta.float()
    out = torch.empty_like(v)
    for t in range(v.shape[0]):
        state = state * g[t].exp()[:, None, None]
        remembered = (state * k[t][:, :, None]).sum(1)                # [Hv, dv]
        state = state + k[t][:, :, None] * ((v[t] - remembered) * beta[t][:, None])[:, None, :]
        out[t] = (state * q[t][:, :, None]).sum(1)
    return out, state


def gates(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """The decay g and the write strength beta from the projections a, b [n, Hv]."""
    return -a_log.float().exp() * F.softplus(a.float() + dt_bias.float()), b.float().sigmoid()
