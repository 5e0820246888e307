"""Stored voices at the stage level, for every family that clones: the features a prompt
stage packs from a reference (what the front stores at upload) give exactly the prompt the
reference itself gives, and features that are not this checkpoint's are a 400."""
from __future__ import annotations

import base64
import importlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tritontts.families import FAMILIES
from tritontts.protocol import InvalidRequest, decode_params
from tritontts.serving.stage import Inputs, StageContext
from tritontts.voice import VOICE_FEATURES, pack_voice, unpack_voice, voice_metadata

CLONING = [f for f in FAMILIES.values() if f.voice_encoder is not None]
# The checkpoint variant of each family that clones (Qwen3-TTS: the Base kind).
OPTIONS = {"qwen3_tts": {"kind": "base"}}


def reference(seconds: float = 3.0) -> str:  # 3 s: the shortest GLM-TTS takes
    rate = 24000
    t = np.arange(int(rate * seconds)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 140 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32),
             rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def stage_of(family, checkpoint: Path):
    from tritontts.deploy.repository import STAGE_REPOSITORY, read_config

    config = read_config(STAGE_REPOSITORY / family.voice_encoder / "config.pbtxt")
    module, _, name = config.parameters["stage"].string_value.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(StageContext(family.voice_encoder, Path(".")), checkpoint=_open(family, checkpoint))


def _open(family, checkpoint: Path):
    return importlib.import_module(f"tritontts.families.{family.name}.checkpoint").open_checkpoint(checkpoint)


def inputs_of(params: dict, text: str = "Some words to say.") -> Inputs:
    inputs = Inputs(text=np.array([text.encode()], object), voice=np.array([b"default"], object),
                    params=np.array([json.dumps(params).encode()], object))
    inputs.cancelled = lambda: False
    return inputs


def comparable(outputs: dict) -> dict:
    """A prompt stage's outputs minus what differs per request (stream id, random seed)."""
    return {k: np.asarray(v) for k, v in outputs.items() if k not in ("stream_id", "seed")}


def run(stage, inputs: Inputs) -> list[dict]:
    """Every response of the stage: one, or one per segment from a streaming prompt stage
    (OmniVoice's)."""
    result = stage.run(inputs)
    return [result] if isinstance(result, dict) else list(result)


@pytest.fixture(scope="module", params=[f.name for f in CLONING])
def encoder(request, random_checkpoints):
    family = FAMILIES[request.param]
    checkpoint = random_checkpoints.get(family.name, **OPTIONS.get(family.name, {}))
    return family, stage_of(family, checkpoint)


def test_stored_features_give_exactly_the_prompt_of_the_reference(encoder):
    family, stage = encoder
    ref = {"ref_audio": reference(), "ref_text": "The reference voice.", "seed": 7}
    blob = stage.encode_voice(inputs_of(ref))
    assert voice_metadata(blob)["family"] == family.name
    stored = {VOICE_FEATURES: base64.b64encode(blob).decode(), "seed": 7}
    direct, from_features = run(stage, inputs_of(ref)), run(stage, inputs_of(stored))
    assert len(direct) == len(from_features)
    for want, got in zip(direct, from_features):
        want, got = comparable(want), comparable(got)
        assert want.keys() == got.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_features_of_another_checkpoint_are_400_asking_to_upload_again(encoder):
    family, stage = encoder
    blob = stage.encode_voice(inputs_of({"ref_audio": reference(), "ref_text": "The reference voice."}))
    arrays, meta = unpack_voice(blob, family.name, stage_fingerprint(stage), spec_of(stage))
    forged = pack_voice(family.name, "0" * 16, arrays, ref_text=meta.get("ref_text", ""))
    with pytest.raises(InvalidRequest, match="another .* checkpoint; upload the voice again"):
        run(stage, inputs_of({VOICE_FEATURES: base64.b64encode(forged).decode()}))
    # Negative control: the same arrays under the stage's own fingerprint are accepted.
    own = pack_voice(family.name, stage_fingerprint(stage), arrays, ref_text=meta.get("ref_text", ""))
    run(stage, inputs_of({VOICE_FEATURES: base64.b64encode(own).decode()}))


@pytest.mark.parametrize("damage", ["not safetensors", "wrong family", "wrong shape"])
def test_malformed_features_are_400_naming_what_is_wrong(encoder, damage):
    family, stage = encoder
    blob = stage.encode_voice(inputs_of({"ref_audio": reference(), "ref_text": "The reference voice."}))
    arrays, _ = unpack_voice(blob, family.name, stage_fingerprint(stage), spec_of(stage))
    if damage == "not safetensors":
        bad, match = b"\x10\x00\x00\x00\x00\x00\x00\x00garbage", "not packed voice features"
    elif damage == "wrong family":
        bad, match = pack_voice("piper", stage_fingerprint(stage), arrays), "computed by 'piper'"
    else:
        name = next(iter(arrays))
        arrays[name] = np.zeros((3, 3, 3), arrays[name].dtype)
        bad, match = pack_voice(family.name, stage_fingerprint(stage), arrays), f"voice_features '{name}'"
    with pytest.raises(InvalidRequest, match=match):
        run(stage, inputs_of({VOICE_FEATURES: base64.b64encode(bad).decode()}))


def test_features_replace_the_reference_fields_not_join_them(encoder):
    family, stage = encoder
    blob = stage.encode_voice(inputs_of({"ref_audio": reference(), "ref_text": "The reference voice."}))
    both = {VOICE_FEATURES: base64.b64encode(blob).decode(), "ref_audio": reference()}
    with pytest.raises(InvalidRequest, match="replaces ref_audio"):
        family.parse_params(decode_params(json.dumps(both)))


def stage_fingerprint(stage) -> str:
    return getattr(stage, "fingerprint", None) or stage.extractor.fingerprint


def spec_of(stage) -> dict:
    if hasattr(stage, "voice_spec"):
        return stage.voice_spec
    from tritontts.families.cosyvoice3.prompt import VOICE_SPEC

    return VOICE_SPEC


def test_a_voice_stored_from_a_speaker_embedding_speaks_as_the_embedding_does(encoder):
    family, stage = encoder
    if "speaker_embedding" not in family.fields.takes:
        with pytest.raises(InvalidRequest, match="speaker_embedding"):
            stage.encode_voice(inputs_of({"speaker_embedding": [0.1, 0.2]}))
        return
    dim = stage.voice_spec["embedding"][1][0]
    embedding = {"speaker_embedding": [float(np.sin(i)) for i in range(dim)], "seed": 3}
    blob = stage.encode_voice(inputs_of(embedding))
    stored = {VOICE_FEATURES: base64.b64encode(blob).decode(), "seed": 3}
    direct, from_features = comparable(stage.run(inputs_of(embedding))), comparable(stage.run(inputs_of(stored)))
    for name in direct:
        np.testing.assert_array_equal(from_features[name], direct[name], err_msg=name)
