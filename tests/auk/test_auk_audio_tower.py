"""AuK's condition-encoder audio side (tritontts.families.auk.audio_tower) against transformers 5.19's
Qwen2.5-Omni: the processor's WhisperFeatureExtractor with the released preprocessor
settings (built here, nothing downloaded) and Qwen2_5OmniAudioEncoder driven as the thinker's
get_audio_features drives it (frames masked in by feature_attention_mask, feature_lens).
Tiny tower (d_model 64, 2 layers) with the released window geometry (n_window 100), random
weights shared with the reference, fp32, CPU.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritontts.families.auk.audio_tower import (
    MAX_SAMPLES, AudioTower, audio_features, audio_token_count, feature_frame_count,
    load_audio_tower)
from tritontts.weights.checkpoint import CheckpointError
from tritontts.nn.mel import slaney_mel_filters, whisper_log_mel

RATE = 16000
TINY = dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128,
            num_mel_bins=128, n_window=100, output_dim=64, max_source_positions=1500)
# Qwen2.5-Omni-3B preprocessor_config.json, its audio fields
PREPROCESSOR = dict(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300,
                    n_fft=400, padding_value=0.0, dither=0.0, return_attention_mask=True)
# 1.3 s: 131 frames, inside one 200-frame window; 5.7 s: 571 frames = 200 + 200 + a partial
# 171 (both off the 160-sample hop, so that the mask's last frame is a partial one); 4 s:
# exactly two full windows, no partial one.
CLIPS = {"1.3s": int(1.3 * RATE) + 77, "5.7s": int(5.7 * RATE) + 33, "4.0s": 4 * RATE}


def clip(samples: int, seed: int = 0) -> np.ndarray:
    """A gliding, amplitude-modulated tone in noise, so that frames and windows differ."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / RATE
    tone = np.sin(2 * np.pi * (180 + 120 * np.sin(2 * np.pi * 0.6 * t)) * t)
    return (0.3 * tone * (1 + np.sin(2 * np.pi * 2.5 * t))
            + 0.03 * rng.standard_normal(samples)).astype(np.float32)


def processor_features(audio: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_features [1, 128, 30000], feature_attention_mask [1, 30000]) as
    Qwen2_5OmniProcessor makes them: padding forced to max_length, truncation left at True."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(**PREPROCESSOR)
    out = extractor(audio, sampling_rate=RATE, padding="max_length", return_attention_mask=True,
                    return_tensors="pt")
    return out["input_features"], out["attention_mask"]


