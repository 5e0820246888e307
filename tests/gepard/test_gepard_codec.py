"""Gepard's NanoCodec decoder (ours) against nanocodec-torch 1.0.0 (a pure-torch port of
NeMo's, reconfigured from its 12.5 fps defaults to the 21.5 fps codec's rates, levels and
groups with the tiny archive's widths) on the same random weights read from a tiny .nemo
archive in the released layout: decode to fp32 rounding, a perturbed weight as the negative
control; our per-dimension dequantization equals nanocodec-torch's decode of the composed
mixed-radix group index and vLLM-Omni 0.30's Gepard formula; windows with context_frames of
left context decode exactly as the whole utterance (float64), one frame less does not; the
archive reader's errors name the file and the member or field."""
from __future__ import annotations

import io
import math
import tarfile
import types
from pathlib import Path

import pytest
import torch

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.gepard.codec import (
    CONFIG_MEMBER, WEIGHTS_MEMBER, NanoCodecConfig, NanoCodecDecoder, fold_weight_norm,
    nemo_model_config, read_nemo_codec, read_nemo_config, write_random_nemo_codec)
from tritontts.upstream import vllm_omni_module


def random_codes(config: NanoCodecConfig, frames: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, levels, (batch, frames), generator=gen)
                        for levels in config.code_levels], dim=1)


def group_indices(config: NanoCodecConfig, codes: torch.Tensor) -> torch.Tensor:
    """Per-dimension codes [B, 32, T] -> NeMo's mixed-radix index per group [B, 8, T]
    (dimension d weighs the product of the levels before it)."""
    bases = torch.tensor([math.prod(config.levels[:d]) for d in range(len(config.levels))])
    b, _, t = codes.shape
    return (codes.view(b, config.num_groups, len(config.levels), t) * bases.view(1, 1, -1, 1)).sum(2)


def nanocodec_torch():
    try:
        from nanocodec_torch.models import decoder, quantizer_fixed
        from nanocodec_torch.utils import weight_loader_v2
    except ImportError as exc:  # pragma: no cover - environment
        raise AssertionError(f"nanocodec-torch reference missing ({exc}): run scripts/setup.sh") from None
    return decoder, quantizer_fixed, weight_loader_v2


def reference_quantizer(config: NanoCodecConfig):
    _, quantizer_fixed, _ = nanocodec_torch()
    return quantizer_fixed.GroupFiniteScalarQuantizer(config.num_groups, list(config.levels))


def reference(config: NanoCodecConfig, state: dict[str, torch.Tensor]):
    """nanocodec-torch's decoder and quantizer, built for this config, loaded by its own NeMo
    name mapping (weight norm folded by it)."""
    decoder, _, loader = nanocodec_torch()
    model = decoder.CausalHiFiGANDecoder(
        up_sample_rates=list(config.up_sample_rates), input_dim=config.codes_per_frame,
        base_channels=config.base_channels, activation="half_snake", output_activation="clamp")
    loader.load_decoder_weights(types.SimpleNamespace(audio_decoder=model),
                                {k: v.numpy() for k, v in state.items() if k.startswith("audio_decoder.")})
    return model.eval(), reference_quantizer(config)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    return write_random_nemo_codec(tmp_path_factory.mktemp("nanocodec"), seed=0, size="tiny")


@pytest.fixture(scope="module")
def tiny(archive):
    config, state = read_nemo_codec(archive)
    return config, state, NanoCodecDecoder(config).load_nemo_state(state, str(archive)).eval()


def test_tiny_archive_is_in_the_released_layout_and_reads_back(archive, tiny):
    config, state, _ = tiny
    with tarfile.open(archive) as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == \
            ["./" + CONFIG_MEMBER, "./" + WEIGHTS_MEMBER]
    assert config == NanoCodecConfig.from_yaml(nemo_model_config("tiny"), "tiny") == read_nemo_config(archive)
    assert config.codes_per_frame == 32 and config.code_levels[:8] == (8, 7, 6, 6, 8, 7, 6, 6)
    assert config.samples_per_frame == 1024 and round(config.frame_rate, 2) == 21.53
    # 97 convs as (bias, g, v) and 96 snake alphas; the encoder's and the FSQ buffers too.
    assert sum(k.startswith("audio_decoder.") for k in state) == 97 * 3 + 96
    assert "audio_decoder.up_sample_conv_layers.0.conv.parametrizations.weight.original0" in state
    assert any(k.startswith("audio_encoder.") for k in state)
    assert state["vector_quantizer.fsqs.7.num_levels"].flatten().tolist() == [8, 7, 6, 6]


