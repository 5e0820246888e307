"""The higgs-audio v2 codec (tritontts.nn.higgs_codec) on a tiny random checkpoint: our decoder
against transformers' HiggsAudioV2TokenizerModel.decode and vLLM-Omni 0.30's
OmniVoiceDecoder, the encoder against transformers' encode, loader errors, weight-norm
folding, the decoder as an onnxruntime graph, chunked (streaming) decoding against the
whole-utterance decode, and boson-ai's standalone layout (config.json + model.pth) against
the transformers layout and vLLM-Omni's boson decoder."""
from __future__ import annotations

import json
import math
import pathlib
import shutil
import types

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tritontts.weights.checkpoint import CheckpointError
from tritontts.nn.higgs_codec import (
    CONFIG_FILE, LEGACY_WEIGHTS_FILE, PREPROCESSOR_FILE, WEIGHTS_FILE, HiggsCodecConfig,
    HiggsCodecDecoder, HiggsCodecEncoder, chunk_window, context_frames, decode_chunk,
    decode_chunk_rows, decoder_graph, load_codec_decoder, resample, write_legacy_codec,
    write_random_codec)
from tritontts.nn.higgs_codec.encoder import _tokenizer_classes
from tritontts.nn.higgs_codec.random import codec_config_dict

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
    from tritontts.upstream import vllm_omni_module

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

# --- chunked (streaming) decoding -----------------------------------------------------------

CHUNK_FRAMES = (5, 25)          # a first chunk of 5 frames, then chunks of 25


def chunk_bounds(total: int) -> list[tuple[int, int]]:
    bounds, start, size = [], 0, CHUNK_FRAMES[0]
    while start < total:
        bounds.append((start, min(total, start + size)))
        start, size = start + size, CHUNK_FRAMES[1]
    return bounds


@torch.no_grad()
def decode_in_chunks(decoder, codes, left_context: int, right_context: int) -> list[torch.Tensor]:
    """Each chunk's audio, decoded from its own window (context clipped at the edges)."""
    total = codes.shape[-1]
    pieces = []
    for start, stop in chunk_bounds(total):
        lo, _, left, _ = chunk_window(start, stop, total, left_context)
        _, hi, _, right = chunk_window(start, stop, total, right_context)
        pieces.append(decode_chunk(decoder, codes[..., lo:hi], left, right))
    return pieces


def test_context_frames_is_ten_for_the_tiny_and_released_codecs():
    for size in ("tiny", "released"):
        assert context_frames(HiggsCodecConfig.from_dict(codec_config_dict(size))) == 10


@torch.no_grad()
def test_context_frames_equals_the_measured_reach_of_one_changed_frame(decoder):
    """Change every code of frame 30 of 61: exactly the frames within context_frames of it
    change (outside the receptive field the same inputs meet the same weights, so their
    samples stay bit-identical)."""
    codes = random_codes(1, 61, seed=6)
    changed = codes.clone()
    changed[..., 30] = (changed[..., 30] + 1) % 1024
    per_frame = (decoder(changed) - decoder(codes)).abs().view(61, 960).amax(dim=1)
    touched = torch.nonzero(per_frame > 0).flatten()
    before, after = 30 - int(touched.min()), int(touched.max()) - 30
    print(f"changed frame 30 reaches {before} frames before, {after} after; "
          f"context_frames {context_frames(decoder.cfg)}")
    assert max(before, after) == context_frames(decoder.cfg)
    assert len(touched) == before + after + 1           # every frame in between changes


