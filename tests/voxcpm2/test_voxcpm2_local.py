"""VoxCPM2's local modules (LocEnc, LocDiT, the CFM sampler, FSQ) against voxcpm 2.0.3's on
the same random weights, fp32, tiny configs built the way upstream's VoxCPM2Model builds
them from lm_config + encoder_config / dit_config."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tritontts.families.voxcpm2.upstream import voxcpm_module
from tritontts.families.voxcpm2.local import LocalCFM, LocDiT, LocEnc, ScalarQuantizer
from tritontts.families.voxcpm2.minicpm4 import MiniCPM4Config

FEAT, PATCH, FSQ_LATENT = 64, 4, 32


def _lm(**kw):
    head = 32   # both local modules below have 32-d heads: one factor list fits both
    lm = dict(bos_token_id=1, eos_token_id=2, hidden_size=96, intermediate_size=192,
              max_position_embeddings=128, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, rms_norm_eps=1e-5, vocab_size=0, use_mup=True,
              scale_emb=12.0, dim_model_base=256, scale_depth=1.4, rope_theta=10000.0,
              rope_scaling=dict(type="longrope", original_max_position_embeddings=32,
                                long_factor=[1.0 + 0.2 * i for i in range(head // 2)],
                                short_factor=[1.0 + 0.05 * i for i in range(head // 2)]))
    lm.update(kw)
    return lm


CASES = {
    # GQA (2 KV heads), muP, long RoPE factors with an attention factor != 1, kv_channels
    # making the encoder's q width (4 x 32) differ from its hidden size (64).
    "gqa_longrope": (_lm(), dict(hidden_dim=64, ffn_dim=128, num_heads=4, num_layers=2,
                                 kv_channels=32),
                     dict(hidden_dim=128, ffn_dim=256, num_heads=4, num_layers=2)),
    # No muP, no GQA, maximum = original length: short factors, attention factor 1.
    "plain": (_lm(use_mup=False, num_key_value_heads=4, max_position_embeddings=32),
              dict(hidden_dim=128, ffn_dim=256, num_heads=4, num_layers=2),
              dict(hidden_dim=64, ffn_dim=128, num_heads=4, num_layers=2, kv_channels=32)),
}


def _ref_config(cls, lm: dict, sub: dict):
    # As VoxCPM2Model.__init__: copy lm_config, replace width, depth, heads, head size.
    cfg = cls(**lm).model_copy(deep=True)
    cfg.hidden_size, cfg.intermediate_size = sub["hidden_dim"], sub["ffn_dim"]
    cfg.num_attention_heads, cfg.num_hidden_layers = sub["num_heads"], sub["num_layers"]
    cfg.kv_channels, cfg.vocab_size = sub.get("kv_channels"), 0
    return cfg


def _randomize(module: nn.Module, seed: int) -> None:
    """Seeded weights that keep activations O(1) and make every parameter matter
    (norm gains away from 1, biases nonzero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif p.dim() == 2:
                p.copy_(noise / p.shape[1] ** 0.5)
            else:
                p.copy_(noise)


class _Root(nn.Module):
    """The three sub-trees of model.safetensors that these modules own."""

    def __init__(self, feat_encoder, feat_decoder, fsq_layer):
        super().__init__()
        self.feat_encoder, self.feat_decoder, self.fsq_layer = feat_encoder, feat_decoder, fsq_layer


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request):
    lm, enc, dit = CASES[request.param]
    with voxcpm_module("voxcpm.modules.locenc.local_encoder") as m:
        ref_enc = m.VoxCPMLocEnc(_ref_config(m.MiniCPM4Config, lm, enc), input_dim=FEAT)
    with voxcpm_module("voxcpm.modules.locdit.unified_cfm") as m:
        cfm_config = m.CfmConfig()
    with voxcpm_module("voxcpm.modules.locdit.local_dit_v2") as m:
        ref_dit = m.VoxCPMLocDiT(_ref_config(m.MiniCPM4Config, lm, dit), in_channels=FEAT)
    with voxcpm_module("voxcpm.modules.locdit.unified_cfm") as m:
        ref_cfm = m.UnifiedCFM(FEAT, cfm_config, estimator=ref_dit, mean_mode=False)
    with voxcpm_module("voxcpm.modules.layers.scalar_quantization_layer") as m:
        ref_fsq = m.ScalarQuantizationLayer(lm["hidden_size"], lm["hidden_size"], FSQ_LATENT, 9)
    ref = _Root(ref_enc, ref_cfm, ref_fsq)
    _randomize(ref, seed=11)
    ref.float().eval()

    ours = _Root(LocEnc(MiniCPM4Config.for_local_module(lm, enc), input_dim=FEAT),
                 LocalCFM(LocDiT(MiniCPM4Config.for_local_module(lm, dit), in_channels=FEAT),
                          in_channels=FEAT),
                 ScalarQuantizer(lm["hidden_size"], lm["hidden_size"], FSQ_LATENT, 9))
    ours.load_state_dict(ref.state_dict(), strict=True)   # upstream's key names, all of them
    ours.float().eval()
    return lm, dit, ours, ref


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_local_config_inherits_backbone_settings():
    lm, enc, _ = CASES["gqa_longrope"]
    cfg = MiniCPM4Config.for_local_module(lm, enc)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim) == (64, 4, 32)
    assert cfg.num_key_value_heads == 2 and cfg.original_max_position_embeddings == 32
    assert cfg.long_factor[1] == pytest.approx(1.2)


