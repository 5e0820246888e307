"""The Gated-DeltaNet core (tritontts.nn.gated_delta) against transformers' Qwen3.5 torch
implementations (torch_chunk_gated_delta_rule for a prefill, torch_causal_conv1d_update for
the conv), fp32: one pass over a sequence equals the reference; the same sequence split in
two with the state carried equals one pass; a perturbed decay does not."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tritontts.nn.gated_delta import causal_conv, delta_rule, gates


def inputs(n=23, hk=2, hv=4, dk=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, hk, dk, generator=g), torch.randn(n, hk, dk, generator=g), torch.randn(n, hv, dv, generator=g),
            torch.randn(n, hv, generator=g), torch.randn(n, hv, generator=g),
            torch.randn(hv, generator=g).abs().log(), torch.randn(hv, generator=g))


def test_delta_rule_equals_transformers_chunked_rule_and_carries_its_state():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    q, k, v, a, b, a_log, dt_bias = inputs()
    g, beta = gates(a, b, a_log, dt_bias)
    state = torch.zeros(v.shape[1], q.shape[2], v.shape[2])
    ours, final = delta_rule(q, k, v, g, beta, state)
    group = v.shape[1] // q.shape[1]
    want, want_final = torch_chunk_gated_delta_rule(
        q.repeat_interleave(group, 1)[None], k.repeat_interleave(group, 1)[None], v[None], g=g[None], beta=beta[None],
        initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)
    diff = (ours - want[0]).abs().max().item()
    first, mid = delta_rule(q[:9], k[:9], v[:9], g[:9], beta[:9], state)
    second, _ = delta_rule(q[9:], k[9:], v[9:], g[9:], beta[9:], mid)
    split = (torch.cat([first, second]) - ours).abs().max().item()
    wrong, _ = delta_rule(q, k, v, g * 1.5, beta, state)
    perturbed = (wrong - want[0]).abs().max().item()
    print(f"vs transformers {diff:.1e} (state {(final - want_final[0]).abs().max():.1e}); split {split:.1e}; "
          f"perturbed decay {perturbed:.1e}")
    assert diff < 1e-5 and (final - want_final[0]).abs().max() < 1e-5 and split < 1e-6 < 1e-3 < perturbed


def test_causal_conv_equals_a_left_padded_conv1d_and_carries_its_history():
    g = torch.Generator().manual_seed(1)
    x, weight, bias = torch.randn(17, 5, generator=g), torch.randn(5, 4, generator=g), torch.randn(5, generator=g)
    want = F.silu(F.conv1d(F.pad(x.T[None], (3, 0)), weight[:, None], bias, groups=5))[0].T
    ours, history = causal_conv(x, torch.zeros(3, 5), weight, bias)
    head, mid = causal_conv(x[:6], torch.zeros(3, 5), weight, bias)
    tail, _ = causal_conv(x[6:], mid, weight, bias)
    assert (ours - want).abs().max() < 1e-6 and torch.equal(history, x[-3:])
    assert (torch.cat([head, tail]) - ours).abs().max() < 1e-6
