"""Fish Speech S2 Pro's codec (ours) against vLLM-Omni 0.30's DAC modules, both built tiny
(the released wiring of dac_utils.build_dac_codec with small widths) on the same random
weights: decode to fp32 rounding and encode to the same codes, a perturbed weight as the
negative control for each; windows with context_frames() of left context decode exactly as
the whole utterance (float64), with clearly fewer they do not; state names are the reference's, so
codec.pth loads strictly; load_codec_file unwraps a training checkpoint."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tritontts.weights.checkpoint import CheckpointError, ConfigFields
from tritontts.families.fish_s2_pro.codec import (
    FishCodec, FishCodecConfig, load_codec, load_codec_file, random_codec_state)
from tritontts.upstream import vllm_omni_module

# Small widths; the released layer plan (4 encoder and 4 decoder rates, transformer in the
# last encoder block, 10 books, 2 x 2 quantizer downsampling). The encoder transformer's
# window stays the released 512 (vLLM-Omni hard-codes it) and its width 64 (one head: the
# reference's dim // 64); the quantizer window is 16 over 2 layers so the post_module's
# reach (30 frames) exceeds vLLM-Omni's 25-frame streaming context, as at the released sizes.
ARGS = {"encoder_dim": 4, "encoder_rates": [2, 2, 2, 2], "encoder_transformer_layers": [0, 0, 0, 1],
        "encoder_head_dim": 16, "latent_dim": 32, "semantic_codebook_size": 64, "n_codebooks": 9,
        "codebook_size": 16, "codebook_dim": 4, "downsample_factors": [2, 2], "quantizer_layers": 2,
        "quantizer_heads": 2, "quantizer_head_dim": 16, "quantizer_ffn": 64, "quantizer_window": 16,
        "decoder_dim": 64, "decoder_rates": [2, 2, 2, 2]}
DERIVED = (".freqs_cis", ".causal_mask")


def config() -> FishCodecConfig:
    return FishCodecConfig.from_dict(ARGS, ConfigFields(ARGS, Path("codec.json")))


def reference(c: FishCodecConfig, state: dict[str, torch.Tensor] | None):
    """vLLM-Omni's DAC wired as dac_utils.build_dac_codec wires the released one."""
    with vllm_omni_module("vllm_omni.model_executor.models.fish_speech.dac_modules") as m:
        base = dict(block_size=16384, n_local_heads=-1, head_dim=c.encoder_head_dim, rope_base=10000,
                    norm_eps=1e-5, dropout_rate=0.0, attn_dropout_rate=0.0, channels_first=True)

        def quantizer_transformer():
            args = m.ModelArgs(block_size=4096, n_layer=c.quantizer_layers, n_head=c.quantizer_heads,
                               dim=c.latent_dim, intermediate_size=c.quantizer_ffn, n_local_heads=-1,
                               head_dim=c.quantizer_head_dim, rope_base=10000, norm_eps=1e-5,
                               dropout_rate=0.0, attn_dropout_rate=0.0, channels_first=True)
            return m.WindowLimitedTransformer(causal=True, window_size=c.quantizer_window,
                                              input_dim=c.latent_dim, config=args)

        quantizer = m.DownsampleResidualVectorQuantize(
            input_dim=c.latent_dim, n_codebooks=c.n_codebooks, codebook_size=c.codebook_size,
            codebook_dim=c.codebook_dim, quantizer_dropout=0.0, downsample_factor=list(c.downsample_factors),
            post_module=quantizer_transformer(), pre_module=quantizer_transformer(),
            semantic_codebook_size=c.semantic_codebook_size)
        model = m.DAC(encoder_dim=c.encoder_dim, encoder_rates=list(c.encoder_rates), latent_dim=c.latent_dim,
                      decoder_dim=c.decoder_dim, decoder_rates=list(c.decoder_rates), quantizer=quantizer,
                      sample_rate=c.sample_rate, causal=True,
                      encoder_transformer_layers=list(c.encoder_transformer_layers),
                      decoder_transformer_layers=[4, 0, 0, 0],
                      transformer_general_config=lambda **kw: m.ModelArgs(**{**base, **kw}))
    if state is not None:
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all(k.endswith(DERIVED) for k in missing), missing
    return model.float().eval()


