"""AuK's VAE (ours, tritontts.families.auk.vae) against vLLM-Omni 0.30's AuKVAE on shared random weights
(a tiny config with the released hop of 480), fp32: the reference's module is filled with
random weights in the release's layout (weight_g / weight_v, filter buffers, global
statistics) plus flow.* tensors, saved as vae.safetensors, and read back by load_vae. Decode
and encode (posterior mean, and a posterior draw from equal generators) match it, a perturbed
weight does not; decoding in windows of the derived context and lookahead equals the whole
decode, a margin cut into the strong part of the reach does not (one frame less of the derived
reach changes nothing measurable: the far reach is below float64 rounding, which a test
shows); released_state_dict round-trips through load_vae; load errors name the file and keys."""
from __future__ import annotations


import pytest
import torch

from tritontts.families.auk.vae import (
    AuKVAE, VAEConfig, anti_aliased_reach, chunk_bounds, decoder_reach, load_vae,
    released_state_dict)
from tritontts.weights.checkpoint import CheckpointError
from tritontts.weights.random_weights import save_safetensors
from tritontts.families.auk.upstream import auk_module

# The released hop (prod of the rates is 480) with narrow layers.
TINY = dict(upsample_rates=[5, 4, 3, 2, 2, 2], upsample_kernel_sizes=[10, 8, 6, 4, 4, 4],
            upsample_initial_channel=128, resblock_kernel_sizes=[3, 7],
            resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], downsample_rates=[2, 2, 2, 3, 4, 5],
            downsample_channels=[2, 4, 4, 8, 8, 16, 16], snake_logscale=True, latent_dim=64,
            use_vae=True, causal=True, flow_hidden_channels=256, act_causal=True)
FRAMES = 130                 # chunks (0, 10) (10, 30) (30, 70) (70, 130): both edges and the interior


def random_released_state(module: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for the reference module's state dict (the release's names). Weight-norm
    gains are O(1) so signals keep their scale through the decoder, smaller in the encoder's
    residual stacks (36 residual units would otherwise grow activations by ~2^36); the FIR
    filters stay as built (they are fixed design, not learned); global_log_std is positive
    (the model takes its square root)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in module.state_dict().items():
        noise = torch.randn(tensor.shape, generator=gen)
        if name.endswith("filter"):
            state[name] = tensor.clone()
        elif name.endswith("weight_g"):
            # conv_post's gain keeps the output inside the clamp (peak ~0.4 instead of 1).
            low = 0.1 if ".layers." in name else 0.1 if name.startswith("conv_post") else 0.5
            state[name] = low + torch.rand(tensor.shape, generator=gen) * low
        elif name.endswith("weight_v"):
            state[name] = noise
        elif name == "global_log_std":
            state[name] = 0.5 + torch.rand(tensor.shape, generator=gen)
        else:                           # biases, snake log-alpha / log-beta, global_mean
            state[name] = 0.1 * noise
    return state


@pytest.fixture(scope="module")
def setup(tmp_path_factory, torch_two_threads):
    """(reference module with weight norm folded by torch, fp32; our module from the file;
    the file; the released-layout state dict written)."""
    with auk_module("auk_vae") as ref:
        reference = ref.AuKVAE.from_config(TINY)
    state = random_released_state(reference)
    state["flow.flows.0.pre.weight"] = torch.randn(256, 64, 1)
    state["flow.flows.0.pre.bias"] = torch.zeros(256)
    path = tmp_path_factory.mktemp("auk-vae") / "vae.safetensors"
    save_safetensors(state, path, torch.float32)
    reference.load_weights(path)                 # its loader: flow.* skipped, fp32 fold
    return reference.eval(), load_vae(path, TINY), path, state


def latents(frames: int = FRAMES, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, frames, 64, generator=torch.Generator().manual_seed(seed))


