"""AuK DiT (tritontts.families.auk.dit) against vLLM-Omni 0.30's auk_transformer, fp32, on one set of
random weights shared by state dict; and the batched sampler against each request alone."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tritontts.families.auk.dit import (
    AuKTransformer, SampleRequest, load_transformer, sample_latents, time_grid)
from tritontts.weights.checkpoint import CheckpointError
from tritontts.weights.random_weights import randomize
from tritontts.families.auk.upstream import auk_module

TINY = dict(dim=64, heads=2, dim_head=32, ff_mult=2, text_hidden_dim=48, num_layers=2,
            num_single_layers=2, latent_dim=64, attn_mask_enabled=True)
# AuK-Flash's distilled 4-step grid (the released config's flash_t_grid).
FLASH_T_GRID = [0.0, 0.07612049579620361, 0.2928932309150696, 0.6173166036605835, 1.0]
PARITY = 1e-4
BATCHING = 1e-5


@pytest.fixture(scope="module")
def reference():
    with auk_module("auk_transformer") as ref:
        yield ref


@pytest.fixture(scope="module")
def state():
    model = AuKTransformer(**TINY)
    state = randomize(model, torch.Generator().manual_seed(0))
    # The rotary frequencies are a buffer, not a learned weight: keep their true values.
    state["rotary_embed.inv_freq"] = model.state_dict()["rotary_embed.inv_freq"]
    # Nothing trivially zero: modulation and gates included, so a dropped term shows.
    assert all(t.abs().min() > 0 or t.numel() < 2 for k, t in state.items() if k.endswith("weight"))
    return state


@pytest.fixture(scope="module")
def pair(reference, state):
    ours = AuKTransformer(**TINY)
    ours.load_state_dict(state, strict=True)
    ref = reference.AuKTransformer(**TINY)
    ref.load_state_dict(state, strict=True)
    return ours.eval(), ref.eval()


def _inputs(seed: int, nt: int, np_: int, n: int, rows: int = 1):
    g = torch.Generator().manual_seed(seed)
    text = torch.randn(rows, nt, TINY["text_hidden_dim"], generator=g)
    ref = torch.randn(rows, np_, TINY["latent_dim"], generator=g)
    x = torch.randn(rows, n, TINY["latent_dim"], generator=g)
    return text, ref, x


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


def test_state_dict_names_and_shapes_equal_the_references(pair):
    ours, ref = pair
    assert sorted(ours.state_dict()) == sorted(ref.state_dict())
    assert "rotary_embed.inv_freq" in ours.state_dict()
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
           {k: tuple(v.shape) for k, v in ref.state_dict().items()}


@pytest.mark.parametrize("ref_frames", [0, 9], ids=["no_ref", "ref"])
@pytest.mark.parametrize("cfg_infer", [False, True], ids=["cond", "cfg_infer"])
@torch.no_grad()
def test_velocity_matches_vllm_omni_within_1e4(pair, state, ref_frames, cfg_infer):
    ours, ref = pair
    text, ref_lat, x = _inputs(1, nt=7, np_=ref_frames, n=23, rows=2)
    t = torch.tensor(0.37)
    ones = torch.ones(text.shape[:2], dtype=torch.bool)
    expected = ref(x, text, t, c_mask=ones, ref=ref_lat,
                   ref_mask=torch.ones(ref_lat.shape[:2], dtype=torch.bool), cfg_infer=cfg_infer)
    if cfg_infer:  # rows [cond, cond, uncond, uncond], as the reference orders them
        got = ours(x.repeat(2, 1, 1), text.repeat(2, 1, 1), t, ref=ref_lat.repeat(2, 1, 1),
                   drop=torch.tensor([False, False, True, True]))
    else:
        got = ours(x, text, t, ref=ref_lat)
    diff = _diff(got, expected)
    print(f"velocity ref_frames={ref_frames} cfg_infer={cfg_infer}: max|diff| {diff:.2e}")
    assert expected.abs().max() > 0.1
    assert diff <= PARITY

    # Negative control: one perturbed single-stream weight moves the velocity well past 1e-4.
    bad = AuKTransformer(**TINY).eval()
    bad_state = dict(state)
    bad_state["single_transformer_blocks.1.ff.linear_out.weight"] = (
        state["single_transformer_blocks.1.ff.linear_out.weight"] * 1.01)
    bad.load_state_dict(bad_state)
    if cfg_infer:
        bad_out = bad(x.repeat(2, 1, 1), text.repeat(2, 1, 1), t, ref=ref_lat.repeat(2, 1, 1),
                      drop=torch.tensor([False, False, True, True]))
    else:
        bad_out = bad(x, text, t, ref=ref_lat)
    assert _diff(bad_out, expected) > 10 * PARITY


def _reference_sample(reference, ref_dit, text, ref_lat, frames, seed, **schedule):
    return reference.sample_latents(
        ref_dit, text=text[None], c_mask=torch.ones(1, text.shape[0], dtype=torch.bool),
        ref=ref_lat[None], ref_mask=torch.ones(1, ref_lat.shape[0], dtype=torch.bool),
        gen_frames=frames, generator=torch.Generator().manual_seed(seed), seed=None,
        device="cpu", dtype=torch.float32, **schedule)[0]


@pytest.mark.parametrize("recipe", ["base_nfe6_cfg2_sway-1", "flash_grid_cfg0"])
def test_sample_latents_of_one_request_matches_vllm_omni_within_1e4(reference, pair, recipe):
    ours, ref_dit = pair
    text, ref_lat, _ = _inputs(2, nt=6, np_=11, n=1)
    text, ref_lat = text[0], ref_lat[0]
    if recipe.startswith("base"):
        schedule = dict(nfe=6, cfg_strength=2.0, sway_sampling_coef=-1.0)
        grid, cfg = time_grid(6, -1.0), 2.0
    else:
        schedule = dict(nfe=4, cfg_strength=0.0, t_grid=FLASH_T_GRID)
        grid, cfg = time_grid(4, None, FLASH_T_GRID), 0.0
    expected = _reference_sample(reference, ref_dit, text, ref_lat, 27, seed=1234, **schedule)
    (got,) = sample_latents(ours, [SampleRequest(text, ref_lat, 27, 1234)], grid, cfg)
    diff = _diff(got, expected)
    print(f"sample_latents {recipe}: max|diff| {diff:.2e}")
    assert diff <= PARITY

    # Negative control: another seed starts elsewhere and ends far away.
    (other,) = sample_latents(ours, [SampleRequest(text, ref_lat, 27, 1235)], grid, cfg)
    assert _diff(other, expected) > 0.1


@pytest.mark.parametrize("cfg", [2.0, 0.0], ids=["cfg2", "cfg0"])
def test_three_requests_batched_equal_each_alone_within_1e5(pair, cfg):
    ours, _ = pair
    shapes = [(5, 0, 20), (9, 7, 11), (3, 12, 33)]   # (text, ref, target) lengths all differ
    requests = []
    for i, (nt, np_, n) in enumerate(shapes):
        text, ref_lat, _ = _inputs(10 + i, nt=nt, np_=np_, n=1)
        requests.append(SampleRequest(text[0], ref_lat[0], n, seed=100 + i))
    grid = time_grid(3, -1.0)
    batched = sample_latents(ours, requests, grid, cfg)
    alone = [sample_latents(ours, [r], grid, cfg)[0] for r in requests]
    diffs = [_diff(b, a) for b, a in zip(batched, alone)]
    print(f"batched vs alone cfg={cfg}: max|diff| per request {[f'{d:.1e}' for d in diffs]}")
    assert [b.shape for b in batched] == [(n, 64) for _, _, n in shapes]
    assert max(diffs) <= BATCHING
    # Negative control: the padding is what the masks hide. The last request alone with its
    # text and reference zero-padded to the batch's widths and taken as real (as an unmasked
    # batch would) ends far from its batched row.
    last = requests[2]
    padded = SampleRequest(F.pad(last.text, (0, 0, 0, 6)), last.ref, last.frames, last.seed)
    assert _diff(sample_latents(ours, [padded], grid, cfg)[0], batched[2]) > 1e-2


def test_time_grid_builds_sway_and_explicit_grids_and_rejects_bad_ones():
    # sway -1 on 4 steps is exactly the released Flash grid (1 - cos(pi t / 2)).
    assert _diff(time_grid(4, -1.0), torch.tensor(FLASH_T_GRID)) < 1e-7
    assert time_grid(2, None).tolist() == [0.0, 0.5, 1.0]
    assert time_grid(99, 5.0, [0.0, 0.3, 1.0]).tolist() == pytest.approx([0.0, 0.3, 1.0])
    with pytest.raises(ValueError, match="at least two time points"):
        time_grid(4, None, [0.0])
    with pytest.raises(ValueError, match="strictly increasing"):
        time_grid(4, None, [0.0, 0.5, 0.5, 1.0])
    with pytest.raises(ValueError, match="strictly increasing"):
        time_grid(8, 3.0)
    with pytest.raises(ValueError, match="nfe >= 1"):
        time_grid(0, None)


def test_load_transformer_strips_the_prefix_skips_the_fusion_and_names_missing_keys(pair, state):
    ours, _ = pair
    tensors = {f"transformer.{k}": v for k, v in state.items()}
    tensors.update(layer_weights=torch.zeros(28), layer_scale=torch.ones(1))
    dit = load_transformer(tensors, TINY)
    assert all(torch.equal(dit.state_dict()[k], v) for k, v in ours.state_dict().items())
    del tensors["transformer.proj_out.bias"]
    with pytest.raises(CheckpointError, match="proj_out.bias"):
        load_transformer(tensors, TINY)