@torch.no_grad()
def test_chunks_with_context_frames_both_sides_join_to_the_whole_decode_within_1e5(decoder):
    codes = random_codes(1, 120, seed=7)
    context = context_frames(decoder.cfg)
    pieces = decode_in_chunks(decoder, codes, context, context)
    assert [p.shape[-1] // 960 for p in pieces] == [5, 25, 25, 25, 25, 15]
    diff = max_diff(torch.cat(pieces, dim=-1), decoder(codes))
    print(f"chunked (context {context}) vs whole: max-abs-diff {diff:.3g}")
    assert diff <= 1e-5


@torch.no_grad()
def test_chunks_with_left_context_only_differ_from_the_whole_decode(decoder):
    """Negative control: the decoder looks ahead, so a chunk cut off on the right is wrong."""
    codes = random_codes(1, 120, seed=7)
    pieces = decode_in_chunks(decoder, codes, context_frames(decoder.cfg), 0)
    diff = max_diff(torch.cat(pieces, dim=-1), decoder(codes))
    print(f"chunked (left context only) vs whole: max-abs-diff {diff:.3g}")
    assert diff > 1e-4


@torch.no_grad()
def test_one_frame_less_context_changes_some_chunk_measurably(decoder):
    """context_frames is the least context that is exact, not merely enough."""
    codes = random_codes(1, 120, seed=7)
    context = context_frames(decoder.cfg) - 1
    diff = max_diff(torch.cat(decode_in_chunks(decoder, codes, context, context), dim=-1),
                    decoder(codes))
    print(f"chunked (context {context}) vs whole: max-abs-diff {diff:.3g}")
    assert diff > 1e-6


@torch.no_grad()
def test_decode_chunk_rows_equals_decode_chunk_row_by_row_and_margins_are_checked(decoder):
    codes = random_codes(2, 30, seed=8)
    rows = decode_chunk_rows(decoder, codes, [0, 10], [10, 4])
    assert [r.shape for r in rows] == [(20 * 960,), (16 * 960,)]
    assert max_diff(rows[0], decode_chunk(decoder, codes[:1], 0, 10)[0]) <= 1e-5
    assert max_diff(rows[1], decode_chunk(decoder, codes[1:], 10, 4)[0]) <= 1e-5
    for left, right in ((15, 15), (-1, 0), (0, 30)):
        with pytest.raises(ValueError, match="context frames"):
            decode_chunk(decoder, codes, left, right)
    with pytest.raises(ValueError, match="one left and right per row"):
        decode_chunk_rows(decoder, codes, [0], [0])
    assert chunk_window(5, 30, 120, 10) == (0, 40, 5, 10)
    assert chunk_window(105, 120, 120, 10) == (95, 120, 10, 0)


# --- boson-ai's standalone layout (config.json + model.pth) ---------------------------------

@pytest.fixture(scope="module")
def legacy_dir(tmp_path_factory):
    """The tiny codec of codec_dir (seed 0) in boson-ai's layout."""
    return write_legacy_codec(tmp_path_factory.mktemp("legacy") / "codec", size="tiny", seed=0)


def load_pth(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@torch.no_grad()
def test_legacy_layout_loads_the_same_decoder_as_the_transformers_layout_exactly(legacy_dir, decoder):
    """Same seed, boson's names and (weight_g, weight_v) pairs: bit-identical weights and audio."""
    assert sorted(p.name for p in legacy_dir.iterdir()) == [CONFIG_FILE, LEGACY_WEIGHTS_FILE]
    config = json.loads((legacy_dir / CONFIG_FILE).read_text())
    assert "model_type" not in config and config["D"] == 16 and config["ratios"] == [8, 5, 4, 2, 3]
    stored = load_pth(legacy_dir / LEGACY_WEIGHTS_FILE)
    assert "decoder_2.model.1.block.1.weight_g" in stored and "fc_post2.weight" in stored
    assert "quantizer.vq.layers.7._codebook.embed" in stored
    assert not any(k.startswith(("acoustic_decoder.", "fc2.")) for k in stored)
    legacy = load_codec_decoder(legacy_dir)
    ours = decoder.state_dict()
    assert all(torch.equal(t, ours[k]) for k, t in legacy.state_dict().items())
    codes = random_codes(2, 20, seed=9)
    assert torch.equal(legacy(codes), decoder(codes))


@torch.no_grad()
def test_folder_with_both_weight_files_follows_config_model_type(legacy_dir, codec_dir, decoder, tmp_path):
    """config.json of model_type higgs_audio_v2_tokenizer: model.safetensors; boson's
    config.json: model.pth. The other file holds another seed's codec each time."""
    codes = random_codes(1, 10, seed=10)
    other = tmp_path / "other"
    write_random_codec(other / "transformers", seed=1)
    write_legacy_codec(other / "legacy", seed=1)
    boson = copy_codec(legacy_dir, tmp_path / "boson")
    shutil.copy(other / "transformers" / WEIGHTS_FILE, boson / WEIGHTS_FILE)
    hf = copy_codec(codec_dir, tmp_path / "hf")
    shutil.copy(other / "legacy" / LEGACY_WEIGHTS_FILE, hf / LEGACY_WEIGHTS_FILE)
    expected = decoder(codes)
    assert torch.equal(load_codec_decoder(boson)(codes), expected)
    assert torch.equal(load_codec_decoder(hf)(codes), expected)
    assert max_diff(load_codec_decoder(other / "legacy")(codes), expected) > TOLERANCE


def test_legacy_decoder_key_misnamed_raises_checkpoint_error_naming_it(legacy_dir, tmp_path):
    broken = copy_codec(legacy_dir, tmp_path / "codec")
    tensors = load_pth(broken / LEGACY_WEIGHTS_FILE)
    key = "decoder_2.model.2.block.3.block.1.weight_v"
    tensors[key.replace("block.3", "block.9")] = tensors.pop(key)
    torch.save(tensors, broken / LEGACY_WEIGHTS_FILE)
    with pytest.raises(CheckpointError, match=r"model\.pth") as error:
        load_codec_decoder(broken)
    assert key in str(error.value) and key.replace("block.3", "block.9") in str(error.value)


class RunsCodeWhenUnpickled:
    """A pickle payload: unpickling it in full calls pathlib.Path.touch(marker)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


@pytest.mark.parametrize("content", ["code", "not_tensors", "garbage"])
def test_model_pth_that_is_not_a_tensor_dict_raises_checkpoint_error_and_runs_nothing(
        legacy_dir, tmp_path, content):
    broken = copy_codec(legacy_dir, tmp_path / "codec")
    weights, marker = broken / LEGACY_WEIGHTS_FILE, tmp_path / "ran"
    if content == "code":
        torch.save({"decoder_2.model.0.bias": RunsCodeWhenUnpickled(marker)}, weights)
        torch.load(weights, weights_only=False)              # control: a full unpickle runs it
        assert marker.exists()
        marker.unlink()
    elif content == "not_tensors":
        torch.save({"decoder_2.model.0.bias": [1, 2]}, weights)
    else:
        weights.write_bytes(b"neither a zip archive nor a pickle")
    with pytest.raises(CheckpointError, match=r"model\.pth"):
        load_codec_decoder(broken)
    with pytest.raises(CheckpointError, match=r"model\.pth"):
        HiggsCodecEncoder(broken)
    assert not marker.exists()


def test_legacy_config_without_codebook_dim_raises_checkpoint_error_naming_it(legacy_dir, tmp_path):
    broken = copy_codec(legacy_dir, tmp_path / "codec")
    config = json.loads((broken / CONFIG_FILE).read_text())
    del config["codebook_dim"]
    (broken / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json: codebook_dim is missing"):
        load_codec_decoder(broken)


def test_legacy_encoder_needs_a_hubert_base_semantic_model(legacy_dir):
    """Neither boson's config.json nor model.pth gives the HuBERT's architecture (heads);
    its teachers are HuBERT base, so the tiny codec's 32-wide one cannot be encoded with."""
    with pytest.raises(CheckpointError, match="HuBERT base"):
        HiggsCodecEncoder(legacy_dir)


@pytest.fixture(scope="module")
def released_pair(tmp_path_factory):
    """The released-size codec (seed 0) in both layouts (about 20 s): vLLM-Omni's boson
    decoder is hard-wired to the released widths, and encoding to HuBERT base's."""
    root = tmp_path_factory.mktemp("released")
    return (write_random_codec(root / "transformers", size="released", seed=0),
            write_legacy_codec(root / "legacy", size="released", seed=0))


@torch.no_grad()
def test_legacy_decoder_matches_vllm_omni_boson_decoder_within_1e4_at_released_size(released_pair):
    """An independent reading of boson's names: vLLM-Omni's model.pth path (its key remap
    and its copy of boson's weight-normed DAC decoder)."""
    from tritontts.upstream import vllm_omni_module

    legacy_dir = released_pair[1]
    with vllm_omni_module("vllm_omni.model_executor.models.higgs_audio_v2.higgs_audio_decoder") as module:
        quantizer, fc2, acoustic_decoder, _ = module.load_higgs_audio_codec(str(legacy_dir), torch.device("cpu"))
    assert type(acoustic_decoder).__name__ == "BosonDacDecoder"
    codes = random_codes(2, 10, seed=11)
    latent = fc2(quantizer.decode(codes.permute(1, 0, 2)).transpose(1, 2)).transpose(1, 2)
    expected = acoustic_decoder(latent)[:, 0]
    ours = load_codec_decoder(legacy_dir)(codes)
    diff = max_diff(ours, expected)
    print(f"max-abs-diff vs vLLM-Omni's boson decoder: {diff:.3g} (peak {float(ours.abs().max()):.3g})")
    assert diff <= TOLERANCE


def test_legacy_encoder_codes_equal_the_transformers_layout_encoder_at_released_size(released_pair):
    transformers_dir, legacy_dir = released_pair
    tone = (0.5 * np.sin(2 * np.pi * 220 * np.arange(9600) / 24000)).astype(np.float32)
    codes = HiggsCodecEncoder(legacy_dir).encode(tone)
    assert codes.shape == (8, 10)
    np.testing.assert_array_equal(codes, HiggsCodecEncoder(transformers_dir).encode(tone))
