"""GLM-TTS's speech tokenizer (tritontts.families.glm_tts.speech_tokenizer) on tiny random checkpoints,
CPU only, against three references:

- transformers' WhisperFeatureExtractor, as upstream calls it: the log-mel features and the
  frame mask;
- vLLM-Omni 0.30's load_voice_clone_frontend + extract_prompt_speech_token (its
  WhisperVQEncoder): tokens and the quantizer's input, on a checkpoint within what it
  implements (no causal convolution, no block-causal attention), where it agrees with
  upstream;
- upstream GLM-TTS's own WhisperVQEncoder (utils/whisper_models, read from a git mirror of
  zai-org/GLM-TTS, $GLM_TTS_UPSTREAM_GIT; skipped without one), driven as upstream's
  load_quantize_encoder and extract_speech_token do: the released flags, partial pooling
  windows and recordings over 30 s, where vLLM-Omni 0.30 departs from upstream.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.glm_tts.speech_tokenizer import (
    PREFIX, WhisperVQEncoder, WhisperVQSpeechTokenizer, checkpoint_shapes, parse_config,
    random_speech_tokenizer_config, write_random_speech_tokenizer)
from tritontts.upstream import vllm_omni_module

RATE = 16000
STRIDE = 640                     # samples per token: conv stride 2 x pooling 2 x hop 160
SEGMENT = 30 * RATE
TOLERANCE = 1e-4
# Within vLLM-Omni 0.30's WhisperVQEncoder, which has neither causal convolutions nor block-
# causal attention; pooling right before the quantizer, as released, so that its other
# departure (padding zeroed before pooling) touches only the last token.
VLLM_COMPATIBLE = {"encoder_causal_convolution": False, "quantize_causal_block_size": None,
                   "pooling_position": 3}
UPSTREAM_GIT = Path(os.environ.get("GLM_TTS_UPSTREAM_GIT", "") or "/nonexistent")


# Both cores for these CPU-heavy module tests (conftest.torch_two_threads).
pytestmark = pytest.mark.usefixtures("torch_two_threads")


def speechlike(samples: int, seed: int = 0) -> np.ndarray:
    """A gliding, amplitude-modulated tone in noise: frames differ, as speech's do."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / RATE
    tone = np.sin(2 * np.pi * (150 + 100 * np.sin(2 * np.pi * 0.7 * t)) * t)
    return (0.3 * tone * (1 + np.sin(2 * np.pi * 3 * t))
            + 0.05 * rng.standard_normal(samples)).astype(np.float32)


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max()) if a.size else 0.0


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return write_random_speech_tokenizer(tmp_path_factory.mktemp("glm-st") / "speech_tokenizer")


@pytest.fixture(scope="module")
def tiny(tiny_dir) -> WhisperVQSpeechTokenizer:
    return WhisperVQSpeechTokenizer(tiny_dir)


@pytest.fixture(scope="module")
def vllm_dir(tmp_path_factory) -> Path:
    """A model root (vLLM-Omni's loader looks for <root>/speech_tokenizer)."""
    root = tmp_path_factory.mktemp("glm-vllm")
    write_random_speech_tokenizer(root / "speech_tokenizer", seed=1, overrides=VLLM_COMPATIBLE)
    return root


@pytest.fixture(scope="module")
def vllm_tiny(vllm_dir) -> WhisperVQSpeechTokenizer:
    return WhisperVQSpeechTokenizer(vllm_dir / "speech_tokenizer")


# ------------------------------------------------------------------------- references