def test_loc_enc_matches_reference(pair):
    _, _, ours, ref = pair
    x = torch.randn(2, 3, PATCH, FEAT, generator=_gen(1))
    with torch.no_grad():
        want = ref.feat_encoder(x)
        got = ours.feat_encoder(x)
    assert got.shape == want.shape == (2, 3, ref.feat_encoder.config.hidden_size)
    assert want.abs().max() > 0.1
    assert (got - want).abs().max().item() <= 1e-4
    # Negative control: the learned token's first channel off by 0.5 must show.
    token = ours.feat_encoder.special_token
    saved = token.data.clone()
    token.data[..., 0] += 0.5
    try:
        with torch.no_grad():
            assert (ours.feat_encoder(x) - want).abs().max().item() > 1e-3
    finally:
        token.data.copy_(saved)


def _dit_inputs(dit_hidden, n=3, prefix=PATCH, seed=2):
    gen = _gen(seed)
    return (torch.randn(n, FEAT, PATCH, generator=gen),
            torch.randn(n, 2 * dit_hidden, generator=gen),   # lm and residual states
            torch.rand(n, generator=gen),
            torch.randn(n, FEAT, prefix, generator=gen),
            0.3 * torch.rand(n, generator=gen))


def test_loc_dit_velocity_matches_reference(pair):
    _, dit, ours, ref = pair
    x, mu, t, cond, dt = _dit_inputs(dit["hidden_dim"])
    with torch.no_grad():
        want = ref.feat_decoder.estimator(x, mu, t, cond, dt)
        got = ours.feat_decoder.estimator(x, mu, t, cond, dt)
    assert got.shape == want.shape == x.shape
    assert want.abs().max() > 0.1
    assert (got - want).abs().max().item() <= 1e-4
    # Negative controls: the delta-time branch and the conditioning tokens both matter.
    with torch.no_grad():
        assert (ours.feat_decoder.estimator(x, mu, t, cond, torch.zeros_like(dt))
                - want).abs().max().item() > 1e-3
        assert (ours.feat_decoder.estimator(x, mu.roll(1, 0), t, cond, dt)
                - want).abs().max().item() > 1e-3


@pytest.mark.parametrize("cfg_value,zero_star", [(2.0, True), (1.5, False)])
def test_cfm_patch_matches_reference(pair, cfg_value, zero_star):
    _, dit, ours, ref = pair
    gen = _gen(3)
    mu = torch.randn(2, 2 * dit["hidden_dim"], generator=gen)
    cond = torch.randn(2, FEAT, PATCH, generator=gen)
    # Upstream draws its noise with torch.randn right away: the same seed gives ours.
    torch.manual_seed(7)
    want = ref.feat_decoder(mu, n_timesteps=10, patch_size=PATCH, cond=cond,
                            cfg_value=cfg_value, use_cfg_zero_star=zero_star).clone()
    torch.manual_seed(7)
    noise = torch.randn(2, FEAT, PATCH)
    got = ours.feat_decoder(mu, cond, noise, n_timesteps=10, cfg_value=cfg_value,
                            use_cfg_zero_star=zero_star)
    assert got.shape == want.shape == (2, FEAT, PATCH)
    assert (want - noise).abs().max() > 0.1          # the sampler moved away from the noise
    assert (got - want).abs().max().item() <= 1e-4
    # Negative controls: a different guidance scale, and a plain (unswayed) time grid.
    assert (ours.feat_decoder(mu, cond, noise, cfg_value=cfg_value + 0.5,
                              use_cfg_zero_star=zero_star) - want).abs().max().item() > 1e-3
    assert (ours.feat_decoder(mu, cond, noise, cfg_value=cfg_value, sway_sampling_coef=0.0,
                              use_cfg_zero_star=zero_star) - want).abs().max().item() > 1e-3


def test_fsq_matches_reference(pair):
    lm, _, ours, ref = pair
    h = 2.0 * torch.randn(5, 7, lm["hidden_size"], generator=_gen(4))
    with torch.no_grad():
        want = ref.fsq_layer(h)
        got = ours.fsq_layer(h)
        # Negative control: another grid (scale 8) must show.
        ours.fsq_layer.scale = 8
        other = ours.fsq_layer(h)
        ours.fsq_layer.scale = 9
    assert got.shape == want.shape == h.shape
    assert (got - want).abs().max().item() <= 1e-4
    assert (other - want).abs().max().item() > 1e-3


def test_long_rope_choice_matters(pair):
    """Negative control for the rotary tables (parity above is exact, so show they count):
    the DiT with another table (the other factor list, no attention factor) drifts."""
    from dataclasses import replace

    from tritontts.families.voxcpm2.minicpm4 import long_rope_table

    _, dit, ours, ref = pair
    x, mu, t, cond, dt = _dit_inputs(dit["hidden_dim"])
    stack = ours.feat_decoder.estimator.decoder
    cfg = stack.config
    other = replace(cfg, max_position_embeddings=cfg.original_max_position_embeddings * 4,
                    long_factor=tuple(2.0 * f for f in cfg.short_factor))
    length = 2 + 1 + 2 * PATCH     # mu tokens, time token, prefix patch, noisy patch
    saved = dict(stack._rope)
    stack._rope[x.device] = long_rope_table(other, length, x.device)
    try:
        with torch.no_grad():
            drift = (ours.feat_decoder.estimator(x, mu, t, cond, dt)
                     - ref.feat_decoder.estimator(x, mu, t, cond, dt)).abs().max().item()
    finally:
        stack._rope.clear()
        stack._rope.update(saved)
    assert drift > 1e-3
