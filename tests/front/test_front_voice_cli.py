"""tritontts-voice without a voice encoder: every refusal is exit status 2 with a message that
says what to fix (for a recording, the upload route's own 400 message, compared here with
what the front answers for the same bytes), checked before any checkpoint is read; list,
inspect and delete on a folder a front wrote. The features themselves (the family's stage
run in-process, byte-equal to an upload's) are tests/test_voice_features.py's; blends of
real speaker vectors are in the tests of the family that declares them."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from fake_triton import FakeTritonClient
from starlette.testclient import TestClient

import frontend.voices as voices_module
from frontend.app import create_app
from frontend.voice_cli import main
from tritontts.families import FAMILIES
from tritontts.testing.bad_requests import wav

CLONES_WITH_TRANSCRIPT_ONLY = "cosyvoice3"
# Families found by what they declare, not by name.
TAKES_NO_TRANSCRIPT = next(f for f in FAMILIES.values() if any(not m.transcript for m in f.voice_modes))
BLENDS = next(f for f in FAMILIES.values() if f.speaker_embeddings is not None)
NO_CHECKPOINT = Path("/nonexistent/checkpoint")     # a check that read it would fail on it


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def precompute(capsys, voices, audio: Path, *extra, family=CLONES_WITH_TRANSCRIPT_ONLY, name="Alice",
               checkpoint=NO_CHECKPOINT):
    return cli(capsys, "precompute", "--family", family, "--checkpoint", checkpoint, "--voices-dir", voices,
               "--name", name, "--audio", audio, "--consent", "rec-1", *extra)


def upload_message(tmp_path, data: bytes, filename: str = "ref.wav", family=CLONES_WITH_TRANSCRIPT_ONLY,
                   **fields) -> tuple[int, str, FakeTritonClient]:
    """What the front answers an upload of `data` (a scripted Triton behind it)."""
    fake = FakeTritonClient()
    client = TestClient(create_app("fake:0", [family], client=fake, voices_dir=tmp_path / "front"))
    with client:
        r = client.post("/v1/audio/voices", data={"name": "Alice", "consent": "rec-1", **fields},
                        files={"audio_sample": (filename, data, "audio/wav")})
    return r.status_code, r.json().get("error", {}).get("message", ""), fake


def test_an_unknown_family_is_exit_2_listing_the_families(tmp_path, capsys):
    code, _, err = precompute(capsys, tmp_path, tmp_path / "a.wav", family="nosuch")
    assert code == 2 and "unknown family 'nosuch'" in err
    assert all(name in err for name in FAMILIES)


def test_a_family_that_does_not_clone_is_exit_2_naming_those_that_do(tmp_path, capsys):
    plain = next(f for f in FAMILIES.values() if f.voice_encoder is None)
    code, _, err = precompute(capsys, tmp_path, tmp_path / "a.wav", family=plain.name)
    assert code == 2 and f"{plain.name} does not clone voices" in err
    assert CLONES_WITH_TRANSCRIPT_ONLY in err


@pytest.mark.parametrize("case", ["too short", "too long", "silent", "not audio"])
def test_a_recording_the_upload_refuses_is_exit_2_with_the_uploads_400_message(tmp_path, capsys, case):
    data = {"too short": wav(0.5), "too long": wav(31.0), "silent": wav(2.0, silent=True),
            "not audio": b"RIFF not really a wav"}[case]
    (tmp_path / "ref.wav").write_bytes(data)
    status, message, fake = upload_message(tmp_path, data, ref_text="The reference.")
    assert status == 400 and message and fake.encoded == []
    code, out, err = precompute(capsys, tmp_path / "voices", tmp_path / "ref.wav", "--ref-text", "The reference.")
    assert code == 2 and message in err, (message, err)
    assert not (tmp_path / "voices").exists() or list((tmp_path / "voices").iterdir()) == []


def test_a_good_recording_passes_the_same_checks(tmp_path, capsys):
    """Control for the test above: the same path with a usable recording gets as far as the
    checkpoint (which does not exist here), so the refusals above were the recording's."""
    (tmp_path / "ref.wav").write_bytes(wav(2.0))
    code, _, err = precompute(capsys, tmp_path / "voices", tmp_path / "ref.wav", "--ref-text", "The reference.")
    assert code == 2 and str(NO_CHECKPOINT) in err and "audio_sample" not in err


def test_a_file_that_is_not_named_as_audio_is_exit_2_naming_the_types(tmp_path, capsys):
    (tmp_path / "ref.txt").write_bytes(wav(2.0))
    code, _, err = precompute(capsys, tmp_path / "voices", tmp_path / "ref.txt", "--ref-text", "Hi.")
    assert code == 2 and "ref.txt" in err and ".wav" in err


