"""Qwen3-TTS Base reference-audio encoders (tritontts.families.qwen3_tts.speaker_encoder and
.speech_encoder) against the references, on tiny random weights shared with them, fp32, CPU.

The checkpoint is written in the released layout: config.json + model.safetensors (the
speaker encoder under speaker_encoder.*, beside a talker tensor that must stay unread) and
speech_tokenizer/{config.json, preprocessor_config.json, model.safetensors} with the
reference tokenizer's whole state dict (encoder.* and decoder.*). The Mimi encoder keeps the
released frame geometry (ratios 8*6*5*4, downsample 2: 1920 samples a frame) at tiny widths.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.qwen3_tts import speaker_encoder as spk
from tritontts.families.qwen3_tts.speaker_encoder import (
    SpeakerEncoder, SpeakerEncoderConfig, load_speaker_encoder, speaker_log_mel)
from tritontts.families.qwen3_tts.speech_encoder import (
    SpeechEncoder, SpeechEncoderConfig, load_speech_encoder)
from tritontts.protocol import InvalidRequest
from tritontts.families.qwen3_tts.upstream import qwen_tts_module
from tritontts.upstream import vllm_omni_module

SPEAKER_CONFIG = dict(enc_dim=12, enc_channels=[16, 16, 16, 16, 48], enc_kernel_sizes=[5, 3, 3, 3, 1],
                      enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=8, enc_res2net_scale=4,
                      enc_se_channels=8, sample_rate=24000)
ENCODER_CONFIG = dict(  # a MimiConfig: released geometry, tiny widths; 20 codebooks, 16 kept
    sampling_rate=24000, upsampling_ratios=[8, 6, 5, 4], frame_rate=12.5, hidden_size=16,
    num_filters=4, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
    intermediate_size=32, codebook_size=64, codebook_dim=8, vector_quantization_hidden_dimension=8,
    num_quantizers=20, num_semantic_quantizers=1, upsample_groups=16, sliding_window=250)
DECODER_CONFIG = dict(  # only so that the reference tokenizer can be built; never run
    codebook_size=64, codebook_dim=16, hidden_size=16, latent_dim=16, num_attention_heads=2,
    num_key_value_heads=2, head_dim=8, intermediate_size=32, num_hidden_layers=1, num_quantizers=16,
    upsample_rates=[2, 2], upsampling_ratios=[2], decoder_dim=16)
TOKENIZER_CONFIG = dict(model_type="qwen3_tts_tokenizer_12hz", encoder_valid_num_quantizers=16,
                        input_sample_rate=24000, output_sample_rate=24000, encode_downsample_rate=1920,
                        decode_upsample_rate=1920)
PREPROCESSOR = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor",
                "feature_size": 1, "overlap": None, "padding_side": "right", "padding_value": 0.0,
                "return_attention_mask": True, "sampling_rate": 24000}
# The released encoder_config (Qwen3-TTS-Tokenizer-12Hz), for the key/shape geometry test.
RELEASED_ENCODER_CONFIG = dict(
    sampling_rate=24000, upsampling_ratios=[8, 6, 5, 4], frame_rate=12.5, hidden_size=512,
    num_filters=64, num_residual_layers=1, kernel_size=7, last_kernel_size=3, residual_kernel_size=3,
    dilation_growth_rate=2, compress=2, use_causal_conv=True, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=8, head_dim=64, intermediate_size=2048,
    codebook_size=2048, codebook_dim=256, vector_quantization_hidden_dimension=256,
    num_quantizers=32, num_semantic_quantizers=1, sliding_window=250)
SAMPLES_PER_FRAME = 1920


@pytest.fixture(scope="module")
def speechlike():
    """3 s at 24 kHz: a 150 Hz voice with harmonics, vibrato and a syllable envelope, in noise."""
    rng = np.random.default_rng(0)
    t = np.arange(24000 * 3) / 24000
    phase = 2 * np.pi * (150 * t + 4 * np.sin(2 * np.pi * 5 * t))
    voice = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return (0.2 * voice + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def randomized(state: dict, seed: int) -> dict:
    """Seeded weights that keep activations near unit scale: 1/sqrt(fan_in) matrices, small
    biases, layer norms near 1, Mimi codebooks with random centroids and positive usage."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, value in state.items():
        rand = lambda: torch.randn(value.shape, generator=gen)  # noqa: E731
        if name.endswith("initialized"):
            new = torch.ones_like(value)
        elif name.endswith("cluster_usage"):
            new = 0.5 + torch.rand(value.shape, generator=gen)
        elif name.endswith("embed_sum"):
            new = rand()
        elif name.endswith("layer_scale.scale"):
            new = 0.2 + 0.3 * torch.rand(value.shape, generator=gen)
        elif value.ndim >= 2:
            new = rand() / math.sqrt(value[0].numel())
        elif "norm" in name and name.endswith("weight"):
            new = 1 + 0.1 * rand()
        else:
            new = 0.1 * rand()
        out[name] = new.to(value.dtype).contiguous()
    return out