def test_released_config_builds_the_released_decoder():
    config = NanoCodecConfig.from_yaml(nemo_model_config("released"), "released")
    assert config.base_channels == 864 and config.up_sample_rates == (8, 8, 4, 2, 2)
    assert config.channels(len(config.up_sample_rates)) == 27
    assert config.context_frames == 25          # 25440 samples of reach: 24.84 frames
    with torch.device("meta"):
        decoder = NanoCodecDecoder(config)
    params = sum(p.numel() for p in decoder.parameters())
    print(f"released decoder: {params / 1e6:.2f} M parameters (weight norm folded)")
    assert round(params / 1e6, 2) == 31.56


def test_per_dimension_dequantization_equals_the_group_index_decode_and_vllm_omni(tiny):
    config, _, ours = tiny
    quantizer = reference_quantizer(config)
    codes = random_codes(config, 64)
    latents = ours.dequantize(codes)
    # Every level of every dimension appears, so the whole table is compared.
    assert all(len(codes[:, d].unique()) == levels for d, levels in enumerate(config.code_levels))
    assert torch.equal(latents, quantizer.decode(group_indices(config, codes)))

    class StockCodecModel(torch.nn.Module):
        """Stands in for NeMo's AudioCodecModel: decode_audio hands back its input."""

        def decode_audio(self, inputs, input_len):
            return inputs, input_len

    nemo = {"nemo": {}, "nemo.collections": {}, "nemo.collections.tts": {},
            "nemo.collections.tts.models": {"AudioCodecModel": StockCodecModel}}
    with vllm_omni_module("vllm_omni.model_executor.models.gepard.nanocodec", nemo) as m:
        unfolded = m._make_unfolded_codec_cls()
    theirs = unfolded.__new__(unfolded)
    torch.nn.Module.__init__(theirs)          # their __init__ wants a NeMo config
    theirs.vector_quantizer = quantizer
    got, _ = theirs.decode_from_codes(codes, torch.full((2,), codes.shape[-1]))
    assert torch.equal(latents, got)


def test_decode_matches_nanocodec_torch(tiny):
    config, state, ours = tiny
    model, quantizer = reference(config, state)
    codes = random_codes(config, 50)
    with torch.no_grad():
        want, _ = model(quantizer.decode(group_indices(config, codes)))
    got = ours.decode_codes(codes)
    diff = (got - want[:, 0]).abs().max().item()
    print(f"decode {tuple(got.shape)}: max-abs-diff {diff:.2e} (peak {want.abs().max():.2f})")
    assert got.shape == (2, 50 * 1024) and got.dtype == torch.float32
    assert diff <= 1e-4
    # Negative control: one perturbed weight (a last-stage residual conv) changes the audio.
    bad = dict(state)
    key = "audio_decoder.res_layers.4.res_blocks.2.res_blocks.1.input_conv.conv.parametrizations.weight.original1"
    bad[key] = bad[key] + 0.05
    perturbed = NanoCodecDecoder(config).load_nemo_state(bad).eval().decode_codes(codes)
    assert (perturbed - want[:, 0]).abs().max() > 1e-3


def test_batch_items_decode_as_they_do_alone(tiny):
    config, _, ours = tiny
    codes = random_codes(config, 12, batch=3, seed=3)
    batch = ours.decode_codes(codes)
    for i in range(3):
        assert (batch[i] - ours.decode_codes(codes[i:i + 1])[0]).abs().max() < 1e-6


