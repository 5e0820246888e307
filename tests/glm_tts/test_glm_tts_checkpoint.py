"""The GLM-TTS checkpoint layout read from a path: every required file named when missing,
the flow config as hyperpyyaml (tags recorded, never run) or JSON, the vocoder found by
folder (HiFT, else the TorchScript Vocos2D), and the stages built from a Vocos2D checkpoint
speaking at 32 kHz; the request parser's rules."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.glm_tts.checkpoint import REQUIRED_FILES, open_checkpoint
from tritontts.families.glm_tts.request import parse_glm_tts_params
from tritontts.protocol import InvalidRequest


@pytest.fixture(scope="module")
def tiny(random_checkpoints):
    return random_checkpoints["glm_tts"]


@pytest.fixture
def copy(tiny, tmp_path):
    """A copy to break (the llm weights linked, not copied)."""
    out = tmp_path / "glm"
    shutil.copytree(tiny, out, ignore=shutil.ignore_patterns("*.safetensors"))
    for weights in tiny.rglob("*.safetensors"):
        (out / weights.relative_to(tiny)).symlink_to(weights)
    return out


def test_the_tiny_checkpoint_opens_with_the_released_flow_settings(tiny):
    ckpt = open_checkpoint(tiny)
    assert ckpt.vocoder == "hift" and ckpt.sample_rate == 24000
    config = ckpt.flow_config
    assert (config["input_frame_rate"], config["mel_framerate"]) == (25, 50)
    assert config["spkr_emb_adaLN"] is True and config["remove_spkr_concat_condition"] is True
    assert ckpt.llm_dtype == "float32"


@pytest.mark.parametrize("name", REQUIRED_FILES)
def test_a_missing_file_is_named(copy, name):
    (copy / name).unlink()
    with pytest.raises(CheckpointError, match=name.split("/")[-1]):
        open_checkpoint(copy)


def test_without_a_vocoder_the_error_names_both_kinds(copy):
    (copy / "hift" / "hift.pt").unlink()
    with pytest.raises(CheckpointError, match="hift/hift.pt.*vocos2d/generator_jit.ckpt"):
        open_checkpoint(copy)


def test_the_flow_config_may_be_json_and_a_bad_frame_rate_is_named(copy):
    (copy / "flow" / "config.yaml").unlink()
    (copy / "flow" / "config.json").write_text(json.dumps({"flow": {"input_frame_rate": 25, "mel_framerate": 50}}))
    assert open_checkpoint(copy).flow_config["spkr_emb_adaLN"] is True
    (copy / "flow" / "config.json").write_text(json.dumps({"flow": {"input_frame_rate": 25, "mel_framerate": 75}}))
    with pytest.raises(CheckpointError, match="mel_framerate must be twice"):
        open_checkpoint(copy)


def test_yaml_tags_are_recorded_not_executed(copy):
    marker = copy / "ran"
    (copy / "flow" / "config.yaml").write_text(
        f"pwned: !apply:os.system ['touch {marker}']\nflow: !new:flow.flow.Flow\n    input_frame_rate: 25\n")
    ckpt = open_checkpoint(copy)
    assert not marker.exists() and ckpt.flow_config["input_frame_rate"] == 25


def test_a_vocos2d_checkpoint_is_served_at_32_khz(copy):
    from pathlib import Path

    from tritontts.families.glm_tts.stages import GLMTTSVocoderStage
    from tritontts.families.glm_tts.vocoder import write_random_vocos2d
    from tritontts.serving.stage import Inputs, StageContext

    shutil.rmtree(copy / "hift")
    (copy / "vocos2d").mkdir()
    write_random_vocos2d(copy / "vocos2d" / "generator_jit.ckpt")
    ckpt = open_checkpoint(copy)
    assert ckpt.vocoder == "vocos2d" and ckpt.sample_rate == 32000
    stage = GLMTTSVocoderStage(StageContext("glm_tts_vocoder", Path("model_repository/glm_tts_vocoder")), ckpt)
    mel = np.random.default_rng(0).standard_normal((50, 80)).astype(np.float32)
    out = stage.run(Inputs(mel=mel, frames=np.array([50]), chunk_in_segment=np.array([0]),
                           look_ahead=np.array([0]), segment_end=np.array([True]), stream_id=np.array([1])))
    assert out["sample_rate"] == 32000 and out["audio"].size == 50 * 640


def test_the_parser_requires_a_reference_and_names_what_it_cannot_do():
    with pytest.raises(InvalidRequest, match="send ref_audio"):
        parse_glm_tts_params({})
    with pytest.raises(InvalidRequest, match="no duration control"):
        parse_glm_tts_params({"speed": 2})
    with pytest.raises(InvalidRequest, match="unknown parameter"):
        parse_glm_tts_params({"temperature": 0.5})
    assert parse_glm_tts_params({"voice_features": "AAAA", "speed": 1, "top_k": 5}).sampling == {"top_k": 5}


@pytest.mark.parametrize("value", [0, 4097, 2.5, "100", True])
def test_max_new_tokens_outside_1_to_4096_is_refused_naming_the_range(value):
    with pytest.raises(InvalidRequest, match="max_new_tokens must be an integer from 1 to 4096"):
        parse_glm_tts_params({"voice_features": "AAAA", "max_new_tokens": value})


def test_max_new_tokens_is_carried_and_absent_means_no_cap():
    assert parse_glm_tts_params({"voice_features": "AAAA", "max_new_tokens": 100}).max_new_tokens == 100
    assert parse_glm_tts_params({"voice_features": "AAAA"}).max_new_tokens is None
