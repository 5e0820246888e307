"""The higgs-audio v2 codec (tritontts.higgs_codec) on a tiny random checkpoint: our decoder
against transformers' HiggsAudioV2TokenizerModel.decode and vLLM-Omni 0.30's
OmniVoiceDecoder, the encoder against transformers' encode, loader errors, weight-norm
folding, and the decoder as an onnxruntime graph."""
from __future__ import annotations

import json
import math
import shutil
import types

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tritontts.checkpoint import CheckpointError
from tritontts.higgs_codec import (CONFIG_FILE, PREPROCESSOR_FILE, WEIGHTS_FILE, HiggsCodecConfig,
                                   HiggsCodecDecoder, HiggsCodecEncoder, _tokenizer_classes,
                                   codec_config_dict, decoder_graph, load_codec_decoder, resample,
                                   write_random_codec)

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An OmniVoice-like folder: the codec sits in audio_tokenizer/ (vLLM-Omni's layout)."""
    root = tmp_path_factory.mktemp("omnivoice")
    write_random_codec(root / "audio_tokenizer", size="tiny", seed=0)
    return root


@pytest.fixture(scope="module")
def codec_dir(model_dir):
    return model_dir / "audio_tokenizer"


@pytest.fixture(scope="module")
def decoder(codec_dir):
    return load_codec_decoder(codec_dir)


@pytest.fixture(scope="module")
def transformers_codec(codec_dir):
    model_class, _ = _tokenizer_classes()
    return model_class.from_pretrained(str(codec_dir), local_files_only=True).eval()


def random_codes(batch: int, frames: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 1024, (batch, 8, frames), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@torch.no_grad()
def test_decoder_matches_transformers_decode_within_1e4(decoder, transformers_codec):
    codes = random_codes(2, 20)
    ours = decoder(codes)
    reference = transformers_codec.decode(codes, return_dict=False)      # [B, 1, samples]
    assert reference.shape == (2, 1, ours.shape[1])
    diff = max_diff(ours, reference[:, 0])
    print(f"max-abs-diff vs transformers: {diff:.3g}")
    assert diff <= TOLERANCE


@torch.no_grad()
def test_perturbed_weight_and_shifted_codes_break_the_transformers_bound(decoder, transformers_codec):
    """Negative control: the parity bound is tight enough to see a 1 % error in one conv
    or codes off by one entry."""
    codes = random_codes(1, 20)
    reference = transformers_codec.decode(codes, return_dict=False)[:, 0]
    assert max_diff(decoder((codes + 1) % 1024), reference) > TOLERANCE
    weight = decoder.acoustic_decoder.block[2].conv_t1.weight
    saved = weight.detach().clone()
    try:
        weight.mul_(1.01)
        assert max_diff(decoder(codes), reference) > TOLERANCE
    finally:
        weight.copy_(saved)
    assert max_diff(decoder(codes), reference) <= TOLERANCE


@torch.no_grad()
def test_decoder_matches_vllm_omni_omnivoice_decoder_within_1e4(decoder, model_dir):
    from tritontts.testing.references import vllm_omni_module

    with vllm_omni_module("vllm_omni.model_executor.models.omnivoice.omnivoice_decoder") as module:
        reference = module.OmniVoiceDecoder(types.SimpleNamespace(sample_rate=24000))
        reference.load_weights(str(model_dir), torch.device("cpu"))
    codes = random_codes(2, 20, seed=2)
    expected = reference(codes)                                          # [B, 1, samples]
    diff = max_diff(decoder(codes), expected[:, 0])
    print(f"max-abs-diff vs vLLM-Omni: {diff:.3g}")
    assert diff <= TOLERANCE


@torch.no_grad()
def test_audio_is_960_samples_per_frame_at_24khz_finite_and_audible(decoder):
    assert decoder.cfg.sample_rate == 24000
    assert decoder.cfg.samples_per_frame == 960 and decoder.cfg.frame_rate == 25
    assert decoder.cfg.num_quantizers == 8 and decoder.cfg.codebook_size == 1024
    for frames in (1, 7, 25):
        audio = decoder(random_codes(1, frames))
        assert audio.shape == (1, frames * 960) and audio.dtype == torch.float32
        assert torch.isfinite(audio).all()
        assert 1e-3 <= float(audio.abs().max()) <= 10


@torch.no_grad()
def test_batch_of_two_equals_the_two_decoded_singly(decoder):
    codes = random_codes(2, 15, seed=3)
    batch = decoder(codes)
    singles = torch.cat([decoder(codes[:1]), decoder(codes[1:])])
    assert max_diff(batch, singles) <= 1e-5


def test_random_codec_has_distinct_codebook_vectors_and_is_seeded(codec_dir, tmp_path):
    weights = load_file(str(codec_dir / WEIGHTS_FILE))
    for level in range(8):
        table = weights[f"quantizer.quantizers.{level}.codebook.embed"]
        assert table.shape == (1024, 16)
        assert len(torch.unique(table, dim=0)) == 1024
    again = load_file(str(write_random_codec(tmp_path / "again", seed=0) / WEIGHTS_FILE))
    other = load_file(str(write_random_codec(tmp_path / "other", seed=1) / WEIGHTS_FILE))
    assert all(torch.equal(weights[k], again[k]) for k in weights)
    assert not torch.equal(weights["fc2.weight"], other["fc2.weight"])
    assert json.loads((codec_dir / PREPROCESSOR_FILE).read_text())["sampling_rate"] == 24000


def test_encoder_codes_one_second_sine_as_8x25_equal_to_transformers_encode(codec_dir, transformers_codec):
    encoder = HiggsCodecEncoder(codec_dir)
    sine = (0.5 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)).astype(np.float32)
    codes = encoder.encode(sine)
    assert codes.shape == (8, 25) and codes.dtype == np.int64
    assert codes.min() >= 0 and codes.max() < 1024
    with torch.inference_mode():
        expected = transformers_codec.encode(torch.from_numpy(sine)[None, None], return_dict=False)
    np.testing.assert_array_equal(codes, expected[0].numpy())
    # Cut to whole frames first: a partial last frame is dropped, not padded.
    longer = np.concatenate([sine, sine[:500]])
    np.testing.assert_array_equal(encoder.encode(longer), codes)
    with pytest.raises(ValueError, match="shorter than one codec frame"):
        encoder.encode(sine[:959])


def test_resample_keeps_a_1khz_tone_when_going_from_24_to_16khz():
    """Our stand-in for torchaudio.functional.resample (HuBERT's 16 kHz input): a band-limited
    tone comes out as the same tone at the new rate, away from the zero-padded ends."""
    seconds = np.arange(24000) / 24000
    tone = torch.from_numpy(np.sin(2 * np.pi * 1000 * seconds)).float()[None, None]
    out = resample(tone, 24000, 16000)
    assert out.shape == (1, 1, 16000)
    expected = torch.from_numpy(np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000)).float()
    assert max_diff(out[0, 0, 200:-200], expected[200:-200]) < 1e-3
    assert resample(tone, 24000, 24000) is tone