def test_windows_with_context_frames_decode_exactly_as_the_whole(tiny):
    config, state, _ = tiny
    ours = NanoCodecDecoder(config).load_nemo_state(state).double().eval()
    codes = random_codes(config, 40, batch=1, seed=2)
    whole = ours.decode_codes(codes)[0]
    context, start, hop = config.context_frames, 30, config.samples_per_frame
    assert context == 25

    def error(frames: int) -> torch.Tensor:
        window = ours.decode_window(codes[..., start - frames:], frames)[0]
        return (window - whole[start * hop:]).abs()

    exact, short, lookback = error(context), error(context - 1), error(8)
    print(f"max-abs-diff with {context} frames of context: {exact.max():.1e}; {context - 1}: "
          f"{short.max():.1e}; vLLM-Omni's 8: {lookback.max():.1e} (peak {whole.abs().max():.2f})")
    assert exact.max() < 1e-14
    # One frame less: the reach (25440 samples) passes the window's start by 864 samples;
    # the far ends of the receptive field weigh little, but far above float64 rounding.
    reach_past = 25440 - (context - 1) * hop
    assert short.max() > 1e-13 and short[reach_past:].max() < 1e-14
    # A window from the first frame needs no context.
    assert (ours.decode_codes(codes[..., :20])[0] - whole[:20 * hop]).abs().max() < 1e-14


def test_decode_codes_rejects_wrong_shapes_and_out_of_range_codes(tiny):
    config, _, ours = tiny
    codes = random_codes(config, 3, batch=1)
    with pytest.raises(ValueError, match=r"\[batch, 32, frames\]"):
        ours.decode_codes(codes[:, :8])
    bad = codes.clone()
    bad[0, 5, 1] = 7                            # dimension 1 of group 1 has 7 levels
    with pytest.raises(ValueError, match=r"code 5 out of range \[0, 7\)"):
        ours.decode_codes(bad)
    assert ours.decode_codes(codes[..., :0]).shape == (1, 0)


def test_legacy_weight_g_and_v_fold_like_the_parametrization(tiny):
    config, state, ours = tiny
    legacy = {k.replace(".parametrizations.weight.original0", ".weight_g")
              .replace(".parametrizations.weight.original1", ".weight_v"): v for k, v in state.items()}
    again = NanoCodecDecoder(config).load_nemo_state(legacy).eval()
    codes = random_codes(config, 4, batch=1)
    assert torch.equal(again.decode_codes(codes), ours.decode_codes(codes))
    with pytest.raises(CheckpointError, match=r"legacy: audio_decoder\.pre_conv\.conv\.weight_g without its "
                                              r"audio_decoder\.pre_conv\.conv\.weight_v"):
        fold_weight_norm({k: v for k, v in legacy.items() if k != "audio_decoder.pre_conv.conv.weight_v"}, "legacy")


# --- the archive reader's errors -----------------------------------------------------------

def write_tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def config_yaml(**changes) -> bytes:
    import yaml

    data = nemo_model_config("tiny")
    for dotted, value in changes.items():
        *parents, name = dotted.split("__")
        owner = data
        for parent in parents:
            owner = owner[parent]
        if value is None:
            del owner[name]
        else:
            owner[name] = value
    return yaml.safe_dump(data).encode()


def small_weights() -> bytes:
    buffer = io.BytesIO()
    torch.save({"audio_decoder.pre_conv.conv.bias": torch.zeros(96)}, buffer)
    return buffer.getvalue()


def test_reader_names_a_missing_archive(tmp_path):
    with pytest.raises(CheckpointError, match=r"missing\.nemo: NanoCodec \.nemo archive not found"):
        read_nemo_codec(tmp_path / "missing.nemo")


def test_reader_names_a_file_that_is_not_a_tar(tmp_path):
    (tmp_path / "codec.nemo").write_bytes(b"not a tar archive at all" * 40)
    with pytest.raises(CheckpointError, match=r"codec\.nemo: not a \.nemo archive"):
        read_nemo_codec(tmp_path / "codec.nemo")


def test_reader_names_the_missing_member(tmp_path):
    path = write_tar(tmp_path / "codec.nemo", {"./" + CONFIG_MEMBER: config_yaml()})
    for read in (read_nemo_codec, read_nemo_config):
        with pytest.raises(CheckpointError, match=r"codec\.nemo: model_weights\.ckpt missing from the \.nemo "
                                                  r"archive \(it holds: model_config\.yaml\)"):
            read(path)


