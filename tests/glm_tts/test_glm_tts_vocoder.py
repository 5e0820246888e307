"""GLM-TTS vocoders (tritontts.families.glm_tts.vocoder) on random weights, CPU only.

The non-causal HiFT (tritontts.nn.hift, causal=False) against vLLM-Omni 0.30's GLM-TTS vocoder
(cosyvoice3 code2wav_core HiFTGenerator + glm_tts ConvRNNF0Predictor) on the same weights,
at the tiny and the released width, with our fixed noise given to theirs; hift.pt loading
and its errors; the TorchScript Vocos2D path on a stand-in module.
"""
from __future__ import annotations

import importlib
from unittest import mock

import pytest
import torch

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.glm_tts.vocoder import (
    GLM_HIFT_CONFIG, HIFT_CONFIGS, MEL_LOGDIFF, Vocoder, load_hift, load_vocos2d,
    write_random_hift, write_random_vocos2d)
from tritontts.nn.hift import HiFTGenerator, spectrum_graph

SAMPLES_PER_FRAME = 480
TOLERANCE = 1e-4


# Both cores for these CPU-heavy module tests (conftest.torch_two_threads).
pytestmark = pytest.mark.usefixtures("torch_two_threads")


def mel(frames: int, batch: int = 1, seed: int = 7) -> torch.Tensor:
    return torch.randn(batch, 80, frames, generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def hift_paths(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("glm-hift")
    return {size: write_random_hift(root / size / "hift.pt", seed=0, size=size)
            for size in ("tiny", "released")}


# --- the reference ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference():
    """vLLM-Omni's GLM-TTS vocoder module (for ConvRNNF0Predictor) and the cosyvoice3
    hifigan module (HiFTGenerator) it builds on, imported through
    tritontts.upstream.vllm_omni_module."""
    from tritontts.upstream import vllm_omni_module

    with vllm_omni_module("vllm_omni.model_executor.models.glm_tts.vocoder") as vocoder:
        hifigan = importlib.import_module(
            "vllm_omni.model_executor.models.cosyvoice3.code2wav_core.hifigan")
        yield hifigan, vocoder


def reference_hift(reference, size: str, state: dict) -> torch.nn.Module:
    """Their HiFTGenerator with their ConvRNNF0Predictor (as their HiFTWrapper builds it),
    at `size`, loaded strictly from `state`."""
    hifigan, vocoder = reference
    config = HIFT_CONFIGS[size]
    kwargs = {k: v for k, v in config.items() if k not in ("causal", "f0_predictor")}
    kwargs = {k: [list(d) for d in v] if k.endswith("dilation_sizes")
              else list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
    theirs = hifigan.HiFTGenerator(
        **kwargs, f0_predictor=vocoder.ConvRNNF0Predictor(**config["f0_predictor"]))
    theirs.load_state_dict(state, strict=True)
    return theirs.eval()


def run_with_our_noise(theirs: torch.nn.Module, ours: HiFTGenerator, x: torch.Tensor):
    """theirs.inference(x) with the initial phases and the sine noise ours uses.

    Their SineGen2 draws rand_ini with torch.rand(B, harmonics) and the noise with
    torch.randn_like(sines [B, L, harmonics]) on every call; their source module then
    draws a noise output inference discards (torch.randn_like(uv [B, L, 1])). Patched for
    the call: our fixed values in the first two, zeros in the third. Our tables are read
    before patching (ours may need to draw new blocks, through the real torch.rand)."""
    bank = ours.m_source.noise
    rand_ini = bank.rand_ini.clone()
    noise = bank.sine_noise(x.shape[2] * SAMPLES_PER_FRAME, torch.device("cpu")).clone()
    calls = []

    def fake_rand(*shape, **_):
        calls.append("rand")
        return rand_ini.expand(shape[0], -1).clone()

    def fake_randn_like(like, **_):
        calls.append(f"randn_like{tuple(like.shape)}")
        if like.shape[-1] == noise.shape[-1]:
            return noise.expand_as(like).clone()
        return torch.zeros_like(like)

    with mock.patch("torch.rand", fake_rand), mock.patch("torch.randn_like", fake_randn_like):
        audio, source = theirs.inference(x)
    batch, length, harmonics = x.shape[0], noise.shape[1], noise.shape[2]
    # Exactly the draws described: a change upstream would show here first.
    assert calls == ["rand", f"randn_like{(batch, length, harmonics)}",
                     f"randn_like{(batch, length, 1)}"], calls
    return audio, source


# --- parity -------------------------------------------------------------------------------

def test_written_hift_has_the_reference_modules_keys_and_both_load_it_strictly(
        reference, hift_paths):
    for size, path in hift_paths.items():
        state = torch.load(path, weights_only=True)
        theirs = reference_hift(reference, size, state)      # strict
        assert set(state) == set(theirs.state_dict()), size
        assert "conv_pre.parametrizations.weight.original0" in state
        assert "ups.0.parametrizations.weight.original1" in state
        assert "source_downs.0.weight" in state           # not weight-normed upstream
        ours = load_hift(path)
        assert isinstance(ours, HiFTGenerator) and not ours.causal and not ours.training
        # 82 weight-normed convs fold two keys into one: 328 upstream keys, 246 ours.
        assert len(state) == 328 and len(ours.state_dict()) == 246
        base = ours.conv_pre.out_channels
        assert base == HIFT_CONFIGS[size]["base_channels"]
        assert ours.f0_predictor.classifier.in_features == \
            HIFT_CONFIGS[size]["f0_predictor"]["cond_channels"]


@pytest.mark.parametrize("size", ["tiny", "released"])
def test_audio_matches_vllm_omni_given_our_noise(reference, hift_paths, size):
    ours = load_hift(hift_paths[size])
    theirs = reference_hift(reference, size, torch.load(hift_paths[size], weights_only=True))
    frames = 37 if size == "tiny" else 23
    x = mel(frames, batch=2)

    audio, source = ours.inference(x)
    assert audio.shape == (2, frames * SAMPLES_PER_FRAME) and audio.dtype == torch.float32
    assert source.shape == (2, 1, frames * SAMPLES_PER_FRAME)
    assert torch.isfinite(audio).all() and audio.std() > 1e-3
    their_audio, their_source = run_with_our_noise(theirs, ours, x)
    diff = max_diff(audio, their_audio)
    print(f"GLM HiFT {size} vs vllm-omni: audio max-abs-diff {diff:.3g} "
          f"(audio std {audio.std():.3g}), source {max_diff(source, their_source):.3g}")
    assert diff <= TOLERANCE
    # The Vocoder interface is the same whole-utterance call.
    assert isinstance(ours, Vocoder) and ours.sample_rate == 24000
    assert ours.samples_per_mel == SAMPLES_PER_FRAME
    assert torch.equal(ours(x), audio)


def test_parity_check_fails_on_a_perturbed_weight_or_other_noise(reference, hift_paths):
    """Negative control: the comparison above would see a wrong weight or wrong noise."""
    ours = load_hift(hift_paths["tiny"])
    x = mel(37, batch=2)
    state = torch.load(hift_paths["tiny"], weights_only=True)
    state["resblocks.4.convs2.1.bias"] = state["resblocks.4.convs2.1.bias"] + 0.05
    perturbed = reference_hift(reference, "tiny", state)
    weight_diff = max_diff(ours.inference(x)[0], run_with_our_noise(perturbed, ours, x)[0])

    theirs = reference_hift(reference, "tiny", torch.load(hift_paths["tiny"], weights_only=True))
    other = load_hift(hift_paths["tiny"])
    other.reseed_noise(123)
    noise_diff = max_diff(ours.inference(x)[0], run_with_our_noise(theirs, other, x)[0])
    print(f"negative control: perturbed bias {weight_diff:.3g}, other noise {noise_diff:.3g}")
    assert weight_diff > 100 * TOLERANCE and noise_diff > 100 * TOLERANCE


# --- our non-causal HiFT on its own ------------------------------------------------------

def test_noise_is_fixed_gaussian_and_a_longer_rerun_keeps_the_earlier_excitation(hift_paths):
    model = load_hift(hift_paths["tiny"])
    noise = model.m_source.noise.sine_noise(200_000, torch.device("cpu"))
    assert abs(noise.mean().item()) < 0.01 and abs(noise.std().item() - 1) < 0.01
    assert noise.min() < -3    # normal, not U[0, 1) as the causal variant's

    x = mel(40)
    short_audio, short_source = model.inference(x[:, :, :30])
    assert torch.equal(model.inference(x[:, :, :30])[0], short_audio)
    again = load_hift(hift_paths["tiny"])
    assert torch.equal(again.inference(x[:, :, :30])[0], short_audio)
    # Noise by absolute sample and f0 from a 5-frame receptive field: the excitation of
    # frames well before the short run's end is the long run's too (up to float rounding
    # in the running phase sum).
    _, long_source = model.inference(x)
    early = 20 * SAMPLES_PER_FRAME
    drift = max_diff(short_source[:, :, :early], long_source[:, :, :early])
    print(f"excitation of the first 20 frames, 30- vs 40-frame run: {drift:.3g}")
    assert drift <= TOLERANCE

    with pytest.raises(ValueError, match="causal"):
        model.inference(x, finalize=False)


def test_non_causal_spectrum_runs_on_onnxruntime_like_torch(hift_paths, tmp_path):
    pytest.importorskip("onnxruntime")
    from tritontts.nn.runtime import OnnxRuntimeRunner, select_runner

    model = load_hift(hift_paths["tiny"])
    graph = spectrum_graph(model, max_frames=400)
    assert graph.name == "hift_spectrum" and graph.axes["mel_frames"].min == 1
    x = mel(25)
    expected = model.inference(x)[0]
    model.spectrum_runner = select_runner(graph, "onnxruntime", root=tmp_path)
    try:
        assert isinstance(model.spectrum_runner, OnnxRuntimeRunner)
        got = model.inference(x)[0]
    finally:
        model.spectrum_runner = None
    print(f"non-causal hift audio, onnxruntime vs torch: {max_diff(got, expected):.2e}")
    assert max_diff(got, expected) <= TOLERANCE


# --- hift.pt loading ---------------------------------------------------------------------

def test_hift_in_weight_g_v_form_loads_to_the_same_audio(hift_paths, tmp_path):
    state = torch.load(hift_paths["tiny"], weights_only=True)
    old = {k.replace(".parametrizations.weight.original0", ".weight_g")
           .replace(".parametrizations.weight.original1", ".weight_v"): v
           for k, v in state.items()}
    torch.save(old, tmp_path / "hift.pt")
    x = mel(12)
    assert torch.equal(load_hift(tmp_path / "hift.pt").inference(x)[0],
                       load_hift(hift_paths["tiny"]).inference(x)[0])


def test_bad_hift_files_raise_checkpoint_errors_naming_the_file_and_key(hift_paths, tmp_path):
    missing = tmp_path / "nowhere" / "hift.pt"
    with pytest.raises(CheckpointError, match=f"{missing}.*not found"):
        load_hift(missing)

    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=f"{corrupt}.*not a loadable"):
        load_hift(corrupt)

    state = torch.load(hift_paths["tiny"], weights_only=True)
    for name, broken, named in (
            ("no_bias.pt", {k: v for k, v in state.items() if k != "conv_post.bias"},
             "conv_post.bias"),
            ("extra.pt", {**state, "resblocks.0.extra": torch.zeros(1)}, "resblocks.0.extra"),
            ("half.pt", {k: v for k, v in state.items()
                         if k != "ups.1.parametrizations.weight.original0"},
             "ups.1.parametrizations.weight.original1")):
        path = tmp_path / name
        torch.save(broken, path)
        with pytest.raises(CheckpointError, match=f"{path}.*{named.replace('.', '[.]')}"):
            load_hift(path)

    wrong_shape = dict(state)
    wrong_shape["m_source.l_linear.weight"] = torch.zeros(1, 5)
    torch.save(wrong_shape, tmp_path / "shape.pt")
    with pytest.raises(CheckpointError, match="shape.pt.*l_linear"):
        load_hift(tmp_path / "shape.pt")

    torch.save({"model": state}, tmp_path / "nested.pt")
    with pytest.raises(CheckpointError, match="nested.pt.*dict of tensors"):
        load_hift(tmp_path / "nested.pt")


def test_released_config_is_upstreams_hard_coded_one():
    # utils/hift_util.py of zai-org/GLM-TTS, which the released hift.pt was trained with.
    assert GLM_HIFT_CONFIG["base_channels"] == 512 and not GLM_HIFT_CONFIG["causal"]
    assert GLM_HIFT_CONFIG["f0_predictor"]["cond_channels"] == 512
    assert tuple(GLM_HIFT_CONFIG["upsample_rates"]) == (8, 5, 3)
    assert tuple(GLM_HIFT_CONFIG["source_resblock_kernel_sizes"]) == (7, 7, 11)


# --- Vocos2D (TorchScript) -------------------------------------------------------------------

def test_vocos2d_torchscript_gives_640_samples_per_frame_at_32khz(tmp_path):
    path = write_random_vocos2d(tmp_path / "vocos2d" / "generator_jit.ckpt", seed=3)
    vocoder = load_vocos2d(path)
    assert isinstance(vocoder, Vocoder)
    assert vocoder.sample_rate == 32000 and vocoder.samples_per_mel == 640
    x = mel(17, batch=2)
    audio = vocoder(x)
    assert audio.shape == (2, 17 * 640) and audio.dtype == torch.float32
    # Frames along time and Vocos2D's log offset, as upstream feeds the generator.
    assert torch.equal(audio, vocoder.generator(x.transpose(1, 2) + MEL_LOGDIFF))
    # One frame is doubled, as upstream does: two frames of audio.
    assert vocoder(x[:, :, :1]).shape == (2, 2 * 640)

    with pytest.raises(CheckpointError, match="missing.ckpt.*not found"):
        load_vocos2d(tmp_path / "missing.ckpt")
    (tmp_path / "corrupt.ckpt").write_bytes(b"not torchscript")
    with pytest.raises(CheckpointError, match="corrupt.ckpt.*not a loadable TorchScript"):
        load_vocos2d(tmp_path / "corrupt.ckpt")