def write_checkpoint(root: Path, speaker_state: dict, tokenizer_state: dict, config: dict | None = None) -> Path:
    tok = root / "speech_tokenizer"
    tok.mkdir(parents=True, exist_ok=True)
    config = config or {"tts_model_type": "base", "speaker_encoder_config": SPEAKER_CONFIG}
    (root / "config.json").write_text(json.dumps(config))
    talker = {"talker.model.norm.weight": torch.ones(4)}  # must not be read
    save_file({**talker, **{f"speaker_encoder.{k}": v for k, v in speaker_state.items()}},
              str(root / "model.safetensors"))
    (tok / "config.json").write_text(json.dumps({**TOKENIZER_CONFIG, "encoder_config": ENCODER_CONFIG,
                                                  "decoder_config": DECODER_CONFIG}))
    (tok / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    save_file(tokenizer_state, str(tok / "model.safetensors"))
    return root


def fit_codebooks(mimi, audio: np.ndarray, seed: int) -> None:
    """Centroids drawn from the clip's own (residual) encoder outputs plus jitter, as k-means
    starts: random centroids far from the data would give one code everywhere."""
    gen, seen = torch.Generator().manual_seed(seed), []
    quantizer = mimi.quantizer
    plain_encode = quantizer.encode
    quantizer.encode = lambda embeddings, n=None: (seen.append(embeddings), plain_encode(embeddings, n))[1]
    try:
        with torch.no_grad():
            mimi.encode(torch.from_numpy(audio)[None, None])
    finally:
        del quantizer.encode
    with torch.no_grad():  # both halves of the split RVQ quantize the same input
        for rvq in (quantizer.semantic_residual_vector_quantizer, quantizer.acoustic_residual_vector_quantizer):
            residual = rvq.input_proj(seen[0])[0].T
            for layer in rvq.layers:
                book = layer.codebook
                picks = residual[torch.randint(len(residual), (book.codebook_size,), generator=gen)]
                centroids = picks + 0.3 * residual.std(0) * torch.randn(picks.shape, generator=gen)
                book.embed_sum.copy_(centroids * book.cluster_usage[:, None])
                book._embed = None
                residual = residual - centroids[torch.cdist(residual, centroids).argmin(1)]


@pytest.fixture(scope="module")
def refs(tmp_path_factory, speechlike):
    """qwen-tts-compat's speaker encoder, its extract_speaker_embedding (features included) and
    its 12 Hz tokenizer model, all on the weights of the checkpoint written here."""
    with qwen_tts_module("qwen_tts.core.models.modeling_qwen3_tts") as model_mod:
        import qwen_tts.core.models.configuration_qwen3_tts as model_cfg

        speaker = model_mod.Qwen3TTSSpeakerEncoder(model_cfg.Qwen3TTSSpeakerEncoderConfig(**SPEAKER_CONFIG))
        extract = model_mod.Qwen3TTSForConditionalGeneration.extract_speaker_embedding
    with qwen_tts_module("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2") as tok_mod:
        import qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 as tok_cfg

        tokenizer = tok_mod.Qwen3TTSTokenizerV2Model(tok_cfg.Qwen3TTSTokenizerV2Config(
            encoder_config=ENCODER_CONFIG, decoder_config=DECODER_CONFIG, **TOKENIZER_CONFIG))
    speaker_state = randomized(speaker.state_dict(), seed=1)
    speaker.load_state_dict(speaker_state)
    state = tokenizer.state_dict()
    tokenizer_state = {**state, **randomized({k: v for k, v in state.items() if k.startswith("encoder.")}, 2)}
    tokenizer.load_state_dict(tokenizer_state)
    fit_codebooks(tokenizer.encoder, speechlike, seed=3)
    tokenizer_state = tokenizer.state_dict()
    root = write_checkpoint(tmp_path_factory.mktemp("qwen3-tts-base"), speaker_state,
                            {k: v.contiguous() for k, v in tokenizer_state.items()})
    return SimpleNamespace(speaker=speaker.eval(), extract=extract, tokenizer=tokenizer.eval(), root=root,
                           speaker_state=speaker_state, tokenizer_state=tokenizer_state)


def reference_embedding(refs, audio: np.ndarray):
    """(features, embedding) from qwen-tts's extract_speaker_embedding: its own mel parameters,
    with the mels it hands the speaker encoder recorded."""
    seen = []

    def encoder(mels):
        seen.append(mels[0].clone())
        return refs.speaker(mels)

    owner = SimpleNamespace(speaker_encoder=encoder, device=torch.device("cpu"), dtype=torch.float32)
    embedding = refs.extract(owner, audio, 24000)
    return seen[0], embedding


def reference_codes(refs, audio: np.ndarray) -> torch.Tensor:
    """qwen-tts's Qwen3TTSTokenizer.encode path: the checkpoint's feature extractor, then
    Qwen3TTSTokenizerV2Model.encode with the padding mask; [frames, 16]."""
    from transformers import AutoFeatureExtractor

    extractor = AutoFeatureExtractor.from_pretrained(str(refs.root / "speech_tokenizer"))
    inputs = extractor(raw_audio=[audio], sampling_rate=24000, return_tensors="pt")
    with torch.inference_mode():
        return refs.tokenizer.encode(inputs["input_values"].squeeze(1).float(),
                                     inputs["padding_mask"].squeeze(1)).audio_codes[0]


def test_speaker_log_mel_matches_qwen_tts_extract_speaker_embedding_features(refs, speechlike, monkeypatch):
    ref_mel, _ = reference_embedding(refs, speechlike)
    ours = speaker_log_mel(speechlike)
    diff = float((ours - ref_mel).abs().max())
    print(f"speaker log-mel vs qwen-tts mel_spectrogram: {tuple(ours.shape)}, max-abs-diff {diff:.2e}")
    assert ours.shape == ref_mel.shape == (len(speechlike) // 256, 128) and diff <= 1e-4
    # Negative control: an 8 kHz mel ceiling instead of 12 kHz is told apart.
    monkeypatch.setattr(spk, "FMAX", 8000.0)
    assert float((speaker_log_mel(speechlike) - ref_mel).abs().max()) > 0.1


def test_speaker_embedding_matches_qwen_tts_and_a_swapped_weight_does_not(refs, speechlike):
    model = load_speaker_encoder(refs.root)
    ours = model.embed(speechlike)
    _, ref = reference_embedding(refs, speechlike)
    diff = float((ours - ref).abs().max())
    print(f"speaker embedding vs qwen-tts: dim {ours.numel()}, |ref| max {float(ref.abs().max()):.3f}, "
          f"max-abs-diff {diff:.2e}")
    assert ours.shape == (SPEAKER_CONFIG["enc_dim"],) and diff <= 1e-4
    # Negative control: two same-shaped Res2Net convolutions swapped (a key mix-up) shows.
    swapped = copy.deepcopy(model)
    blocks = swapped.blocks[2].res2net_block.blocks
    with torch.no_grad():
        w0 = blocks[0].conv.weight.clone()
        blocks[0].conv.weight.copy_(blocks[1].conv.weight)
        blocks[1].conv.weight.copy_(w0)
    assert float((swapped.embed(speechlike) - ref).abs().max()) > 100 * 1e-4


def test_speaker_embedding_matches_vllm_omni(refs, speechlike):
    def slaney_basis(sr, n_fft, n_mels, fmin=0.0, fmax=None):
        from transformers.audio_utils import mel_filter_bank

        return torch.from_numpy(mel_filter_bank(n_fft // 2 + 1, n_mels, fmin, sr / 2 if fmax is None else fmax,
                                                sr, norm="slaney", mel_scale="slaney").T.astype(np.float32))

    stand_ins = {"vllm_omni.utils.audio": {"mel_filter_bank": slaney_basis}}
    package = "vllm_omni.model_executor.models.qwen3_tts."
    try:
        with vllm_omni_module(package + "qwen3_tts_talker", stand_ins) as talker:
            import vllm_omni.model_executor.models.qwen3_tts.prompt_embeds_builder as builder
            omni = talker.Qwen3TTSSpeakerEncoder(SimpleNamespace(mel_dim=128, **SPEAKER_CONFIG))
            extract = builder.Qwen3TTSPromptEmbedsBuilder.extract_speaker_embedding
    except ImportError as exc:
        pytest.skip(f"vLLM-Omni's Qwen3-TTS talker does not import here: {exc}")
    omni.load_state_dict(refs.speaker_state)
    owner = SimpleNamespace(_device=lambda: torch.device("cpu"), _embedding_dtype=torch.float32,
                            _speaker_encoder=omni.eval(), _mel_spectrogram_on_cpu=False,
                            _config=SimpleNamespace(speaker_encoder_config=SimpleNamespace(sample_rate=24000)))
    with torch.inference_mode():
        ref = extract(owner, speechlike, 24000)
    diff = float((load_speaker_encoder(refs.root).embed(speechlike) - ref).abs().max())
    print(f"speaker embedding vs vLLM-Omni: max-abs-diff {diff:.2e}")
    assert diff <= 1e-4


def test_reference_codes_equal_qwen_tts_encode_with_ceil_frames_of_1920_samples(refs, speechlike):
    model = load_speech_encoder(refs.root)
    for n in (len(speechlike), 57601, SAMPLES_PER_FRAME):
        audio = speechlike[:n]
        ours, ref = model.encode(audio), reference_codes(refs, audio)
        mismatches = int((ours != ref).sum()) if ours.shape == ref.shape else -1
        print(f"codes of {n} samples: ours {tuple(ours.shape)} {ours.dtype}, qwen-tts {tuple(ref.shape)}, "
              f"mismatches {mismatches}, distinct per codebook "
              f"{[len(set(c.tolist())) for c in ours.T][:4]}...")
        assert ours.shape == (math.ceil(n / SAMPLES_PER_FRAME), 16) and ours.dtype == torch.int64
        assert mismatches == 0
    assert model.encode(speechlike).shape == (38, 16)  # 3 s -> 37.5 frames -> 38
    assert all(len(set(c.tolist())) >= 4 for c in model.encode(speechlike).T)  # not degenerate


def test_reference_codes_change_when_one_encoder_weight_is_perturbed(refs, speechlike, tmp_path):
    key = "encoder.encoder_transformer.layers.0.self_attn.o_proj.weight"
    state = dict(refs.tokenizer_state)
    state[key] = state[key] + 0.3 * torch.randn(state[key].shape, generator=torch.Generator().manual_seed(3))
    root = write_checkpoint(tmp_path, refs.speaker_state, state)
    changed = int((load_speech_encoder(root).encode(speechlike) != reference_codes(refs, speechlike)).sum())
    print(f"codes with {key} perturbed: {changed} of {38 * 16} differ")
    assert changed > 0


def test_speech_encoder_forgets_cached_centroids_on_dtype_change(refs, speechlike):
    """Mimi caches codebook centroids on first use; .to() must not leave them stale."""
    model = load_speech_encoder(refs.root)
    model.encode(speechlike)
    model.to(torch.float64)
    assert model.encode(speechlike).shape == (38, 16)
    assert all(m._embed is None or m._embed.dtype == torch.float64
               for m in model.modules() if hasattr(m, "embed_sum"))


def test_too_short_or_multichannel_reference_audio_is_a_client_error(refs):
    speaker, speech = load_speaker_encoder(refs.root), load_speech_encoder(refs.root)
    with pytest.raises(InvalidRequest, match="300 samples; at least 385"):
        speaker.embed(np.zeros(300, np.float32))
    with pytest.raises(InvalidRequest, match="too short"):
        speaker.embed(np.zeros(1000, np.float32))     # 3 frames: the dilation-4 conv mirrors 4
    with pytest.raises(InvalidRequest, match="mono"):
        speaker.embed(np.zeros((2, 24000), np.float32))
    with pytest.raises(InvalidRequest, match="mono"):
        speech.encode(np.zeros(0, np.float32))
    assert speech.encode(np.zeros(1, np.float32)).shape == (1, 16)


def test_loaders_name_the_missing_file_key_or_field(refs, tmp_path):
    def fresh(name):
        root = tmp_path / name
        shutil.copytree(refs.root, root)
        return root

    root = fresh("no-preprocessor")
    (root / "speech_tokenizer" / "preprocessor_config.json").unlink()
    with pytest.raises(CheckpointError, match="speech_tokenizer/preprocessor_config.json"):
        load_speech_encoder(root)

    root = fresh("no-weights")
    (root / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors: missing"):
        load_speaker_encoder(root)

    root = fresh("no-fc-bias")
    state = load_file(str(root / "model.safetensors"))
    del state["speaker_encoder.fc.bias"]
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing keys: speaker_encoder\.fc\.bias$"):
        load_speaker_encoder(root)

    root = fresh("no-downsample")
    path = root / "speech_tokenizer" / "model.safetensors"
    state = load_file(str(path))
    del state["encoder.downsample.conv.weight"]
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=r"missing keys: encoder\.downsample\.conv\.weight$"):
        load_speech_encoder(root)

    root = fresh("wrong-dim")
    (root / "config.json").write_text(json.dumps(
        {"tts_model_type": "base", "speaker_encoder_config": {**SPEAKER_CONFIG, "enc_dim": 24}}))
    with pytest.raises(CheckpointError, match=r"shape mismatches: speaker_encoder\.fc\.bias \(12,\) vs \(24,\)"):
        load_speaker_encoder(root)

    (root / "config.json").write_text(json.dumps({"tts_model_type": "custom_voice"}))
    with pytest.raises(CheckpointError, match="custom_voice.*Base"):
        load_speaker_encoder(root)

    (root / "speech_tokenizer" / "config.json").write_text(json.dumps(
        {**TOKENIZER_CONFIG, "encoder_config": ENCODER_CONFIG, "encoder_valid_num_quantizers": 24}))
    with pytest.raises(CheckpointError, match="encoder_valid_num_quantizers 24"):
        load_speech_encoder(root)


def test_released_sizes_give_the_released_key_names_and_shapes():
    """What the checkpoint generator must write: 76 speaker_encoder.* and 225 encoder.* tensors,
    named and shaped as in Qwen3-TTS-12Hz-*-Base model.safetensors and speech_tokenizer/."""
    with torch.device("meta"):
        speaker = {f"speaker_encoder.{k}": tuple(v.shape) for k, v in
                   SpeakerEncoder(SpeakerEncoderConfig(enc_dim=2048)).state_dict().items()}
        speech = {k: tuple(v.shape) for k, v in
                  SpeechEncoder(SpeechEncoderConfig(RELEASED_ENCODER_CONFIG)).state_dict().items()}
    assert len(speaker) == 76 and len(speech) == 225
    assert {k: speaker[k] for k in (
        "speaker_encoder.blocks.0.conv.weight", "speaker_encoder.blocks.3.res2net_block.blocks.6.conv.weight",
        "speaker_encoder.blocks.1.se_block.conv1.weight", "speaker_encoder.mfa.conv.weight",
        "speaker_encoder.asp.tdnn.conv.weight", "speaker_encoder.asp.conv.weight", "speaker_encoder.fc.weight",
    )} == {"speaker_encoder.blocks.0.conv.weight": (512, 128, 5),
           "speaker_encoder.blocks.3.res2net_block.blocks.6.conv.weight": (64, 64, 3),
           "speaker_encoder.blocks.1.se_block.conv1.weight": (128, 512, 1),
           "speaker_encoder.mfa.conv.weight": (1536, 1536, 1),
           "speaker_encoder.asp.tdnn.conv.weight": (128, 4608, 1),
           "speaker_encoder.asp.conv.weight": (1536, 128, 1),
           "speaker_encoder.fc.weight": (2048, 3072, 1)}
    assert {k: speech[k] for k in (
        "encoder.encoder.layers.0.conv.weight", "encoder.encoder.layers.12.conv.weight",
        "encoder.encoder.layers.14.conv.weight", "encoder.downsample.conv.weight",
        "encoder.encoder_transformer.layers.7.mlp.fc1.weight",
        "encoder.quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum",
        "encoder.quantizer.semantic_residual_vector_quantizer.input_proj.weight",
    )} == {"encoder.encoder.layers.0.conv.weight": (64, 1, 7),
           "encoder.encoder.layers.12.conv.weight": (1024, 512, 16),
           "encoder.encoder.layers.14.conv.weight": (512, 1024, 3),
           "encoder.downsample.conv.weight": (512, 512, 4),
           "encoder.encoder_transformer.layers.7.mlp.fc1.weight": (2048, 512),
           "encoder.quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum": (2048, 256),
           "encoder.quantizer.semantic_residual_vector_quantizer.input_proj.weight": (256, 512, 1)}
    assert {k.rsplit(".", 1)[1] for k in speech if ".codebook." in k} == {"initialized", "cluster_usage", "embed_sum"}