@pytest.fixture(scope="module")
def reference():
    """transformers' encoder with seeded weights of a size that makes every part count."""
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniAudioEncoderConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder

    torch.manual_seed(0)
    config = Qwen2_5OmniAudioEncoderConfig(**TINY)
    config._attn_implementation = "eager"
    model = Qwen2_5OmniAudioEncoder(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or "ln_post" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                p.copy_(torch.randn_like(p) / fan_in ** 0.5)
    return model


@pytest.fixture(scope="module")
def tower(reference):
    # The released layout is thinker.audio_tower.<name>; the loader takes it prefix-stripped.
    return load_audio_tower(dict(reference.state_dict()), TINY)


@pytest.fixture(scope="module")
def processed():
    return {name: (clip(n), *processor_features(clip(n))) for name, n in CLIPS.items()}


def reference_tokens(reference, input_features, mask) -> torch.Tensor:
    """The thinker's get_audio_features: mask the frames in, then the tower with feature_lens."""
    lens = mask.sum(-1)
    frames = input_features.permute(0, 2, 1)[mask.bool()].permute(1, 0)
    after_cnn, _ = reference._get_feat_extract_output_lengths(lens)
    with torch.no_grad():
        return reference(frames, feature_lens=lens, aftercnn_lens=after_cnn).last_hidden_state


def test_state_dict_names_and_shapes_equal_transformers_encoder_without_the_sinusoid_buffer(reference, tower):
    ours = {k: tuple(v.shape) for k, v in tower.state_dict().items()}
    ref = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert ours == ref
    # The sinusoid table is a non-persistent buffer on both sides, so never in a checkpoint;
    # the unused audio_bos_eos_token embedding is.
    assert not any("positional_embedding" in k for k in ref)
    assert "audio_bos_eos_token.weight" in ours


def test_loader_rejects_an_extra_or_a_missing_tensor(reference):
    state = dict(reference.state_dict())
    with pytest.raises(CheckpointError, match="unexpected keys: positional_embedding"):
        load_audio_tower({**state, "positional_embedding.positional_embedding": torch.zeros(1500, 64)}, TINY)
    state.pop("audio_bos_eos_token.weight")
    with pytest.raises(CheckpointError, match="missing keys: audio_bos_eos_token.weight"):
        load_audio_tower(state, TINY)


@pytest.mark.parametrize("name", list(CLIPS))
def test_features_equal_the_processors_masked_in_frames(processed, name):
    audio, input_features, mask = processed[name]
    ref = input_features[0][:, mask[0].bool()]
    ours = audio_features(audio)
    assert ours.shape == ref.shape == (128, feature_frame_count(audio.size))
    diff = float((ours - ref).abs().max())
    print(f"{name} features {tuple(ours.shape)} vs WhisperFeatureExtractor: max-abs-diff {diff:.2e}")
    assert diff <= 1e-4


def tail_burst() -> np.ndarray:
    """Quiet, then a loud burst in the last 3 ms of a clip of exactly 130 hops: the loudest
    frame is the one just past the mask (centred on the clip's end), so the log floor the
    processor applies comes from a frame it then drops."""
    audio = 0.01 * clip(130 * 160, seed=1)
    audio[-50:] = 0.9 * np.sin(np.arange(50) * 0.9)
    return audio


def test_features_equal_the_processors_when_the_loudest_frame_is_past_the_mask():
    audio = tail_burst()
    input_features, mask = processor_features(audio)
    ref = input_features[0][:, mask[0].bool()]
    diff = float((audio_features(audio) - ref).abs().max())
    print(f"tail burst features vs WhisperFeatureExtractor: max-abs-diff {diff:.2e}")
    assert diff <= 1e-4


def test_negative_control_a_floor_from_the_kept_frames_only_differs_from_the_processors():
    audio = tail_burst()
    input_features, mask = processor_features(audio)
    ref = input_features[0][:, mask[0].bool()]
    padded = torch.from_numpy(np.concatenate([audio, np.zeros(400, np.float32)]))
    spec = torch.stft(padded, 400, 160, window=torch.hann_window(400), return_complex=True)
    log = (torch.from_numpy(slaney_mel_filters(RATE, 400, 128)) @ spec[..., :-1].abs() ** 2
           ).clamp(min=1e-10).log10()[:, :ref.shape[1]]
    kept_only = (torch.maximum(log, log.max() - 8.0) + 4.0) / 4.0
    diff = float((kept_only - ref).abs().max())
    print(f"negative control, log floor from the kept frames only: max-abs-diff {diff:.2e}")
    assert diff > 1e-2


def test_negative_control_features_of_the_unpadded_clip_differ_from_the_processors(processed):
    # Whisper's log-mel of the clip alone reflects the clip at its end where the processor
    # reads zeros (seen on a clip of whole hops, where the frame counts agree), and keeps
    # floor(n / 160) frames where the mask keeps ceil(n / 160).
    audio = clip(130 * 160)
    input_features, mask = processor_features(audio)
    ref = input_features[0][:, mask[0].bool()]
    alone = torch.from_numpy(whisper_log_mel(audio))
    diff = float((alone - ref).abs().max())
    print(f"negative control, unpadded clip's features: max-abs-diff {diff:.2e}")
    assert diff > 1e-2
    odd = processed["1.3s"][0]
    assert whisper_log_mel(odd).shape[1] == feature_frame_count(odd.size) - 1


@pytest.mark.parametrize("name", list(CLIPS))
def test_tower_output_matches_transformers_from_the_clip(reference, tower, processed, name):
    audio, input_features, mask = processed[name]
    ref = reference_tokens(reference, input_features, mask)
    with torch.no_grad():
        ours = tower(audio_features(audio))
    assert ours.shape == ref.shape
    diff = float((ours - ref).abs().max())
    print(f"{name} tower {tuple(ours.shape)} vs Qwen2_5OmniAudioEncoder: |ref| max "
          f"{float(ref.abs().max()):.2f}, max-abs-diff {diff:.2e}")
    assert diff <= 1e-4


def test_negative_control_attention_across_windows_changes_the_long_clips_tokens(reference, processed):
    # The same weights with one window over all 570 frames: attention now crosses the
    # 200-frame windows (and positions no longer restart), which the reference never does.
    audio, input_features, mask = processed["5.7s"]
    ref = reference_tokens(reference, input_features, mask)
    global_tower = load_audio_tower(dict(reference.state_dict()), {**TINY, "n_window": 300})
    with torch.no_grad():
        ours = global_tower(audio_features(audio))
    diff = float((ours - ref).abs().max())
    print(f"negative control, one window over the whole clip: max-abs-diff {diff:.2e}")
    assert diff > 1e-2


@pytest.mark.parametrize("name", list(CLIPS))
def test_token_count_equals_the_processors_expansion_and_the_encoders_output(reference, processed, name):
    audio, input_features, mask = processed[name]
    # Qwen2_5OmniProcessor: how many <|AUDIO|> the placeholder becomes
    after_conv = (mask.sum(-1) - 1) // 2 + 1
    expansion = int((after_conv - 2) // 2 + 1)
    rows = reference_tokens(reference, input_features, mask).shape[0]
    print(f"{name}: {audio.size} samples -> {audio_token_count(audio.size)} <|AUDIO|> tokens")
    assert audio_token_count(audio.size) == expansion == rows


def test_token_count_stops_at_the_processors_300_second_truncation():
    assert feature_frame_count(MAX_SAMPLES) == feature_frame_count(MAX_SAMPLES + 5 * RATE) == 30000
    assert audio_token_count(MAX_SAMPLES + 5 * RATE) == audio_token_count(MAX_SAMPLES) == 7500


def test_token_count_is_zero_up_to_two_frames_and_one_from_three():
    # 320 samples = 2 frames -> 1 after the stride-2 conv -> no pair to pool
    assert [audio_token_count(n) for n in (0, 1, 320, 321, 640, 641)] == [0, 0, 0, 1, 1, 1]


def test_tower_rejects_features_of_the_wrong_shape(tower):
    with pytest.raises(ValueError, match="expected features"):
        tower(torch.zeros(80, 100))


def test_a_clip_over_300_seconds_is_cut_to_the_processors_first_300_seconds():
    audio = clip(MAX_SAMPLES + 3 * RATE + 7, seed=2)
    input_features, mask = processor_features(audio)
    ref = input_features[0][:, mask[0].bool()]
    ours = audio_features(audio)
    assert ours.shape == ref.shape == (128, 30000)
    diff = float((ours - ref).abs().max())
    print(f"303 s clip: features {tuple(ours.shape)} vs WhisperFeatureExtractor: max-abs-diff {diff:.2e}")
    assert diff <= 1e-4


def test_config_whose_window_outgrows_the_position_table_or_with_another_activation_is_refused():
    with pytest.raises(CheckpointError, match="max_source_positions"):
        AudioTower({**TINY, "max_source_positions": 99})       # a full window has 100 tokens
    with pytest.raises(CheckpointError, match="activation_function"):
        AudioTower({**TINY, "activation_function": "relu"})
    AudioTower({**TINY, "max_source_positions": 100})
