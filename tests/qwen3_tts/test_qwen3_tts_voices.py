"""Qwen3-TTS stored voices at the prompt stage, in-process on tiny random checkpoints: Base
voices without a transcript are x-vector only (and say so in their features), CustomVoice
speaks voices stored from a speaker embedding as its speaker row, and `tritontts-voice
blend` makes a voice of the weighted mean of presets' rows or stored voices' x-vectors."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import frontend.voice_cli as voice_cli
from frontend.serving import recording_params
from tritontts.families.qwen3_tts.checkpoint import open_checkpoint
from tritontts.families.qwen3_tts.family import FAMILY, ICL, XVEC
from tritontts.families.qwen3_tts.request import check_task, parse_qwen3_tts_params
from tritontts.families.qwen3_tts.stages import Qwen3TTSPromptStage
from tritontts.protocol import InvalidRequest
from tritontts.serving.stage import Inputs, StageContext
from tritontts.voice import VOICE_FEATURES, blend_embeddings, pack_voice, unpack_voice, voice_metadata

TRANSCRIPT = "This is the reference voice."


def recording(seconds: float = 3.0, pitch: float = 150.0) -> bytes:
    rate = 24000
    t = np.arange(int(rate * seconds)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * pitch * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32),
             rate, format="WAV")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def inputs_of(params: dict, voice: str = "default", text: str = "Some words to say.") -> Inputs:
    return Inputs(text=np.array([text.encode()], object), voice=np.array([voice.encode()], object),
                  params=np.array([json.dumps(params).encode()], object))


def prompt(stage, params: dict, voice: str = "default") -> dict:
    """The prompt stage's outputs minus what differs per request."""
    outputs = stage.run(inputs_of({**params, "seed": 3}, voice))
    return {k: np.asarray(v) for k, v in outputs.items() if k not in ("stream_id", "seed")}