def copy_codec(codec_dir, target):
    shutil.copytree(codec_dir, target)
    return target


def test_missing_weights_file_raises_checkpoint_error_naming_it(codec_dir, tmp_path):
    broken = copy_codec(codec_dir, tmp_path / "codec")
    (broken / WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match=WEIGHTS_FILE):
        load_codec_decoder(broken)
    with pytest.raises(CheckpointError, match=WEIGHTS_FILE):
        HiggsCodecEncoder(broken)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"model_type": "dac"}',
                                  '{"acoustic_model_config": {"upsampling_ratios": [8, 5, 4, 2, 2]}}'])
def test_malformed_config_raises_checkpoint_error_naming_it(codec_dir, tmp_path, text):
    broken = copy_codec(codec_dir, tmp_path / "codec")
    (broken / CONFIG_FILE).write_text(text)
    with pytest.raises(CheckpointError, match=CONFIG_FILE):
        load_codec_decoder(broken)


def test_missing_decoder_tensor_raises_checkpoint_error_naming_the_key(codec_dir, tmp_path):
    broken = copy_codec(codec_dir, tmp_path / "codec")
    weights = load_file(str(broken / WEIGHTS_FILE))
    del weights["acoustic_decoder.block.1.res_unit2.conv1.bias"]
    save_file(weights, str(broken / WEIGHTS_FILE))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*acoustic_decoder\.block\.1\.res_unit2\.conv1\.bias"):
        load_codec_decoder(broken)


@torch.no_grad()
def test_weight_norm_stored_as_parametrizations_or_g_v_folds_to_the_same_audio(codec_dir, decoder, tmp_path):
    """A checkpoint saved with weight norm on (torch's parametrizations or the older
    weight_g / weight_v hook) loads to the same plain weights."""
    variant = copy_codec(codec_dir, tmp_path / "codec")
    weights = load_file(str(variant / WEIGHTS_FILE))
    generator = torch.Generator().manual_seed(5)

    def split(weight):                  # norm over all dims but 0, as weight_norm does
        v = weight * (0.5 + torch.rand(weight.shape[0], 1, 1, generator=generator))
        return weight.norm(dim=(1, 2), keepdim=True), v

    stem = "acoustic_decoder.conv1"
    g, v = split(weights.pop(stem + ".weight"))
    weights[stem + ".parametrizations.weight.original0"] = g
    weights[stem + ".parametrizations.weight.original1"] = v
    stem = "acoustic_decoder.block.0.conv_t1"
    g, v = split(weights.pop(stem + ".weight"))
    weights[stem + ".weight_g"], weights[stem + ".weight_v"] = g, v
    save_file(weights, str(variant / WEIGHTS_FILE))
    codes = random_codes(1, 10)
    assert max_diff(load_codec_decoder(variant)(codes), decoder(codes)) <= 1e-5


def test_decoder_graph_declares_codes_in_and_audio_out():
    """The graph build/export.py exports (its onnxruntime parity at min, opt and odd shapes,
    with a perturbed-weight control, is tests/test_runtime.py's, as for every graph)."""
    cfg = HiggsCodecConfig.from_dict(codec_config_dict("tiny"))
    graph = decoder_graph(HiggsCodecDecoder(cfg).eval(), max_batch=2, max_frames=40)
    assert [s.name for s in graph.inputs] == ["codes"] and graph.outputs == ("audio",)
    assert graph.inputs[0].shape == ("batch", 8, "frames") and graph.inputs[0].high == 1024
    (audio,) = graph.torch_call(*graph.example({"batch": 1, "frames": 3}))
    assert audio.shape == (1, 3 * 960) and math.isfinite(float(audio.abs().max()))