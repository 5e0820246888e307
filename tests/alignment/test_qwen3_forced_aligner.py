"""Qwen3-ForcedAligner, our PyTorch re-implementation (tritontts/alignment/qwen3_forced_aligner.py)
against the reference on the same random checkpoint in the released layout: transformers'
Qwen3ASRForTokenClassification (transformers 5's port of qwen-asr's thinker with the
5000-class timestamp head; its parameter names differ from the release's by four prefix
rules, `REFERENCE_NAMES`), its WhisperFeatureExtractor for the features and its
`_fix_timestamps` for the repair of backward times. qwen-asr 0.0.6 itself pins transformers
4.57 and does not import under this environment's transformers 5; its input text is built
here as its `Qwen3ForcedAligner.align` builds it (the prompt below).

fp32 throughout; the stated tolerance is 1e-4 x max(1, |logits|), and a perturbed weight
must break it (the negative control)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tritontts.alignment.checkpoints import QWEN3_FORCED_ALIGNER, aligner_kind, aligner_languages
from tritontts.alignment.qwen3_forced_aligner import (AlignerConfig, Qwen3ForcedAligner, audio_token_count,
                                                      repair_times)
from tritontts.alignment.random_checkpoint import write_random_checkpoint
from tritontts.nn.mel import whisper_log_mel
from tritontts.protocol import InvalidRequest, words_request
from tritontts.weights.checkpoint import CheckpointError

TOLERANCE = 1e-4
WORDS = ["Hello", "there", "how", "are", "you", "today"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("qwen3-forced-aligner"), seed=3)


@pytest.fixture(scope="module")
def ours(checkpoint):
    return Qwen3ForcedAligner(checkpoint)


def REFERENCE_NAMES(name: str) -> str:
    """A released parameter name as transformers' Qwen3ASRForTokenClassification names it."""
    name = name.removeprefix("thinker.")
    for released, port in (("audio_tower.proj1.", "model.multi_modal_projector.linear_1."),
                           ("audio_tower.proj2.", "model.multi_modal_projector.linear_2."),
                           ("audio_tower.", "model.audio_tower."), ("model.", "model.language_model."),
                           ("lm_head.", "score.")):
        if name.startswith(released):
            return port + name[len(released):]
    raise KeyError(name)


@pytest.fixture(scope="module")
def reference(checkpoint):
    from safetensors.torch import load_file
    from transformers import Qwen3ASRConfig, Qwen3ASRForTokenClassification

    config = json.loads((checkpoint / "config.json").read_text())
    thinker = config["thinker_config"]
    audio, text = thinker["audio_config"], thinker["text_config"]
    encoder_fields = ("num_mel_bins", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "d_model",
                      "n_window", "output_dim", "n_window_infer", "downsample_hidden_size", "activation_function")
    text_fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings")
    model = Qwen3ASRForTokenClassification(Qwen3ASRConfig(
        audio_config={k: audio[k] for k in encoder_fields},
        text_config={"model_type": "qwen3", **{k: text[k] for k in text_fields}},
        audio_token_id=thinker["audio_token_id"], timestamp_token_id=config["timestamp_token_id"],
        num_labels=thinker["classify_num"], token_classification_bias=False)).eval()
    state = {REFERENCE_NAMES(k): v for k, v in load_file(str(checkpoint / "model.safetensors")).items()}
    model.load_state_dict(state, strict=True)
    return model


def speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """Noise bursts and pauses (random weights make no sense of speech anyway)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 16000)
    envelope = (np.sin(np.arange(n) / 16000 * 2 * np.pi * 1.7) > -0.2).astype(np.float32)
    return (0.2 * rng.standard_normal(n) * envelope).astype(np.float32)


def reference_logits(reference, ours, audio: np.ndarray, words: list[str]):
    from transformers import WhisperFeatureExtractor

    features = WhisperFeatureExtractor(feature_size=128)(audio, sampling_rate=16000, padding="longest",
                                                          return_attention_mask=True, return_tensors="pt")
    mel = features["input_features"][0]
    frames = int(features["attention_mask"].sum())
    mel = mel[:, :frames]
    padded = int(np.ceil(frames / 100) * 100)
    ids = torch.tensor([ours.input_ids(words, audio_token_count(frames, 50))])
    with torch.inference_mode():
        logits = reference(input_ids=ids, input_features=torch.nn.functional.pad(mel, (0, padded - frames))[None],
                           input_features_mask=(torch.arange(padded) < frames).long()[None],
                           attention_mask=torch.ones_like(ids)).logits[0]
    return ids[0], mel, logits


def test_our_log_mel_equals_transformers_whisper_feature_extractor_on_unpadded_audio():
    from transformers import WhisperFeatureExtractor

    for seconds in (0.37, 4.0, 12.55):
        audio = speechlike(seconds, seed=1)
        theirs = WhisperFeatureExtractor(feature_size=128)(audio, sampling_rate=16000, padding="longest",
                                                             return_tensors="np")["input_features"][0]
        mine = whisper_log_mel(audio, 128)
        assert mine.shape == theirs.shape == (128, audio.size // 160)
        assert np.abs(mine - theirs).max() < 1e-4, seconds


@pytest.mark.parametrize("seconds", [0.55, 12.5], ids=["one-partial-chunk", "two-attention-windows"])
def test_logits_equal_transformers_qwen3_asr_token_classification_fp32_and_a_perturbed_weight_does_not(
        ours, reference, seconds):
    audio = speechlike(seconds)
    ids, mel, theirs = reference_logits(reference, ours, audio, WORDS)
    with torch.inference_mode():
        mine = ours.network(ids, torch.from_numpy(whisper_log_mel(audio, 128)))
    assert mine.shape == theirs.shape == (ids.numel(), 5000)
    bound = TOLERANCE * max(1.0, theirs.abs().max().item())
    diff = (mine - theirs).abs().max().item()
    assert diff < bound, (diff, bound)
    # Where the top two classes are apart by more than the tolerance, the argmax agrees.
    top2 = theirs.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * bound
    assert clear.sum() > ids.numel() // 2
    assert torch.equal(mine.argmax(-1)[clear], theirs.argmax(-1)[clear])
    # Negative control: the last encoder layer's fc2 nudged by noise of 1e-2 (a uniform shift
    # would vanish in ln_post).
    layer = ours.network.audio_tower.layers[-1].fc2
    saved = layer.weight.detach().clone()
    try:
        with torch.no_grad():
            layer.weight.add_(1e-2 * torch.randn(layer.weight.shape, generator=torch.Generator().manual_seed(0)))
            nudged = ours.network(ids, torch.from_numpy(whisper_log_mel(audio, 128)))
    finally:
        with torch.no_grad():
            layer.weight.copy_(saved)
    assert (nudged - theirs).abs().max().item() > 10 * bound


def test_word_times_are_the_reference_pipelines_argmax_times_repaired_and_clamped(ours, reference):
    from transformers.models.qwen3_asr.processing_qwen3_asr import _fix_timestamps

    audio = speechlike(6.2, seed=4)
    ids, _, logits = reference_logits(reference, ours, audio, WORDS)
    raw = (logits[ids == ours.config.timestamp_token_id].argmax(-1).float() * 80).numpy()
    assert raw.size == 2 * len(WORDS)
    np.testing.assert_array_equal(ours.predicted_ms(audio, WORDS), raw)
    fixed = _fix_timestamps(raw)
    spans = ours.align_window(audio, WORDS)
    expected = [(min(fixed[2 * i] / 1000, 6.2), min(fixed[2 * i + 1] / 1000, 6.2)) for i in range(len(WORDS))]
    assert spans == [(a, max(a, b)) for a, b in expected]


def test_repair_times_equals_transformers_fix_timestamps_on_a_thousand_sequences():
    from transformers.models.qwen3_asr.processing_qwen3_asr import _fix_timestamps

    rng = np.random.default_rng(0)
    for _ in range(1000):
        n = int(rng.integers(1, 30))
        # Few distinct values: ties, runs of one, two and more out-of-order times.
        times = (rng.integers(0, 12, n) * 80).astype(np.float64)
        if rng.random() < 0.5:
            times = np.sort(times)
            times[rng.integers(0, n, max(1, n // 4))] = rng.integers(0, 12) * 80
        assert repair_times(times.tolist()) == _fix_timestamps(times), times.tolist()
    assert repair_times([]) == []
    assert repair_times([0, 80, 40, 160]) == [0, 80, 80, 160]     # a lone backward time


def test_the_checkpoint_is_recognised_and_its_languages_are_codes(checkpoint):
    assert aligner_kind(checkpoint) == QWEN3_FORCED_ALIGNER
    languages = aligner_languages(checkpoint)
    assert languages == ("zh", "en", "yue", "fr", "de", "it", "ja", "ko", "pt", "ru", "es")
    for language in ("French", "fr", "English", "zh-cn", "auto", None):
        assert words_request("Bonjour", {"word_timestamps": True, "language": language}, languages)
    with pytest.raises(InvalidRequest, match="word_timestamps: the word aligner places words in zh, en"):
        words_request("Hej", {"word_timestamps": True, "language": "Swedish"}, languages)


def test_a_config_missing_a_field_is_refused_naming_the_file_and_the_field(checkpoint, tmp_path):
    config = json.loads((checkpoint / "config.json").read_text())
    del config["thinker_config"]["classify_num"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert aligner_kind(tmp_path) is None
    with pytest.raises(CheckpointError, match=r"config.json: thinker_config.classify_num is missing"):
        AlignerConfig.read(tmp_path)
    config = json.loads((checkpoint / "config.json").read_text())
    del config["thinker_config"]["text_config"]["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"thinker_config.text_config.hidden_size is missing"):
        AlignerConfig.read(tmp_path)


def test_weights_that_do_not_match_the_config_are_refused_naming_the_keys(checkpoint, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    for name in ("config.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(checkpoint / name, tmp_path / name)
    state = load_file(str(checkpoint / "model.safetensors"))
    del state["thinker.lm_head.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing keys: lm_head.weight"):
        Qwen3ForcedAligner(tmp_path)


def test_a_window_of_a_few_milliseconds_places_its_words_inside_it(ours):
    """A stream's last audio can be one mel hop (10 ms): shorter than the STFT's reflection
    needs, so it is padded with silence; its words are placed inside it."""
    for samples in (160, 199, 401):
        spans = ours.align_window(speechlike(samples / 16000, seed=5), ["a", "b"])
        assert len(spans) == 2 and all(0 <= a <= b <= samples / 16000 for a, b in spans), (samples, spans)