def test_no_transcript_for_a_family_that_needs_one_is_exit_2_with_the_uploads_message(tmp_path, capsys):
    (tmp_path / "ref.wav").write_bytes(wav(2.0))
    status, message, fake = upload_message(tmp_path, wav(2.0))
    assert status == 400 and "transcript" in message and fake.encoded == []   # Triton never asked
    reason = message.split(f"{CLONES_WITH_TRANSCRIPT_ONLY}: ", 1)[1]          # the family's own words
    code, _, err = precompute(capsys, tmp_path / "voices", tmp_path / "ref.wav")
    assert code == 2 and reason in err and "--ref-text" in err


def test_a_mode_the_family_lacks_or_that_does_not_fit_the_transcript_is_exit_2(tmp_path, capsys):
    (tmp_path / "ref.wav").write_bytes(wav(2.0))
    code, _, err = precompute(capsys, tmp_path / "v", tmp_path / "ref.wav", "--ref-text", "Hi.", "--mode", "nosuch")
    assert code == 2 and "no voice mode 'nosuch'" in err
    assert all(m.name in err for m in FAMILIES[CLONES_WITH_TRANSCRIPT_ONLY].voice_modes)
    bare = next(m for m in TAKES_NO_TRANSCRIPT.voice_modes if not m.transcript)
    code, _, err = precompute(capsys, tmp_path / "v", tmp_path / "ref.wav", "--ref-text", "Hi.", "--mode", bare.name,
                              family=TAKES_NO_TRANSCRIPT.name)
    assert code == 2 and "takes no transcript" in err
    full = next(m for m in TAKES_NO_TRANSCRIPT.voice_modes if m.transcript)
    code, _, err = precompute(capsys, tmp_path / "v", tmp_path / "ref.wav", "--mode", full.name,
                              family=TAKES_NO_TRANSCRIPT.name)
    assert code == 2 and "needs a transcript" in err


def test_a_voices_dir_that_cannot_be_written_is_exit_2_naming_it(tmp_path, capsys, monkeypatch):
    (tmp_path / "ref.wav").write_bytes(wav(2.0))
    (tmp_path / "file").write_text("not a folder")
    code, _, err = precompute(capsys, tmp_path / "file", tmp_path / "ref.wav", "--ref-text", "Hi.")
    assert code == 2 and f"voices directory {tmp_path / 'file'}" in err
    import errno

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(voices_module.tempfile, "mkdtemp", read_only)
    code, _, err = precompute(capsys, tmp_path / "ro", tmp_path / "ref.wav", "--ref-text", "Hi.")
    assert code == 2 and f"voices directory {tmp_path / 'ro'} is not writable" in err


def test_a_name_taken_in_the_voices_dir_is_exit_2_saying_how_to_free_it(tmp_path, capsys):
    fake = FakeTritonClient()
    client = TestClient(create_app("fake:0", [CLONES_WITH_TRANSCRIPT_ONLY], client=fake, voices_dir=tmp_path))
    with client:
        assert client.post("/v1/audio/voices", data={"name": "Alice", "consent": "c", "ref_text": "Hi."},
                           files={"audio_sample": ("a.wav", wav(2.0), "audio/wav")}).status_code == 200
    (tmp_path / "ref.wav").write_bytes(wav(2.0))
    code, _, err = precompute(capsys, tmp_path, tmp_path / "ref.wav", "--ref-text", "Hi.", name="ALICE")
    assert code == 2 and "exists" in err and "tritontts-voice delete" in err
    code, _, err = precompute(capsys, tmp_path, tmp_path / "ref.wav", "--ref-text", "Hi.", name="../x")
    assert code == 2 and "may hold letters" in err


# --- list, inspect, delete ----------------------------------------------------------------

@pytest.fixture
def uploaded(tmp_path):
    """A voices folder holding one voice uploaded to a front, in its family's mode."""
    fake = FakeTritonClient()
    client = TestClient(create_app("fake:0", [CLONES_WITH_TRANSCRIPT_ONLY], client=fake, voices_dir=tmp_path))
    with client:
        r = client.post("/v1/audio/voices", data={"name": "Alice", "consent": "rec-1", "ref_text": "Hi there."},
                        files={"audio_sample": ("a.wav", wav(2.0), "audio/wav")})
    assert r.status_code == 200, r.text
    return tmp_path