def assert_same_prompt(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def stage_on(path: Path) -> Qwen3TTSPromptStage:
    return Qwen3TTSPromptStage(StageContext("qwen3_tts_prompt", Path(".")), checkpoint=open_checkpoint(path))


@pytest.fixture(scope="module")
def paths(random_checkpoints):
    return {"base": random_checkpoints.get("qwen3_tts", kind="base"),
            "custom_voice": random_checkpoints.get("qwen3_tts")}


@pytest.fixture(scope="module")
def stages(paths):
    return {kind: stage_on(path) for kind, path in paths.items()}


@pytest.fixture
def cli(stages, paths, monkeypatch, capsys):
    """tritontts-voice in this process, its voice encoder the module's stage of the same
    checkpoint (tests/test_voice_features.py runs the CLI's own stage construction)."""
    by_path = {str(paths[kind]): stage for kind, stage in stages.items()}
    monkeypatch.setattr(voice_cli, "voice_encoder", lambda family, checkpoint, model, device="cpu":
                        by_path[str(checkpoint)])

    def run(*argv) -> tuple[int, str, str]:
        code = voice_cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def stored(voices: Path, name: str, model: str = "qwen3_tts") -> bytes:
    return (voices / name.casefold() / "features" / f"{model}.safetensors").read_bytes()


def arrays_of(stage, blob: bytes) -> dict:
    return unpack_voice(blob, FAMILY.name, stage.fingerprint, stage.voice_spec, optional=("codes", "ref_ids"))[0]


# --- Base: x-vector-only voices ------------------------------------------------------------

def test_an_upload_without_ref_text_is_an_xvector_only_voice_that_speaks_as_x_vector_only_mode(stages):
    base = stages["base"]
    mode, params = recording_params(FAMILY, recording(), None)     # what the upload sends
    assert mode is XVEC and params == {"ref_audio": b64(recording()), "x_vector_only_mode": True}
    blob = base.encode_voice(inputs_of(params))
    assert voice_metadata(blob)["mode"] == "xvec" and set(arrays_of(base, blob)) == {"embedding"}
    from_voice = prompt(base, {VOICE_FEATURES: b64(blob)})
    assert_same_prompt(from_voice, prompt(base, {"ref_audio": b64(recording()), "x_vector_only_mode": True}))
    # Control: the same recording with its transcript is an in-context voice, another prompt.
    mode, params = recording_params(FAMILY, recording(), TRANSCRIPT)
    icl = base.encode_voice(inputs_of(params))
    assert mode is ICL and voice_metadata(icl)["mode"] == "icl"
    assert set(arrays_of(base, icl)) == {"embedding", "codes", "ref_ids"}
    in_context = prompt(base, {VOICE_FEATURES: b64(icl)})
    assert int(in_context["ref_frames"]) > 0 and int(from_voice["ref_frames"]) == 0


def test_features_whose_mode_disagrees_with_their_arrays_are_400_and_unmarked_ones_clone_as_their_arrays(stages):
    base = stages["base"]
    icl = arrays_of(base, base.encode_voice(inputs_of({"ref_audio": b64(recording()), "ref_text": TRANSCRIPT})))
    lone = {"embedding": icl["embedding"]}
    for arrays, mode in ((lone, "icl"), (icl, "xvec")):
        with pytest.raises(InvalidRequest, match=f"say mode '{mode}'"):
            prompt(base, {VOICE_FEATURES: b64(pack_voice(FAMILY.name, base.fingerprint, arrays, mode=mode))})
    # Voices packed before the mode was recorded: their arrays decide.
    unmarked = prompt(base, {VOICE_FEATURES: b64(pack_voice(FAMILY.name, base.fingerprint, icl))})
    marked = prompt(base, {VOICE_FEATURES: b64(pack_voice(FAMILY.name, base.fingerprint, icl, mode="icl"))})
    assert_same_prompt(unmarked, marked)
    assert int(prompt(base, {VOICE_FEATURES: b64(pack_voice(FAMILY.name, base.fingerprint, lone))})["ref_frames"]) == 0


# --- CustomVoice: voices from a speaker embedding ------------------------------------------

def rows(stage, *speakers: str) -> list[np.ndarray]:
    """The presets' rows as the stage's talker holds them (not read as the CLI reads them)."""
    table = stage.talker.model.codec_embedding.weight.detach().float().numpy()
    return [table[stage.checkpoint.speaker_id(s)] for s in speakers]


def test_a_custom_voice_checkpoint_stores_no_recording_and_says_which_checkpoint_clones(stages):
    with pytest.raises(InvalidRequest, match=r"cloning a recording needs a base checkpoint \(Qwen3-TTS-12Hz-"):
        stages["custom_voice"].encode_voice(inputs_of({"ref_audio": b64(recording()), "ref_text": TRANSCRIPT}))


def test_a_blend_of_one_preset_speaks_exactly_as_that_preset_with_or_without_instructions(stages, cli, paths, tmp_path):
    custom = stages["custom_voice"]
    speaker = next(s for s in custom.checkpoint.speakers if custom.checkpoint.speaker_dialect(s) is None)
    code, out, err = cli("blend", "--family", "qwen3_tts", "--checkpoint", paths["custom_voice"],
                         "--voices-dir", tmp_path, "--name", "Solo", f"{speaker.upper()}:2")
    assert code == 0, err
    blob = stored(tmp_path, "Solo")
    assert voice_metadata(blob)["mode"] == "embedding"
    for extra in ({}, {"instructions": "Speak slowly."}):
        assert_same_prompt(prompt(custom, {VOICE_FEATURES: b64(blob), **extra}), prompt(custom, extra, voice=speaker))
    # Control: another preset's prompt is not this one.
    other = next(s for s in custom.checkpoint.speakers if s != speaker)
    assert not np.array_equal(prompt(custom, {}, voice=other)["prompt_embeds"],
                              prompt(custom, {VOICE_FEATURES: b64(blob)})["prompt_embeds"])


def test_a_blend_of_presets_is_the_weighted_mean_of_their_rows_the_weights_being_shares(stages, cli, paths, tmp_path):
    custom = stages["custom_voice"]
    a, b = sorted(custom.checkpoint.speakers)[:2]
    code, _, err = cli("blend", "--family", "qwen3_tts", "--checkpoint", paths["custom_voice"],
                       "--voices-dir", tmp_path, "--name", "Mix", f"{a}:7", f"{b}:3")
    assert code == 0, err
    row_a, row_b = rows(custom, a, b)
    want = (0.7 * row_a.astype(np.float64) + 0.3 * row_b.astype(np.float64)).astype(np.float32)
    got = arrays_of(custom, stored(tmp_path, "Mix"))["embedding"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got, blend_embeddings([row_a, row_b], [7, 3]))
    assert not np.allclose(got, 7 * row_a + 3 * row_b)          # control: not the raw weighted sum
    voice = json.loads((tmp_path / "mix" / "voice.json").read_text())
    np.testing.assert_array_equal(np.asarray(voice["speaker_embedding"], np.float32), got)
    assert [(p["name"], p["kind"], p["share"]) for p in voice["blend"]] == [(a, "preset", 0.7), (b, "preset", 0.3)]
    assert voice["modes"] == {"qwen3_tts": "embedding"} and voice["source"] == "embedding"


def test_a_stored_voice_on_a_custom_voice_checkpoint_needs_voice_default_and_no_codes(stages):
    custom, base = stages["custom_voice"], stages["base"]
    row = rows(custom, custom.checkpoint.speakers[0])[0]
    blob = custom.encode_voice(inputs_of({"speaker_embedding": [float(v) for v in row]}))
    prompt(custom, {VOICE_FEATURES: b64(blob)})                          # control: accepted
    with pytest.raises(InvalidRequest, match="replaces the preset speaker; use voice 'default'"):
        prompt(custom, {VOICE_FEATURES: b64(blob)}, voice=custom.checkpoint.speakers[1])
    icl = arrays_of(base, base.encode_voice(inputs_of({"ref_audio": b64(recording()), "ref_text": TRANSCRIPT})))
    forged = pack_voice(FAMILY.name, custom.fingerprint, icl, mode="icl")
    with pytest.raises(InvalidRequest, match="clones in context .* needs a base checkpoint"):
        prompt(custom, {VOICE_FEATURES: b64(forged)})
    with pytest.raises(InvalidRequest, match="speaker rows have"):
        custom.encode_voice(inputs_of({"speaker_embedding": [0.5] * 3}))


def test_a_stored_voice_needs_a_base_or_custom_voice_checkpoint():
    params = parse_qwen3_tts_params({VOICE_FEATURES: b64(b"x")})
    assert params.task_type is None                                   # the checkpoint decides
    assert check_task(params, "base") == "Base" and check_task(params, "custom_voice") == "CustomVoice"
    with pytest.raises(InvalidRequest, match="needs a base or custom_voice checkpoint"):
        check_task(params, "voice_design")
    with pytest.raises(InvalidRequest, match="not used by Base"):
        check_task(parse_qwen3_tts_params({VOICE_FEATURES: b64(b"x"), "instructions": "slowly"}), "base")
    assert check_task(parse_qwen3_tts_params({VOICE_FEATURES: b64(b"x"), "instructions": "slowly"}),
                      "custom_voice") == "CustomVoice"
    with pytest.raises(InvalidRequest, match="x_vector_only_mode is only valid for task_type Base"):
        check_task(parse_qwen3_tts_params({VOICE_FEATURES: b64(b"x"), "x_vector_only_mode": True}), "custom_voice")
    with pytest.raises(InvalidRequest, match="for task_type Base or CustomVoice"):
        parse_qwen3_tts_params({VOICE_FEATURES: b64(b"x"), "task_type": "VoiceDesign", "instructions": "deep"})


# --- Base blends, and what a blend refuses --------------------------------------------------

def test_a_blend_of_stored_base_voices_is_the_weighted_mean_of_their_xvectors_and_speaks_as_that_embedding(
        stages, cli, paths, tmp_path):
    base = stages["base"]
    (tmp_path / "a.wav").write_bytes(recording(3.0, 150.0))
    (tmp_path / "b.wav").write_bytes(recording(2.0, 230.0))
    common = ("--family", "qwen3_tts", "--checkpoint", paths["base"], "--voices-dir", tmp_path / "v")
    assert cli("precompute", *common, "--name", "A", "--audio", tmp_path / "a.wav", "--consent", "c",
               "--ref-text", TRANSCRIPT)[0] == 0
    assert cli("precompute", *common, "--name", "B", "--audio", tmp_path / "b.wav", "--consent", "c")[0] == 0
    code, _, err = cli("blend", *common, "--name", "AB", "a:1", "b:2")
    assert code == 0, err
    x_a, x_b = (arrays_of(base, stored(tmp_path / "v", n))["embedding"] for n in ("A", "B"))
    assert not np.allclose(x_a, x_b)
    blob = stored(tmp_path / "v", "AB")
    got = arrays_of(base, blob)
    assert set(got) == {"embedding"} and voice_metadata(blob)["mode"] == "embedding"
    np.testing.assert_array_equal(got["embedding"], blend_embeddings([x_a, x_b], [1, 2]))
    embedding = [float(v) for v in got["embedding"]]
    assert_same_prompt(prompt(base, {VOICE_FEATURES: b64(blob)}), prompt(base, {"speaker_embedding": embedding}))


def test_a_blend_of_a_voice_from_another_checkpoint_is_exit_2_naming_both_fingerprints(stages, cli, paths, tmp_path):
    (tmp_path / "a.wav").write_bytes(recording())
    assert cli("precompute", "--family", "qwen3_tts", "--checkpoint", paths["base"], "--voices-dir", tmp_path,
               "--name", "A", "--audio", tmp_path / "a.wav", "--consent", "c")[0] == 0
    speaker = stages["custom_voice"].checkpoint.speakers[0]
    code, _, err = cli("blend", "--family", "qwen3_tts", "--checkpoint", paths["custom_voice"], "--voices-dir",
                       tmp_path, "--name", "Mix", f"{speaker}:1", "A:1")
    assert code == 2 and "computed by another checkpoint" in err
    assert stages["base"].fingerprint in err and stages["custom_voice"].fingerprint in err
    assert not (tmp_path / "mix").exists()


def test_a_blend_part_that_is_no_preset_and_no_voice_is_exit_2_naming_the_presets(stages, cli, paths, tmp_path):
    code, _, err = cli("blend", "--family", "qwen3_tts", "--checkpoint", paths["custom_voice"], "--voices-dir",
                       tmp_path, "--name", "Mix", "nobody:1")
    assert code == 2 and "'nobody' is neither a preset speaker" in err
    assert all(s in err for s in stages["custom_voice"].checkpoint.speakers)
    code, _, err = cli("blend", "--family", "qwen3_tts", "--checkpoint", paths["custom_voice"], "--voices-dir",
                       tmp_path, "--name", stages["custom_voice"].checkpoint.speakers[0], "nobody:1")
    assert code == 2 and "is a built-in voice of qwen3_tts" in err


def test_inspect_with_the_checkpoint_says_whether_the_voice_is_its_and_exits_2_when_not(stages, cli, paths, tmp_path,
                                                                                       monkeypatch):
    (tmp_path / "a.wav").write_bytes(recording())
    assert cli("precompute", "--family", "qwen3_tts", "--checkpoint", paths["base"], "--voices-dir", tmp_path,
               "--name", "A", "--audio", tmp_path / "a.wav", "--consent", "c", "--ref-text", TRANSCRIPT)[0] == 0
    code, out, _ = cli("inspect", "--voices-dir", tmp_path, "A", "--family", "qwen3_tts",
                       "--checkpoint", paths["base"])
    report = json.loads(out)
    assert code == 0 and report["checkpoint"]["matches"] == ["qwen3_tts"]
    assert report["models"]["qwen3_tts"] == {"family": "qwen3_tts", "fingerprint": stages["base"].fingerprint,
                                             "mode": "icl", "bytes": len(stored(tmp_path, "A"))}
    assert (report["transcript"], report["duration"]) == (TRANSCRIPT, pytest.approx(3.0))
    code, _, err = cli("inspect", "--voices-dir", tmp_path, "A", "--family", "qwen3_tts",
                       "--checkpoint", paths["custom_voice"])
    assert code == 2 and "computed by another checkpoint" in err


def test_speaker_rows_read_from_the_checkpoint_are_the_talkers(stages, paths):
    from tritontts.families.qwen3_tts.speakers import preset_embeddings

    custom = stages["custom_voice"]
    presets = preset_embeddings(paths["custom_voice"])
    assert sorted(presets) == sorted(custom.checkpoint.speakers)
    for name, row in presets.items():
        np.testing.assert_array_equal(row, rows(custom, name)[0])
    assert preset_embeddings(paths["base"]) == {}
    assert torch.is_tensor(custom.talker.model.codec_embedding.weight)