class VllmOmniReference:
    """vLLM-Omni 0.30's frontend on a model root: tokens, and the quantizer's input at the
    same positions (caught where its encoder hands the hidden states to _apply_vq)."""

    def __init__(self, root: Path):
        # Loaded before the torchaudio stand-ins, which transformers would probe.
        for name in ("transformers", "transformers.models.whisper.modeling_whisper",
                     "transformers.models.whisper.feature_extraction_whisper",
                     "transformers.models.auto.feature_extraction_auto"):
            importlib.import_module(name)
        # torchaudio only resamples (inputs here are 16 kHz) and vllm.logger only logs (the
        # real one, if vLLM is loaded already: a stand-in would stay its attribute).
        stand_ins = {"torchaudio": {}, "torchaudio.compliance": {}, "torchaudio.compliance.kaldi": {},
                     "torchaudio.transforms": {}}
        if "vllm" not in sys.modules:
            stand_ins.update({"vllm": {}, "vllm.logger": {"init_logger": logging.getLogger}})
        with vllm_omni_module("vllm_omni.model_executor.models.glm_tts.voice_clone", stand_ins) as vc:
            self.frontend, _ = vc.load_voice_clone_frontend(
                str(root), torch.device("cpu"), speech_tokenizer_cache=None, campplus_cache=object())
            self._extract = vc.extract_prompt_speech_token

    def encode(self, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        model = self.frontend[0]
        caught = []
        apply_vq = model._apply_vq

        def catch(hidden, valid):
            caught.append(hidden[valid].detach())
            return apply_vq(hidden, valid)

        model._apply_vq = catch
        try:
            tokens = self._extract(torch.from_numpy(audio), RATE, self.frontend)
        finally:
            del model._apply_vq
        return np.asarray(tokens, np.int64), torch.cat(caught).numpy()


@pytest.fixture(scope="module")
def vllm_reference(vllm_dir) -> VllmOmniReference:
    return VllmOmniReference(vllm_dir)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """GLM-TTS's modeling_whisper and configuration_whisper, imported from the mirror as a
    package of their own (they import each other relatively)."""
    if not UPSTREAM_GIT.is_dir():
        pytest.skip("no git clone of zai-org/GLM-TTS: set GLM_TTS_UPSTREAM_GIT to its .git directory")
    package = tmp_path_factory.mktemp("upstream") / "glm_tts_upstream_whisper"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("modeling_whisper.py", "configuration_whisper.py"):
        shown = subprocess.run(["git", "-C", str(UPSTREAM_GIT), "show", f"HEAD:utils/whisper_models/{name}"],
                               capture_output=True, text=True)
        if shown.returncode:
            pytest.skip(f"{UPSTREAM_GIT}: {shown.stderr.strip()}")
        (package / name).write_text(shown.stdout)
    sys.path.insert(0, str(package.parent))
    try:
        modeling = importlib.import_module(f"{package.name}.modeling_whisper")
        configuration = importlib.import_module(f"{package.name}.configuration_whisper")
    except ImportError as exc:
        pytest.skip(f"upstream's modeling_whisper does not import beside this transformers: {exc}")
    finally:
        sys.path.remove(str(package.parent))
    yield modeling, configuration
    for key in [k for k in sys.modules if k.split(".")[0] == package.name]:
        del sys.modules[key]


def _extended_attention_mask(self, mask, shape):
    """PreTrainedModel.get_extended_attention_mask of transformers 4.x (gone in 5.x), which
    upstream calls when there is no block-causal mask: a [B, 1, 1, S] additive padding mask."""
    return (1.0 - mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min


def upstream_encode(upstream, folder: Path, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and quantizer inputs as upstream makes them: load_quantize_encoder's model
    (quantize_encoder_only, tensors under model.encoder. less layer_norm and the layers from
    quantize_position on, strict), extract_speech_token's 30 s segments, batched with
    padding "longest" to a multiple of one token's samples, tokens of the masked-in frames."""
    from safetensors import safe_open
    from transformers import WhisperFeatureExtractor

    modeling, configuration = upstream
    config = configuration.WhisperVQConfig.from_pretrained(str(folder))
    config.quantize_encoder_only = True
    model = modeling.WhisperVQEncoder(config)
    model.get_extended_attention_mask = types.MethodType(_extended_attention_mask, model)
    state = {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            name = key[len(PREFIX):]
            if key.startswith(PREFIX) and not name.startswith("layer_norm") and not (
                    name.startswith("layers.") and int(name.split(".")[1]) >= config.quantize_position):
                state[name] = f.get_tensor(key)
    model.load_state_dict(state)
    model.eval()
    extractor = WhisperFeatureExtractor.from_pretrained(str(folder))
    kernel = config.pooling_kernel_size or 1
    stride = model.conv1.stride[0] * model.conv2.stride[0] * kernel * extractor.hop_length
    segments = [audio[i:i + SEGMENT] for i in range(0, audio.size, SEGMENT)]
    caught = []
    vector_quantize = modeling.vector_quantize

    def catch(hidden, codebook):
        caught.append(hidden)
        return vector_quantize(hidden, codebook)

    modeling.vector_quantize = catch
    tokens, hidden = [], []
    try:
        with torch.no_grad():
            for start in range(0, len(segments), 128):
                features = extractor(segments[start:start + 128], sampling_rate=RATE,
                                     return_attention_mask=True, return_tensors="pt",
                                     padding="longest", pad_to_multiple_of=stride)
                ids = model(**features).quantized_token_ids
                mask = features.attention_mask[:, ::2][:, ::kernel].bool()
                for row in range(ids.shape[0]):
                    tokens.append(ids[row][mask[row]])
                    hidden.append(caught[-1][row][mask[row]])
    finally:
        modeling.vector_quantize = vector_quantize
    return torch.cat(tokens).numpy(), torch.cat(hidden).numpy()


# ------------------------------------------------------------------------------ features

@pytest.mark.parametrize("samples", [3 * RATE + 100, 31 * RATE + 100], ids=["3s", "31s"])
def test_features_and_frame_mask_match_whisper_feature_extractor(tiny, tiny_dir, samples):
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(str(tiny_dir))
    audio = speechlike(samples)
    segments = [audio[i:i + SEGMENT] for i in range(0, samples, SEGMENT)]
    ref = extractor(segments, sampling_rate=RATE, return_attention_mask=True, return_tensors="np",
                    padding="longest", pad_to_multiple_of=STRIDE)
    # transformers' numpy path too (the torch one above is what it takes when torch loads).
    padded = np.zeros((len(segments), ref["input_features"].shape[2] * 160), np.float32)
    for row, segment in enumerate(segments):
        padded[row, :segment.size] = segment
    ref_np = extractor._np_extract_fbank_features(padded, "cpu")
    ours = tiny.segment_features(audio)
    assert len(ours) == len(segments)
    for row, (features, valid) in enumerate(ours):
        diff = max_diff(features, ref["input_features"][row])
        diff_np = max_diff(features, ref_np[row].astype(np.float32))
        print(f"segment {row}: log-mel max-abs-diff {diff:.2e} (torch path), {diff_np:.2e} (numpy path)")
        assert diff <= TOLERANCE and diff_np <= TOLERANCE
        np.testing.assert_array_equal(valid, ref["attention_mask"][row].astype(bool))


def test_tokens_are_int32_25_per_second_and_empty_audio_has_none(tiny):
    assert tiny.config.token_rate == 25.0
    audio = speechlike(31 * RATE + 100)
    tokens = tiny.tokens(audio)
    assert tokens.dtype == np.int32
    assert tokens.size == -(-SEGMENT // STRIDE) + -(-(audio.size - SEGMENT) // STRIDE)
    assert 0 <= tokens.min() and tokens.max() < tiny.config.vocab_size
    assert np.unique(tokens).size > 50   # the random codebook is spread over the inputs
    assert tiny.tokens(np.zeros(0, np.float32)).shape == (0,)
    with pytest.raises(ValueError, match="mono"):
        tiny.tokens(np.zeros((2, 100), np.float32))


# -------------------------------------------------------------------------- vLLM-Omni

@pytest.mark.parametrize("samples", [3 * RATE, 3 * RATE + 400], ids=["3s", "not-a-multiple-of-the-stride"])
def test_tokens_and_hidden_match_vllm_omni(vllm_tiny, vllm_reference, samples):
    audio = speechlike(samples)
    ref_tokens, ref_hidden = vllm_reference.encode(audio)
    ours = vllm_tiny.encode(audio)
    diff = max_diff(ours.hidden, ref_hidden)
    print(f"{samples} samples vs vLLM-Omni: hidden max-abs-diff {diff:.2e}, {ours.tokens.size} tokens")
    assert diff <= TOLERANCE
    np.testing.assert_array_equal(ours.tokens, ref_tokens)


def test_over_30s_matches_vllm_omni_but_for_upstreams_shared_padding(vllm_tiny, vllm_reference):
    """vLLM-Omni pads each 30 s segment by itself; upstream (and we) pad a recording's
    segments together, to the longest. Each segment tokenized alone is vLLM-Omni's exactly;
    in the whole recording the first segment's tokens are too. (The 1.03 s tail fills its
    last pooling window, which the next test is about.)"""
    audio = speechlike(31 * RATE + 480)
    ref_tokens, ref_hidden = vllm_reference.encode(audio)
    pieces = [vllm_tiny.encode(audio[:SEGMENT]), vllm_tiny.encode(audio[SEGMENT:])]
    tokens = np.concatenate([p.tokens for p in pieces])
    diff = max_diff(np.concatenate([p.hidden for p in pieces]), ref_hidden)
    print(f"31 s vs vLLM-Omni, segments tokenized alone: hidden max-abs-diff {diff:.2e}")
    assert diff <= TOLERANCE
    np.testing.assert_array_equal(tokens, ref_tokens)
    whole = vllm_tiny.encode(audio)
    first = SEGMENT // STRIDE
    assert whole.tokens.size == ref_tokens.size
    assert max_diff(whole.hidden[:first], ref_hidden[:first]) <= TOLERANCE
    np.testing.assert_array_equal(whole.tokens[:first], ref_tokens[:first])


def test_partial_last_pooling_window_differs_from_vllm_omni_in_the_last_token_only(
        vllm_tiny, vllm_reference):
    """3 s + 100 samples: 151 conv frames, so the last pooling window holds one padding
    frame. Upstream pools it in as encoded; vLLM-Omni 0.30 zeroes it first."""
    audio = speechlike(3 * RATE + 100)
    ref_tokens, ref_hidden = vllm_reference.encode(audio)
    ours = vllm_tiny.encode(audio)
    assert max_diff(ours.hidden[:-1], ref_hidden[:-1]) <= TOLERANCE
    np.testing.assert_array_equal(ours.tokens[:-1], ref_tokens[:-1])
    assert max_diff(ours.hidden[-1:], ref_hidden[-1:]) > 100 * TOLERANCE


def test_perturbed_weight_breaks_the_vllm_omni_comparison(vllm_dir, vllm_reference):
    """Negative control: the comparison above does see a wrong weight."""
    audio = speechlike(3 * RATE)
    ref_tokens, ref_hidden = vllm_reference.encode(audio)
    perturbed = WhisperVQSpeechTokenizer(vllm_dir / "speech_tokenizer")
    with torch.no_grad():
        perturbed.encoder.layers[0].fc2.weight[0, 0] += 0.5
    ours = perturbed.encode(audio)
    diff = max_diff(ours.hidden, ref_hidden)
    print(f"perturbed weight vs vLLM-Omni: hidden max-abs-diff {diff:.2e}, "
          f"{int((ours.tokens != ref_tokens).sum())} of {ref_tokens.size} tokens differ")
    assert diff > 100 * TOLERANCE and (ours.tokens != ref_tokens).any()


# --------------------------------------------------------------------------- upstream

UPSTREAM_CASES = {
    # the released flags: causal convolutions, 200-frame block-causal attention, avg pooling
    # (here between the last two layers, so the pooled block size is used too)
    "released-flags": {},
    "causal-attention": {"quantize_causal_encoder": True},
    "max-pooling-full-attention": {"pooling_type": "max", "quantize_causal_block_size": None,
                                   "encoder_causal_convolution": False, "pooling_position": 3},
}


@pytest.mark.parametrize("case", list(UPSTREAM_CASES))
def test_tokens_and_hidden_match_upstream_glm_tts(upstream, tmp_path, case):
    folder = write_random_speech_tokenizer(tmp_path / "speech_tokenizer", seed=2,
                                           overrides=UPSTREAM_CASES[case])
    ours = WhisperVQSpeechTokenizer(folder)
    lengths = [3 * RATE, 3 * RATE + 100]
    if case == "released-flags":
        lengths.append(31 * RATE + 100)        # segments, the last one padded to 30 s
    for samples in lengths:
        audio = speechlike(samples, seed=samples)
        ref_tokens, ref_hidden = upstream_encode(upstream, folder, audio)
        got = ours.encode(audio)
        diff = max_diff(got.hidden, ref_hidden)
        print(f"{case}, {samples} samples vs upstream: hidden max-abs-diff {diff:.2e}, "
              f"{got.tokens.size} tokens")
        assert diff <= TOLERANCE
        np.testing.assert_array_equal(got.tokens, ref_tokens)


def test_vllm_omni_misses_the_released_causal_convolution(tiny, tiny_dir, tmp_path):
    """The tiny checkpoint has the released flags: vLLM-Omni 0.30 ignores them and gives
    other tokens (upstream's are ours: test above)."""
    (tmp_path / "speech_tokenizer").symlink_to(tiny_dir)
    audio = speechlike(3 * RATE)
    ref_tokens, ref_hidden = VllmOmniReference(tmp_path).encode(audio)
    ours = tiny.encode(audio)
    assert max_diff(ours.hidden, ref_hidden) > 100 * TOLERANCE
    assert (ours.tokens != ref_tokens).mean() > 0.2


# ----------------------------------------------------------------------- checkpoint errors

@pytest.fixture
def scratch(tmp_path) -> Path:
    return write_random_speech_tokenizer(tmp_path / "speech_tokenizer", seed=3)


@pytest.mark.parametrize("name", ["config.json", "preprocessor_config.json", "model.safetensors"])
def test_missing_file_raises_checkpoint_error_naming_it(scratch, name):
    (scratch / name).unlink()
    with pytest.raises(CheckpointError, match=f"{name}: missing"):
        WhisperVQSpeechTokenizer(scratch)


def _rewrite_weights(folder: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_missing_tensor_raises_checkpoint_error_naming_file_and_key(scratch):
    _rewrite_weights(scratch, lambda t: t.pop(PREFIX + "layers.1.fc1.bias"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*missing keys: layers\.1\.fc1\.bias"):
        WhisperVQSpeechTokenizer(scratch)


def test_misshaped_tensor_raises_checkpoint_error_naming_key_and_shapes(scratch):
    def shrink(tensors):
        tensors[PREFIX + "codebook.weight"] = tensors[PREFIX + "codebook.weight"][:-1].clone()

    _rewrite_weights(scratch, shrink)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*codebook\.weight \(511, 64\) vs \(512, 64\)"):
        WhisperVQSpeechTokenizer(scratch)


def test_tensors_after_the_quantizer_are_not_needed(scratch):
    def drop(tensors):
        for key in list(tensors):
            if key[len(PREFIX):].startswith(("layers.3.", "layer_norm.", "embed_positions2.", "ema_")):
                del tensors[key]

    before = WhisperVQSpeechTokenizer(scratch).tokens(speechlike(RATE))
    _rewrite_weights(scratch, drop)
    np.testing.assert_array_equal(WhisperVQSpeechTokenizer(scratch).tokens(speechlike(RATE)), before)


@pytest.mark.parametrize("field,value,message", [
    ("d_model", None, "d_model is missing"),
    ("pooling_type", "median", "pooling_type is 'median'"),
    ("pooling_position", 0, "pooling_position must be between 1 and quantize_position"),
])
def test_bad_config_field_raises_checkpoint_error_naming_it(scratch, field, value, message):
    config = json.loads((scratch / "config.json").read_text())
    config[field] = value
    (scratch / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"config.json: {message}"):
        WhisperVQSpeechTokenizer(scratch)


def test_mel_bins_disagreeing_with_the_preprocessor_raise_checkpoint_error(scratch):
    pre = json.loads((scratch / "preprocessor_config.json").read_text())
    pre["feature_size"] = 80
    (scratch / "preprocessor_config.json").write_text(json.dumps(pre))
    with pytest.raises(CheckpointError, match="preprocessor_config.json: feature_size .80. differs"):
        WhisperVQSpeechTokenizer(scratch)


# ---------------------------------------------------------------------------- released

def test_released_config_parses_to_the_released_encoder_and_the_writer_covers_its_tensors(tmp_path):
    """At released size the weights are ~1.6 GB, so only the config and shape logic run
    here: the encoder is built on the meta device."""
    folder = write_random_speech_tokenizer(tmp_path / "speech_tokenizer", size="released", weights=False)
    assert not (folder / "model.safetensors").exists()
    cfg = parse_config(folder)
    assert (cfg.d_model, cfg.attention_heads, cfg.num_mel_bins, cfg.quantize_position) == (1280, 20, 128, 16)
    assert (cfg.vocab_size, cfg.token_rate, cfg.pooling_type) == (32768, 25.0, "avg")
    assert cfg.causal_convolution and cfg.block_size == 200 and not cfg.causal_attention
    with torch.device("meta"):
        encoder = WhisperVQEncoder(cfg)
    needed = {k: tuple(v.shape) for k, v in encoder.state_dict().items()}
    config, _ = random_speech_tokenizer_config("released")
    written = checkpoint_shapes(config, config["quantize_position"])
    assert {k: written[PREFIX + k] for k in needed} == needed
    assert sum(np.prod(s) for s in written.values()) * 4 < 1.7e9
    assert len([k for k in needed if k.startswith("layers.")]) == 16 * 15