def test_list_shows_what_the_front_lists(uploaded, capsys):
    code, out, _ = cli(capsys, "list", "--voices-dir", uploaded, "--json")
    (entry,) = json.loads(out)
    assert code == 0 and entry["name"] == "Alice" and entry["models"] == [CLONES_WITH_TRANSCRIPT_ONLY]
    assert entry["modes"] == {CLONES_WITH_TRANSCRIPT_ONLY: FAMILIES[CLONES_WITH_TRANSCRIPT_ONLY].voice_modes[0].name}
    assert entry["duration"] == pytest.approx(2.0)
    code, out, _ = cli(capsys, "list", "--voices-dir", uploaded)
    assert code == 0 and out.startswith("Alice\t") and '"Hi there."' in out


def test_inspect_shows_the_voices_models_modes_duration_and_transcript(uploaded, capsys):
    code, out, _ = cli(capsys, "inspect", "--voices-dir", uploaded, "alice")
    report = json.loads(out)
    assert code == 0 and (report["name"], report["transcript"]) == ("Alice", "Hi there.")
    assert report["duration"] == pytest.approx(2.0) and report["source"] == "audio"
    model = report["models"][CLONES_WITH_TRANSCRIPT_ONLY]
    # The scripted Triton's features are not packed ones: no family or fingerprint to show.
    assert model["mode"] == "clone" and model["bytes"] > 0 and "error" not in model
    code, _, err = cli(capsys, "inspect", "--voices-dir", uploaded, "bob")
    assert code == 2 and "'bob' is not in" in err


def test_list_and_inspect_read_a_folder_without_writing_it(uploaded, capsys):
    """Read-only: a stale leftover a writing store sweeps stays (the control shows it would
    have been swept)."""
    stale = uploaded / ".tmp-leftover"
    stale.mkdir()
    old = time.time() - 2 * voices_module.STALE_TMP_S
    os.utime(stale, (old, old))
    assert cli(capsys, "list", "--voices-dir", uploaded)[0] == 0
    assert cli(capsys, "inspect", "--voices-dir", uploaded, "Alice")[0] == 0
    assert stale.exists()
    voices_module.VoiceStore(uploaded)          # control: a store that writes sweeps it
    assert not stale.exists()


def test_delete_removes_the_folder_and_a_second_delete_is_exit_2(uploaded, capsys):
    code, out, _ = cli(capsys, "delete", "--voices-dir", uploaded, "ALICE")
    assert code == 0 and "deleted Alice" in out and not (uploaded / "alice").exists()
    code, _, err = cli(capsys, "delete", "--voices-dir", uploaded, "Alice")
    assert code == 2 and "does not exist" in err


def test_list_of_a_missing_folder_is_exit_2_naming_it(tmp_path, capsys):
    code, _, err = cli(capsys, "list", "--voices-dir", tmp_path / "nowhere")
    assert code == 2 and str(tmp_path / "nowhere") in err


def test_modes_lists_every_cloning_familys_modes(capsys):
    code, out, _ = cli(capsys, "modes")
    assert code == 0
    for family in FAMILIES.values():
        assert (family.name in out) == bool(family.voice_modes)
        assert all(f"  {m.name}\t" in out for m in family.voice_modes)


# --- blend: what is refused before any checkpoint is read ----------------------------------

def blend(capsys, voices, *parts, family=BLENDS.name):
    return cli(capsys, "blend", "--family", family, "--checkpoint", NO_CHECKPOINT, "--voices-dir", voices,
               "--name", "Mix", *parts)


def test_a_family_that_does_not_speak_from_an_embedding_cannot_blend(tmp_path, capsys):
    code, _, err = blend(capsys, tmp_path, "a:1", "b:1", family=CLONES_WITH_TRANSCRIPT_ONLY)
    assert code == 2 and "does not speak from a speaker embedding" in err and BLENDS.name in err


@pytest.mark.parametrize("parts, reason", [
    (["a:0", "b:1"], "weights must be positive"),
    (["a:-0.3", "b:1.3"], "weights must be positive"),
    (["a:inf", "b:1"], "weights must be positive"),
    (["a:nan", "b:1"], "weights must be positive"),
    (["a:x", "b:1"], "not a number"),
    (["a", "b:1"], "is not NAME:WEIGHT"),
    (["a:0.5", "A:0.5"], "named twice"),
])
def test_blend_weights_that_are_not_positive_numbers_are_exit_2_with_the_reason(tmp_path, capsys, parts, reason):
    code, _, err = blend(capsys, tmp_path, *parts)
    assert code == 2 and reason in err, err


def test_blend_weights_that_are_fine_get_as_far_as_the_checkpoint(tmp_path, capsys):
    """Control for the weights test: positive weights are accepted, and the missing
    checkpoint is what stops it."""
    code, _, err = blend(capsys, tmp_path, "a:0.7", "b:0.3")
    assert code == 2 and str(NO_CHECKPOINT) in err and "weight" not in err