def waveform(seconds: float = 1.0, seed: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(int(24000 * seconds)) / 24000
    return (0.3 * torch.sin(2 * torch.pi * 220 * t) + 0.05 * torch.randn(t.shape, generator=gen))[None]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


# --- parity ---------------------------------------------------------------------------------

def test_decode_matches_the_reference_and_a_perturbed_weight_does_not(setup):
    reference, ours, _, _ = setup
    z = latents(40)
    with torch.no_grad():
        want = reference.decode(z)
    got = ours.decode(z)
    diff = max_diff(got, want)
    print(f"decode {tuple(got.shape)}: max-abs-diff {diff:.2e} (peak {want.abs().max():.3f})")
    assert got.shape == (1, 40 * 480) and want.abs().max() > 0.05
    assert diff <= 1e-4
    with torch.no_grad():                          # negative control
        ours.resblocks[4].convs1[1].weight[0, 0, 0] += 0.05
    try:
        off = max_diff(ours.decode(z), want)
    finally:
        with torch.no_grad():
            ours.resblocks[4].convs1[1].weight[0, 0, 0] -= 0.05
    print(f"decode with one weight perturbed by 0.05: max-abs-diff {off:.2e}")
    assert off > 1e-4


def test_encode_mean_and_posterior_draw_match_the_reference(setup):
    # Our module as load_vae made it (float64 fold) against the reference's fp32 fold: the
    # fold test below measures that difference on its own (~2e-7 here, far under 1e-4).
    reference, ours, _, _ = setup
    wav = waveform()
    with torch.no_grad():
        want = reference.encode(wav)
        want_draw = reference.encode(wav, sample=True, generator=torch.Generator().manual_seed(7))
    got = ours.encode(wav)
    got_draw = ours.encode(wav, sample=True, generator=torch.Generator().manual_seed(7))
    diff, diff_draw = max_diff(got, want), max_diff(got_draw, want_draw)
    print(f"encode {tuple(got.shape)}: mean max-abs-diff {diff:.2e} (peak {want.abs().max():.2f}), "
          f"draw {diff_draw:.2e} (peak {want_draw.abs().max():.2f})")
    assert got.shape == (1, 50, 64)
    assert diff <= 1e-4 and diff_draw <= 1e-4
    # Negative controls: another seed draws other noise; a perturbed encoder weight shows.
    other = ours.encode(wav, sample=True, generator=torch.Generator().manual_seed(8))
    assert max_diff(other, want_draw) > 0.1 and max_diff(want_draw, want) > 0.1
    head = ours.audio_encoder.generator[-1].layer.weight
    with torch.no_grad():
        head[0, 0, 0] += 0.05
    try:
        off = max_diff(ours.encode(wav), want)
    finally:
        with torch.no_grad():
            head[0, 0, 0] -= 0.05
    print(f"encode with one weight perturbed by 0.05: max-abs-diff {off:.2e}")
    assert off > 1e-3


def test_float64_fold_differs_from_torchs_fp32_fold_by_ulps_only(setup):
    """load_vae folds in float64, the reference in fp32: the weights differ by about one ULP,
    which the decoder keeps at rounding level and the encoder amplifies (measured here)."""
    reference, ours, _, _ = setup
    ref_state, our_state = reference.state_dict(), ours.state_dict()
    weight_diff = max((ref_state[k] - our_state[k]).abs().max().item() / our_state[k].abs().max().item()
                      for k in our_state if k.endswith(".weight"))
    wav = waveform()
    with torch.no_grad():
        want = reference.encode(wav)
    diff = max_diff(ours.encode(wav), want)
    print(f"fold float64 vs fp32: weights {weight_diff:.1e} relative; encode from the file vs the "
          f"reference {diff:.2e} (peak {want.abs().max():.2f})")
    assert weight_diff < 1e-6
    assert diff <= 1e-3


# --- streaming ------------------------------------------------------------------------------

def test_derived_reach_is_52_frames_back_and_7_ahead_at_the_released_size():
    assert anti_aliased_reach() == (8, 2)
    assert decoder_reach(VAEConfig()) == (52, 7)
    assert decoder_reach(VAEConfig.from_init_kwargs(TINY)) == (39, 7)
    assert list(chunk_bounds(130)) == [(0, 10), (10, 30), (30, 70), (70, 130)]
    assert list(chunk_bounds(700)) == [(0, 10), (10, 30), (30, 70), (70, 150), (150, 310), (310, 510), (510, 700)]
    assert list(chunk_bounds(7)) == [(0, 7)]
    assert list(chunk_bounds(0)) == []


def test_chunked_decode_equals_the_whole_decode(setup):
    _, ours, _, _ = setup
    z = latents()
    whole = ours.decode(z)
    chunks = list(ours.decode_chunks(z))
    diff = max_diff(torch.cat(chunks, dim=1), whole)
    peak = whole.abs().max().item()
    print(f"chunks {[c.shape[1] // 480 for c in chunks]} frames: max-abs-diff {diff:.2e} (peak {peak:.3f})")
    assert [c.shape[1] for c in chunks] == [4800, 9600, 19200, 28800]
    assert diff <= 1e-5 * peak


# Negative controls: a margin short of what the walk derives. One frame less than the derived
# (52, 7) is not enough to show: the far end of the reach runs through the Kaiser filters'
# outermost taps (0.002) at every activation, so its influence decays geometrically and falls
# below float64 rounding before the structural bound (tiny random weights, float64: 3 frames
# ahead 8e-8, 4 ahead 2e-16; 28 back 2e-7, 29 back 2e-9, 31 back 8e-14, of a 0.27 peak; see
# test_influence_past_the_margin_is_below_float64_rounding). A margin that cuts into the
# strong part differs plainly: lookahead 2 (inside conv_pre's own 3 frames), context 16.
@pytest.mark.parametrize("left, ahead", [(39, 2), (16, 7)])
def test_a_margin_short_of_the_reach_changes_the_chunk(setup, left, ahead):
    _, ours, _, _ = setup
    z = latents()
    whole = ours.decode(z)[:, 60 * 480:110 * 480]
    assert (ours.left_context_frames, ours.lookahead_frames) == (39, 7)
    ours.left_context_frames, ours.lookahead_frames = left, ahead
    try:
        short = max_diff(ours.decode_range(z, 60, 110), whole)
    finally:
        ours.left_context_frames, ours.lookahead_frames = 39, 7
    print(f"context {left}, lookahead {ahead}: max-abs-diff {short:.2e} (peak {whole.abs().max():.3f})")
    assert short > 1e-3 * whole.abs().max()      # the margins above stay under 1e-5 of it


def test_influence_past_the_margin_is_below_float64_rounding(setup):
    """The walk's bound is safe, not tight: in float64, a latent frame changes no output
    frame further than 4 before it or 31 after it by more than rounding (the tiny random
    weights; learned weights may decay slower, which is why the structural reach is used)."""
    _, ours, _, _ = setup
    model = AuKVAE(ours.config)
    model.load_state_dict(ours.state_dict())
    model = model.double().eval()
    z = latents().double()
    changed = z.clone()
    changed[:, 60] = torch.randn(64, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    delta = (model.decode(z) - model.decode(changed)).abs().view(FRAMES, 480).amax(1)
    print("influence of frame 60 on frames 55..57 / 88..92: "
          + " ".join(f"{delta[f]:.1e}" for f in (55, 56, 57, 88, 89, 90, 91, 92)))
    assert delta[57] > 1e-3 and delta[88] > 1e-9
    assert delta[:55].max() < 1e-12 and delta[92:].max() < 1e-12
    assert delta[:60 - 7].max() == 0 and delta[60 + 39 + 1:].max() == 0    # the structural bound


# --- the checkpoint -------------------------------------------------------------------------

def test_released_state_dict_round_trips_through_load_vae(setup, tmp_path):
    _, ours, _, _ = setup
    state = released_state_dict(ours, torch.Generator().manual_seed(3))
    assert sum(k.startswith("flow.") for k in state) == 2 and not any(k.endswith(".weight") for k in state
                                                                       if not k.startswith("flow."))
    g, v = state["conv_pre.weight_g"], state["conv_pre.weight_v"]
    assert (g.flatten() - v.flatten(1).norm(dim=1)).abs().min() > 1e-3          # the fold matters
    save_safetensors(state, tmp_path / "vae.safetensors", torch.float32)
    again = load_vae(tmp_path / "vae.safetensors", TINY)
    worst = max((again.state_dict()[k] - t).abs().max().item() / max(t.abs().max().item(), 1e-30)
                for k, t in ours.state_dict().items())
    print(f"released_state_dict -> load_vae: worst relative weight difference {worst:.1e}")
    assert worst < 1e-6


def test_load_errors_name_the_file_and_the_keys(setup, tmp_path):
    _, _, path, state = setup
    missing = tmp_path / "absent" / "vae.safetensors"
    with pytest.raises(CheckpointError, match=f"{missing}: AuK VAE weights not found"):
        load_vae(missing, TINY)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=f"{garbage}: not a readable safetensors file"):
        load_vae(garbage, TINY)
    broken = dict(state)
    del broken["conv_pre.bias"]
    broken["conv_post.extra"] = torch.zeros(1)
    save_safetensors(broken, tmp_path / "broken.safetensors", torch.float32)
    with pytest.raises(CheckpointError, match=r"broken\.safetensors does not match the model; missing keys: "
                                              r"conv_pre\.bias; unexpected keys: conv_post\.extra"):
        load_vae(tmp_path / "broken.safetensors", TINY)
    lone = {k: v for k, v in state.items() if k != "conv_post.weight_v"}
    save_safetensors(lone, tmp_path / "lone.safetensors", torch.float32)
    with pytest.raises(CheckpointError, match=r"lone\.safetensors: conv_post\.weight_g without its conv_post\.weight_v"):
        load_vae(tmp_path / "lone.safetensors", TINY)
    with pytest.raises(CheckpointError, match=r"shape mismatches: .*conv_pre\.weight \(128, 64, 7\) vs \(64, 64, 7\)"):
        load_vae(path, dict(TINY, upsample_initial_channel=64))
    with pytest.raises(CheckpointError, match=r"model_init_kwargs: act_causal must be true"):
        load_vae(path, dict(TINY, act_causal=False))
    with pytest.raises(CheckpointError, match=r"unknown VAE init kwargs \['mystery'\]"):
        load_vae(path, dict(TINY, mystery=1))
