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


# --- tritontts-voice precompute: the features an upload stores, byte for byte ---------------

class InProcessTriton:
    """The front's Triton client for voice uploads, with the family's prompt stage behind
    it in this process: the request the front sends (text "", voice "default", params as
    JSON) reaches the stage's encode_voice as the Triton backend hands it over."""

    def __init__(self, stage):
        self.stage = stage

    async def encode_voice(self, model: str, params: dict) -> bytes:
        from frontend.triton_client import StageRejected

        inputs = Inputs(text=np.array([b""], object), voice=np.array([b"default"], object),
                        params=np.array([json.dumps(params).encode()], object))
        try:
            return self.stage.encode_voice(inputs)
        except InvalidRequest as exc:
            raise StageRejected(str(exc)) from None

    async def model_ready(self, model: str) -> bool:
        return True

    async def server_ready(self) -> bool:
        return True

    async def close(self) -> None:
        pass


def uploaded_through_the_front(family, stage, voices: Path, audio: bytes, ref_text: str | None):
    from starlette.testclient import TestClient

    from frontend.app import create_app

    client = TestClient(create_app("inprocess:0", [family.name], client=InProcessTriton(stage), voices_dir=voices))
    with client:
        r = client.post("/v1/audio/voices", data={"name": "Alice", "consent": "rec-1",
                                                  **({"ref_text": ref_text} if ref_text else {})},
                        files={"audio_sample": ("alice.wav", audio, "audio/wav")})
    assert r.status_code == 200, r.text
    return r.json()["voice"]


def test_precompute_writes_the_features_an_upload_stores_byte_for_byte_in_every_mode(
        encoder, random_checkpoints, tmp_path, capsys):
    """For each of the family's voice modes: POST /v1/audio/voices (through the front, the
    stage behind an in-process client) and `tritontts-voice precompute` (building the stage
    itself from its config) store identical features, recording and mode. Control: another
    recording's features differ from them."""
    from frontend.voice_cli import main

    family, stage = encoder
    checkpoint = random_checkpoints.get(family.name, **OPTIONS.get(family.name, {}))
    audio = base64.b64decode(reference())
    (tmp_path / "ref.wav").write_bytes(audio)
    assert family.voice_modes, "a family that clones declares its voice modes"
    for mode in family.voice_modes:
        text = "The reference voice." if mode.transcript else None
        voice = uploaded_through_the_front(family, stage, tmp_path / mode.name / "front", audio, text)
        assert voice["modes"] == {family.name: mode.name}
        code = main(["precompute", "--family", family.name, "--checkpoint", str(checkpoint),
                     "--voices-dir", str(tmp_path / mode.name / "cli"), "--name", "Alice",
                     "--audio", str(tmp_path / "ref.wav"), "--consent", "rec-1", "--mode", mode.name,
                     *(["--ref-text", text] if text else [])])
        assert code == 0, capsys.readouterr().err
        front, cli = (tmp_path / mode.name / side / "alice" for side in ("front", "cli"))
        features = f"features/{family.name}.safetensors"
        assert (cli / features).read_bytes() == (front / features).read_bytes(), mode.name
        assert (cli / "reference.wav").read_bytes() == (front / "reference.wav").read_bytes() == audio
        stored = {side: json.loads((p / "voice.json").read_text()) for side, p in (("front", front), ("cli", cli))}
        for key in ("ref_text", "modes", "duration", "source"):
            assert stored["cli"][key] == stored["front"][key], key
        other = base64.b64decode(reference(4.0))
        params = {"ref_audio": base64.b64encode(other).decode(), **({"ref_text": text} if text else {}),
                  **mode.params}
        assert stage.encode_voice(inputs_of(params)) != (front / features).read_bytes()


