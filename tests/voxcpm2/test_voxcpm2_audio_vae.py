"""AudioVAE v2 (VoxCPM2's codec) against voxcpm 2.0.3's on the same random weights, and
its chunked decoding against one whole decode."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.voxcpm2.upstream import voxcpm_module
from tritontts.families.voxcpm2.audio_vae import (
    TINY_CONFIG, TINY_RELEASED_RATES_CONFIG, AudioVAEConfig, decoder_context_frames,
    load_audio_vae, write_random_audio_vae)

CONFIGS = {
    "tiny": TINY_CONFIG,
    # Not depthwise, no sample-rate conditioning: the other branches of the builder.
    "plain": replace(TINY_CONFIG, depthwise=False, sr_bin_boundaries=None),
}


def _reference(config: AudioVAEConfig, path):
    from safetensors.torch import load_file

    with voxcpm_module("voxcpm.modules.audiovae.audio_vae_v2") as ref:
        model = ref.AudioVAE(ref.AudioVAEConfig(**config.to_dict()))
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.float().eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    config = CONFIGS[request.param]
    path = write_random_audio_vae(tmp_path_factory.mktemp(request.param), config, seed=3)
    return config, path, load_audio_vae(path, config), _reference(config, path)


def _latents(config, frames=10, batch=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, config.latent_dim, frames, generator=gen)


def test_decode_matches_reference(pair):
    config, _, ours, ref = pair
    z = _latents(config)
    with torch.no_grad():
        want = ref.decode(z).squeeze(1)
    got = ours.decode(z)
    assert got.shape == (2, 10 * config.decode_hop) == want.shape
    diff = (got - want).abs().max().item()
    assert diff <= 1e-4, diff
    assert want.abs().max() > 0.05          # not a trivially flat output
    # Negative control: one Snake alpha off by 10% must show.
    alpha = ours.decoder.model[-3].alpha
    saved = alpha.data.clone()
    alpha.data.mul_(1.1)
    try:
        assert (ours.decode(z) - want).abs().max().item() > 1e-3
    finally:
        alpha.data.copy_(saved)


def test_other_sample_rate_bucket_matches_reference(tmp_path):
    """Only the tiny config has sample-rate conditioning (the plain one switches it off)."""
    config = CONFIGS["tiny"]
    assert config.sr_bin_boundaries is not None
    path = write_random_audio_vae(tmp_path, config, seed=3)
    ours, ref = load_audio_vae(path, config), _reference(config, path)
    z = _latents(config, frames=6, batch=1, seed=1)
    with torch.no_grad():
        want = ref.decode(z, torch.tensor([24000], dtype=torch.int32)).squeeze(1)
        default = ref.decode(z).squeeze(1)
    got = ours.decode(z, sample_rate=24000)
    assert (got - want).abs().max().item() <= 1e-4
    assert (got - default).abs().max().item() > 1e-3   # the bucket matters


def test_encode_matches_reference(pair):
    config, _, ours, ref = pair
    gen = torch.Generator().manual_seed(2)
    audio = 0.3 * torch.randn(2, 5 * config.encode_hop - 1, generator=gen)  # padded up
    with torch.no_grad():
        want = ref.encode(audio, config.sample_rate)
    got = ours.encode(audio)
    assert got.shape == want.shape == (2, config.latent_dim, 5)
    assert (got - want).abs().max().item() <= 1e-4


@pytest.mark.parametrize("chunking", ["random1to3", "patch4"])
def test_streaming_equals_whole_decode(pair, chunking):
    config, _, ours, ref = pair
    z = _latents(config, frames=17, seed=4)
    whole = ours.decode(z)
    rng = random.Random(5)
    sizes, left = [], z.shape[-1]
    while left:
        size = min(left, 4 if chunking == "patch4" else rng.randint(1, 3))
        sizes.append(size)
        left -= size
    stream = ours.stream()
    pieces, start = [], 0
    for size in sizes:
        piece = stream.decode_chunk(z[..., start:start + size])
        assert piece.shape == (2, size * config.decode_hop)
        pieces.append(piece)
        start += size
    streamed = torch.cat(pieces, dim=-1)
    peak = whole.abs().max().item()
    assert (streamed - whole).abs().max().item() <= 1e-4 * peak
    with torch.no_grad(), ref.streaming_decode() as upstream:
        theirs = [upstream.decode_chunk(z[..., s - n:s]).squeeze(1)
                  for s, n in zip(torch.tensor(sizes).cumsum(0).tolist(), sizes)]
    assert (streamed - torch.cat(theirs, dim=-1)).abs().max().item() <= 1e-4 * peak
    # Negative control: the same chunks without their left context.
    cold = torch.cat([ours.decode(z[..., s - n:s])
                      for s, n in zip(torch.tensor(sizes).cumsum(0).tolist(), sizes)], dim=-1)
    assert (cold - whole).abs().max().item() > 1e-2 * peak


def test_strict_load_names_missing_key(tmp_path):
    from safetensors.torch import load_file, save_file

    path = write_random_audio_vae(tmp_path / "full", TINY_CONFIG, seed=1)
    tensors = load_file(str(path))
    assert "decoder.model.1.weight_g" in tensors and "decoder.sr_bin_boundaries" in tensors
    dropped = "decoder.model.2.block.1.weight_v"
    del tensors[dropped]
    broken = tmp_path / "broken.safetensors"
    save_file(tensors, str(broken))
    with pytest.raises(CheckpointError, match=dropped.replace(".", r"\.")):
        load_audio_vae(broken, TINY_CONFIG)
    with pytest.raises(CheckpointError, match="shape"):
        load_audio_vae(path, replace(TINY_CONFIG, latent_dim=6))


def test_config_from_checkpoint_json():
    released = AudioVAEConfig.from_dict({})
    assert released.decode_hop == 1920 and released.encode_hop == 640
    assert released.out_sample_rate // released.decode_hop == 25
    assert AudioVAEConfig.from_dict({"sr_bin_boundaries": None}).sr_bin_boundaries is None
    assert AudioVAEConfig.from_dict(TINY_CONFIG.to_dict()) == TINY_CONFIG
    with pytest.raises(CheckpointError, match="use_noise_block"):
        AudioVAEConfig.from_dict({"use_noise_block": True})


def test_released_config_has_upstream_keys_and_shapes():
    from tritontts.families.voxcpm2.audio_vae import RELEASED_CONFIG, AudioVAE

    with torch.device("meta"):       # shapes only: 94M parameters, nothing allocated
        ours = AudioVAE(RELEASED_CONFIG)
        with voxcpm_module("voxcpm.modules.audiovae.audio_vae_v2") as ref:
            theirs = ref.AudioVAE(ref.AudioVAEConfig())
    assert ({k: v.shape for k, v in ours.state_dict().items()}
            == {k: v.shape for k, v in theirs.state_dict().items()})


@pytest.mark.parametrize("config", [TINY_RELEASED_RATES_CONFIG, TINY_CONFIG], ids=["released_rates", "tiny"])
def test_decoder_context_frames_is_the_exact_receptive_field(tmp_path, config):
    """In float64: a window with decoder_context_frames of left context decodes its new frames
    as the whole utterance does, to float64 round-off; one frame less does not."""
    vae = load_audio_vae(write_random_audio_vae(tmp_path / "vae.safetensors", config, seed=1), config).double()
    context = decoder_context_frames(config)
    latents = torch.randn(1, config.latent_dim, 2 * context + 8,
                          generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1.5
    whole = vae.decode(latents)[0]
    start, hop = context + 4, config.decode_hop

    def window_error(frames: int) -> float:
        window = vae.decode(latents[..., start - frames:])[0][frames * hop:]
        return float((window - whole[start * hop:]).abs().max())

    # Not exactly 0.0: the window and the whole run through convolutions of other lengths, and
    # the CPU's kernels sum them in other orders (0.0 on one machine, 3.2e-15 / 6.7e-14 on
    # another of the same kind). 1e-11 of the peak is float64 round-off (eps 2.2e-16) grown
    # over the decoder's depth with margin; a missing frame of context costs 5.6e-7 / 4.6e-6,
    # more than 1e3 times the tolerance.
    tolerance = 1e-11 * float(whole.abs().max())
    exact, short = window_error(context), window_error(context - 1)
    print(f"{context} frames of context: {exact:.1e}; one less: {short:.1e}; tolerance {tolerance:.1e}")
    assert exact <= tolerance
    assert short > 1e3 * tolerance