def codes(c: FishCodecConfig, frames: int, seed: int = 1, batch: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    semantic = torch.randint(0, c.semantic_codebook_size, (batch, 1, frames), generator=gen)
    residual = torch.randint(0, c.codebook_size, (batch, c.n_codebooks, frames), generator=gen)
    return torch.cat([semantic, residual], dim=1)


@pytest.fixture(scope="module")
def pair():
    c = config()
    state = random_codec_state(c, torch.Generator().manual_seed(0))
    return c, state, load_codec(state, c, "random"), reference(c, state)


def test_config_released_sizes():
    c = FishCodecConfig()
    assert c.hop == 2048 and abs(c.frame_rate - 21.533) < 1e-3 and c.num_codebooks == 10
    # 8 layers x 127 frames of post_module attention + 10 frames of convs after it.
    assert c.context_frames() == 1026
    # Tiny: 2 x 15 from the post_module; the residual units' 78-sample reach per block is
    # large against a 64-sample hop, so the convs add 25.
    assert config().context_frames() == 2 * 15 + 25
    with pytest.raises(CheckpointError, match="decoder_rates"):
        FishCodecConfig.from_dict({"decoder_rates": [8, 8, 4]})


def test_state_names_are_the_references(pair):
    c, state, _, _ = pair
    ours = {k: tuple(v.shape) for k, v in FishCodec(c).state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in reference(c, None).state_dict().items() if not k.endswith(DERIVED)}
    assert ours == theirs
    assert any(k.endswith(".conv.parametrizations.weight.original1") for k in ours)
    assert "quantizer.semantic_quantizer.quantizers.0.in_proj.weight_g" in ours
    assert set(state) == set(ours)


def test_decode_matches_vllm_omni(pair):
    c, state, ours, ref = pair
    x = codes(c, 40)
    x[0, 1, 3] = c.codebook_size + 5                 # out of range: clamped by both
    with torch.inference_mode():
        want, _ = ref.decode(x, torch.tensor([40, 40]))
    got = ours.decode(x)
    diff = (got - want).abs().max().item()
    print(f"\ndecode: {tuple(got.shape)}, max-abs-diff {diff:.2e} (peak {want.abs().max():.3f})")
    assert got.shape == want.shape == (2, 1, 40 * c.hop) and diff <= 1e-5
    assert 0.05 < want.abs().max() < 0.9             # random weights give a sensible level
    bad = dict(state)
    key = "quantizer.post_module.layers.1.attention.wqkv.weight"
    bad[key] = bad[key] + 0.05
    off = (load_codec(bad, c, "perturbed").decode(x) - want).abs().max().item()
    print(f"decode, perturbed {key}: max-abs-diff {off:.2e}")
    assert off > 1e-3


def test_encode_matches_vllm_omni(pair):
    c, state, ours, ref = pair
    # 150 frames minus a few samples (padding), long enough (600 steps) for the encoder
    # transformer's 512-step window to bite.
    audio = 0.3 * torch.randn(2, 1, 150 * c.hop - 17, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        want, _ = ref.encode(audio)
    got = ours.encode(audio)
    same = (got == want).float().mean().item()
    print(f"\nencode: {tuple(got.shape)}, codes equal: {same:.4f}")
    assert got.shape == (2, 10, 150) and torch.equal(got, want)
    bad = dict(state)
    key = "encoder.block.4.block.5.layers.0.attention.wqkv.weight"
    bad[key] = bad[key] + 0.2
    changed = (load_codec(bad, c, "perturbed").encode(audio) != want).float().mean().item()
    print(f"encode, perturbed {key}: {changed:.3f} of codes differ")
    assert changed > 0.05


def test_windows_with_context_frames_decode_exactly_as_the_whole(pair):
    c, state, _, _ = pair
    double = load_codec(state, c, "random").double()
    x = codes(c, 90, seed=2, batch=1)
    whole = double.decode(x)[0, 0]
    context, start, hop = c.context_frames(), 60, c.hop

    def error(frames: int, absolute: bool = True) -> float:
        first = start - frames if absolute else 0
        window = double.decode_window(x[..., start - frames:], frames, first_frame=first)
        return float((window[0, 0] - whole[start * hop:]).abs().max())

    fewer = {k: error(context - k) for k in (1, 3, 5, 10, 20)}
    print(f"\n{context} frames of context: {error(context):.1e} "
          f"(RoPE restarting per window: {error(context, absolute=False):.1e}); "
          + ", ".join(f"{k} fewer: {e:.1e}" for k, e in fewer.items()))
    # float64 rounding only (convs and attention over windows of another length).
    assert error(context) < 1e-12
    # The reach is exact, but the random convs' farthest taps carry little (a frame 55
    # back moves this one by ~1e-16), so "differs" is asserted well inside the reach.
    assert fewer[10] > 1e-9 and fewer[20] > 1e-6
    assert (double.decode(x[..., :25])[0, 0] - whole[:25 * hop]).abs().max() < 1e-12


def test_stateful_stream_decodes_exactly_as_the_whole(pair):
    """decode_stream (the post_module's keys and values carried, the convolutions' context
    re-read) in chunks of 4, 25, 25, 1 and 35 frames equals one whole decode: float64 to
    rounding, fp32 to its rounding; two utterances batched keep apart. Its convolution
    context is the receptive field less the transformer's."""
    c, state, ours, _ = pair
    double = load_codec(state, c, "random").double()
    x = codes(c, 90, seed=5, batch=2)
    for model, bound in ((double, 1e-12), (ours, 1e-5)):
        whole = model.decode(x)[:, 0]
        pieces, stream, begin = [], None, 0
        for size in (4, 25, 25, 1, 35):
            audio, stream = model.decode_stream(x[..., begin:begin + size], stream)
            pieces.append(audio[:, 0])
            begin += size
        diff = float((torch.cat(pieces, dim=-1) - whole).abs().max())
        print(f"{model.decoder.model[0].conv.weight.dtype}: stateful stream vs whole {diff:.1e} "
              f"(peak {float(whole.abs().max()):.2f}); cached keys per layer {stream.past[0][0].shape[1]}")
        assert diff < bound
    assert stream.frames == 90 and stream.past[0][0].shape[1] == c.quantizer_window - 1
    assert ours.conv_context_frames() == c.context_frames() - c.quantizer_layers * (c.quantizer_window - 1)


def test_vllm_omni_chunks_leave_a_small_truncation_error_and_absolute_rope_leaves_less(pair):
    """vLLM-Omni's schedule (4-frame chunks up to 25 frames, then 25-frame chunks with 25
    frames of left context) at the tiny sizes, whose receptive field (55) exceeds 25: the
    error it leaves, with RoPE at absolute positions (ours) and restarting per window
    (vLLM-Omni); fp32. Measured 1.15e-3 and 1.18e-3 of the peak: both are bounded at 5e-3 of
    the peak, both must exceed 1e-5 of it (25 frames of context truncate a 55-frame
    receptive field, so an error this test cannot see would mean it measures nothing), and
    absolute positions must not do worse than restarting per window."""
    c, _, ours, _ = pair
    x = codes(c, 100, seed=4, batch=1)
    whole = ours.decode(x)[0, 0]
    peak = float(whole.abs().max())
    bounds = list(range(4, 25, 4)) + list(range(24 + 25, 100, 25)) + [100]
    error = {}
    for absolute in (True, False):
        pieces, begin = [], 0
        for end in bounds:
            left = max(0, begin - 25)
            window = ours.decode_window(x[..., left:end], begin - left, first_frame=left if absolute else 0)
            pieces.append(window[0, 0])
            begin = end
        assert torch.cat(pieces).shape == whole.shape
        error[absolute] = float((torch.cat(pieces) - whole).abs().max())
        print(f"\nchunks 4 then 25, 25 frames of context, RoPE {'absolute' if absolute else 'per window'}: "
              f"max-abs-diff {error[absolute]:.2e} (peak {peak:.3f})")
    assert all(1e-5 * peak < e < 5e-3 * peak for e in error.values()), error
    assert error[True] <= error[False], error


def test_load_codec_file_unwraps_a_training_checkpoint(pair, tmp_path):
    c, state, ours, _ = pair
    path = tmp_path / "codec.pth"
    wrapped = {f"generator.{k}": v for k, v in state.items()}
    wrapped["discriminator.x"] = torch.zeros(1)
    wrapped["generator.quantizer.post_module.freqs_cis"] = torch.zeros(4, 8, 2)
    torch.save({"generator": {"state_dict": wrapped}}, path)
    loaded = load_codec_file(path)
    assert set(loaded) == set(state)
    x = codes(c, 6)
    assert torch.equal(load_codec(loaded, c, str(path)).decode(x), ours.decode(x))
    torch.save({"generator": state}, path)
    assert set(load_codec_file(path)) == set(state)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="codec.pth"):
        load_codec_file(path)