def test_every_cloning_family_declares_voice_modes_its_fields_can_ask_for():
    for family in FAMILIES.values():
        assert bool(family.voice_modes) == (family.voice_encoder is not None), family.name
        names = [m.name for m in family.voice_modes]
        assert len(set(names)) == len(names), family.name
        for mode in family.voice_modes:
            assert set(mode.params) <= set(family.fields.takes), (family.name, mode.name)
            assert family.voice_mode(mode.transcript, mode.name) is mode
        if family.speaker_embeddings is not None:
            assert family.voice_encoder is not None and "speaker_embedding" in family.fields.takes, family.name


def test_the_mode_an_upload_takes_is_the_first_that_fits_its_transcript():
    from dataclasses import replace

    from tritontts.family import VoiceMode

    family = next(iter(CLONING))
    a, b, c = (VoiceMode("a", "", True), VoiceMode("b", "", False, {"x": 1}), VoiceMode("c", "", True))
    family = replace(family, voice_modes=(a, b, c))
    assert family.voice_mode(True) is a and family.voice_mode(False) is b
    assert family.voice_mode(True, "c") is c
    only = replace(family, voice_modes=(a,))
    with pytest.raises(ValueError, match=r"a transcript of the recording is required \(ref_text\)"):
        only.voice_mode(False)
    with pytest.raises(ValueError, match="takes no transcript"):
        family.voice_mode(True, "b")
    with pytest.raises(ValueError, match="needs a transcript"):
        family.voice_mode(False, "a")
    with pytest.raises(ValueError, match="no voice mode 'z'; its modes: a .*, b .*, c"):
        family.voice_mode(True, "z")


def test_a_blend_is_the_weighted_mean_its_weights_being_shares():
    from tritontts.voice import blend_embeddings

    a, b = np.array([1.0, 0.0, 2.0], np.float32), np.array([0.0, 4.0, -2.0], np.float32)
    mixed = blend_embeddings([a, b], [0.7, 0.3])
    assert mixed.dtype == np.float32
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_array_equal(mixed, ((0.7 / 1.0) * a64 + (0.3 / 1.0) * b64).astype(np.float32))
    # Weights are shares: 7:3 is the voice 0.7:0.3 is (to float32 rounding of the shares).
    np.testing.assert_allclose(blend_embeddings([a, b], [7, 3]), mixed, rtol=1e-6, atol=1e-7)
    assert not np.array_equal(blend_embeddings([a, b], [3, 7]), mixed)          # control: order matters
    np.testing.assert_array_equal(blend_embeddings([a], [2.5]), a)
    for weights in ([0, 1], [-1, 2], [float("nan"), 1], [float("inf"), 1], [True, 1]):
        with pytest.raises(ValueError, match="positive"):
            blend_embeddings([a, b], weights)
    with pytest.raises(ValueError, match="differ in length"):
        blend_embeddings([a, b[:2]], [1, 1])


def test_packed_features_are_the_same_bytes_every_time():
    """safetensors writes metadata in a hash map's order, which changes from call to call
    (the control: 30 plain saves of one input give several byte strings); pack_voice's
    canonical header makes one voice one file, whichever process packs it."""
    from safetensors.numpy import load, save

    arrays = {"b": np.ones((2, 2), np.int64), "a": np.arange(3, dtype=np.float32)}
    meta = {"ref_text": 'zé "q"\n', "mode": "m"}
    plain = {save(arrays, metadata={"family": "f", "fingerprint": "p", **meta}) for _ in range(30)}
    assert len(plain) > 1
    packed = {pack_voice("f", "p", arrays, **meta) for _ in range(30)}
    assert len(packed) == 1
    blob = packed.pop()
    assert voice_metadata(blob) == {"family": "f", "fingerprint": "p", **meta}
    assert {k: v.tolist() for k, v in load(blob).items()} == {k: v.tolist() for k, v in arrays.items()}


def test_the_voice_fingerprint_a_stage_reports_is_the_one_its_features_carry(encoder):
    """tritontts-voice compares stored features with a checkpoint through it."""
    family, stage = encoder
    blob = stage.encode_voice(inputs_of({"ref_audio": reference(), "ref_text": "The reference voice."}))
    assert stage.voice_fingerprint() == voice_metadata(blob)["fingerprint"] == stage_fingerprint(stage)