def test_reader_takes_members_without_the_dot_slash_prefix(tmp_path):
    path = write_tar(tmp_path / "codec.nemo", {CONFIG_MEMBER: config_yaml(), WEIGHTS_MEMBER: small_weights()})
    config, state = read_nemo_codec(path)
    assert config.base_channels == 96 and list(state) == ["audio_decoder.pre_conv.conv.bias"]


@pytest.mark.parametrize("changes, message", [
    ({"vector_quantizer__num_levels_per_group": None}, r"vector_quantizer\.num_levels_per_group is missing"),
    ({"audio_decoder__up_sample_rates": [8, 8, 4, 2]}, r"audio_decoder\.up_sample_rates multiply to 512, "
                                                        r"not samples_per_frame \(1024\)"),
    ({"audio_decoder__activation": "lrelu"}, r"audio_decoder\.activation is 'lrelu'"),
    ({"audio_decoder___target_": "nemo.collections.tts.modules.audio_codec_modules.HiFiGANDecoder"},
     r"audio_decoder\._target_ is .*HiFiGANDecoder'; only NeMo's CausalHiFiGANDecoder"),
    ({"audio_decoder__input_dim": 16}, r"audio_decoder\.input_dim must be .* = 32"),
])
def test_reader_names_the_bad_config_field(tmp_path, changes, message):
    path = write_tar(tmp_path / "codec.nemo", {"./" + CONFIG_MEMBER: config_yaml(**changes),
                                               "./" + WEIGHTS_MEMBER: small_weights()})
    with pytest.raises(CheckpointError, match=r"codec\.nemo:model_config\.yaml: " + message):
        read_nemo_codec(path)


def test_reader_names_unreadable_yaml_and_weights_members(tmp_path):
    path = write_tar(tmp_path / "a.nemo", {"./" + CONFIG_MEMBER: b"audio_decoder: [unclosed",
                                           "./" + WEIGHTS_MEMBER: small_weights()})
    with pytest.raises(CheckpointError, match=r"a\.nemo:model_config\.yaml: not readable YAML"):
        read_nemo_codec(path)
    path = write_tar(tmp_path / "b.nemo", {"./" + CONFIG_MEMBER: config_yaml(),
                                           "./" + WEIGHTS_MEMBER: b"\x80\x02 not a torch file"})
    with pytest.raises(CheckpointError, match=r"b\.nemo:model_weights\.ckpt: not a loadable torch state dict"):
        read_nemo_codec(path)


def test_reader_rejects_quantizer_levels_that_disagree_with_the_config(tmp_path):
    buffer = io.BytesIO()
    torch.save({"vector_quantizer.fsqs.2.num_levels": torch.tensor([8, 5, 5, 5]).view(1, 4, 1)}, buffer)
    path = write_tar(tmp_path / "codec.nemo", {"./" + CONFIG_MEMBER: config_yaml(),
                                               "./" + WEIGHTS_MEMBER: buffer.getvalue()})
    with pytest.raises(CheckpointError, match=r"vector_quantizer\.fsqs\.2\.num_levels is \[8, 5, 5, 5\]"):
        read_nemo_codec(path)


def test_decoder_load_names_missing_and_misshapen_tensors(tiny):
    config, state, _ = tiny
    bad = {k: v for k, v in state.items() if not k.startswith("audio_decoder.post_conv.")}
    bad["audio_decoder.pre_conv.conv.bias"] = torch.zeros(5)
    with pytest.raises(CheckpointError, match=r"codec\.nemo \(audio_decoder\.\*\) does not match the model; "
                                              r"missing keys: post_conv\.conv\.bias, post_conv\.conv\.weight; "
                                              r"shape mismatches: pre_conv\.conv\.bias \(5,\) vs \(96,\)"):
        NanoCodecDecoder(config).load_nemo_state(bad, "codec.nemo")
    with pytest.raises(CheckpointError, match=r"codec\.nemo: no audio_decoder\.\* tensors"):
        NanoCodecDecoder(config).load_nemo_state({"audio_encoder.x": torch.zeros(1)}, "codec.nemo")
