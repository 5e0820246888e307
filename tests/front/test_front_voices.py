"""Uploaded voices against a scripted Triton: stored once with the features every cloning
model computed, listed, used by name, kept across restarts, deleted."""
from __future__ import annotations

import base64
import json
import os
import time

import pytest
from fake_triton import FakeTritonClient
from starlette.testclient import TestClient

from frontend.app import create_app
from frontend.triton_client import StageRejected
from tritontts.testing.bad_requests import wav
from tritontts.voice import VOICE_FEATURES


def front(voices_dir, families=("piper", "cosyvoice3"), fake=None, **options):
    fake = fake or FakeTritonClient()
    return TestClient(create_app("fake:0", list(families), client=fake, voices_dir=voices_dir,
                                 **options)), fake


def upload(client, name="Alice", **data):
    return client.post("/v1/audio/voices", data={"name": name, "consent": "rec-1",
                                                  "ref_text": "The reference voice.", **data},
                       files={"audio_sample": ("alice.wav", wav(2.0), "audio/wav")})


def test_upload_computes_features_once_per_cloning_model_and_lists_the_voice(tmp_path):
    client, fake = front(tmp_path)
    with client:
        r = upload(client)
        listing = client.get("/v1/audio/voices").json()
    assert r.status_code == 200 and r.json()["voice"]["families"] == ["cosyvoice3"]
    assert [e["model"] for e in fake.encoded] == ["cosyvoice3_prompt"]
    assert fake.encoded[0]["params"]["ref_text"] == "The reference voice."
    assert base64.b64decode(fake.encoded[0]["params"]["ref_audio"]) == wav(2.0)
    assert "Alice" in listing["voices"] and "joe" in listing["voices"]
    entry = next(d for d in listing["data"] if d["name"] == "Alice")
    assert (entry["family"], entry["kind"]) == ("cosyvoice3", "uploaded") and entry["created"] > 0
    assert listing["uploaded_voices"][0]["name"] == "Alice"


@pytest.mark.parametrize("voice", ["Alice", "alice", "ALICE", {"id": "alice"}])
def test_a_request_naming_the_voice_sends_its_stored_features_in_place_of_the_reference(tmp_path, voice):
    client, fake = front(tmp_path)
    with client:
        upload(client)
        r = client.post("/v1/audio/speech", json={"model": "cosyvoice3", "input": "Hi.", "voice": voice})
    assert r.status_code == 200
    params = fake.calls[0]["params"]
    assert fake.calls[0]["voice"] == "default" and "ref_audio" not in params
    assert base64.b64decode(params[VOICE_FEATURES]).startswith(b"features of cosyvoice3_prompt")
    assert len(fake.encoded) == 1, "the reference was encoded again"


def test_voices_survive_a_restart_and_are_not_encoded_again(tmp_path):
    client, fake = front(tmp_path)
    with client:
        upload(client)
    client, fake = front(tmp_path)
    with client:
        assert [v["name"] for v in client.get("/v1/audio/voices").json()["uploaded_voices"]] == ["Alice"]
        r = client.post("/v1/audio/speech", json={"model": "cosyvoice3", "input": "Hi.", "voice": "alice"})
    assert r.status_code == 200 and fake.encoded == []
    assert VOICE_FEATURES in fake.calls[0]["params"]


def test_a_model_served_after_the_upload_encodes_the_kept_recording_on_first_use(tmp_path):
    client, _ = front(tmp_path)
    with client:
        upload(client)
    client, fake = front(tmp_path, ("piper", "cosyvoice3", "cosyvoice3-big"))
    with client:
        r = client.post("/v1/audio/speech", json={"model": "cosyvoice3-big", "input": "Hi.", "voice": "Alice"})
        again = client.post("/v1/audio/speech", json={"model": "cosyvoice3-big", "input": "Hi.", "voice": "Alice"})
    assert r.status_code == again.status_code == 200
    assert [e["model"] for e in fake.encoded] == ["cosyvoice3-big_prompt"]
    assert sorted(client.get("/v1/audio/voices").json()["uploaded_voices"][0]["models"]) == [
        "cosyvoice3", "cosyvoice3-big"]


def test_a_crash_mid_write_leaves_no_half_voice_and_its_stale_leftover_is_swept_at_start(tmp_path):
    (tmp_path / ".tmp-abc").mkdir()
    (tmp_path / ".tmp-abc" / "voice.json").write_text(json.dumps({"name": "abc", "consent": "x",
                                                                  "created": 1}))
    hour_ago = time.time() - 3600
    os.utime(tmp_path / ".tmp-abc", (hour_ago, hour_ago))
    client, _ = front(tmp_path)
    with client:
        assert client.get("/v1/audio/voices").json()["uploaded_voices"] == []
    assert not (tmp_path / ".tmp-abc").exists()


def test_duplicate_name_is_409_and_delete_frees_it(tmp_path):
    client, _ = front(tmp_path)
    with client:
        assert upload(client).status_code == 200
        again = upload(client, name="ALICE")
        deleted = client.delete("/v1/audio/voices/alice")
        gone = client.post("/v1/audio/speech", json={"model": "cosyvoice3", "input": "Hi.", "voice": "Alice"})
        reupload = upload(client)
    assert again.status_code == 409 and "delete it first" in again.json()["error"]["message"]
    assert deleted.status_code == 200 and deleted.json()["name"] == "Alice"
    assert reupload.status_code == 200
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())
    # Deleted, the name is nobody: cosyvoice3 asks for a reference instead.
    assert gone.status_code == 400 and "ref_audio" in gone.json()["error"]["message"]


def test_the_voice_count_is_capped(tmp_path):
    client, _ = front(tmp_path, max_voices=1)
    with client:
        upload(client, name="one")
        r = upload(client, name="two")
    assert r.status_code == 409 and "limit" in r.json()["error"]["message"]


def test_a_voice_no_served_model_can_use_is_refused_with_each_models_reason(tmp_path):
    fake = FakeTritonClient()
    fake.voice_errors["cosyvoice3_prompt"] = StageRejected("cosyvoice3 clones a voice: ref_text is required")
    client, _ = front(tmp_path, fake=fake)
    with client:
        r = upload(client)
    assert r.status_code == 400 and "ref_text is required" in r.json()["error"]["message"]
    assert list(tmp_path.iterdir()) == []


def test_an_uploaded_voice_and_a_reference_in_one_request_is_400(tmp_path):
    client, _ = front(tmp_path)
    with client:
        upload(client)
        r = client.post("/v1/audio/speech", json={"model": "cosyvoice3", "input": "Hi.", "voice": "Alice",
                                                  "ref_text": "other"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ref_text"


def test_a_piper_request_for_an_uploaded_voice_says_piper_cannot_clone(tmp_path):
    client, _ = front(tmp_path)
    with client:
        upload(client)
        r = client.post("/v1/audio/speech", json={"model": "piper", "input": "Hi.", "voice": "Alice"})
    assert r.status_code == 400 and "cannot speak uploaded voices" in r.json()["error"]["message"]


def test_precomputed_voices_are_served_read_only(tmp_path):
    client, _ = front(tmp_path / "a")
    with client:
        upload(client)
    client, fake = front(tmp_path / "b", preload_voices=[tmp_path / "a"])
    with client:
        listing = client.get("/v1/audio/voices").json()
        used = client.post("/v1/audio/speech", json={"model": "cosyvoice3", "input": "Hi.", "voice": "alice"})
        deleted = client.delete("/v1/audio/voices/Alice")
    assert listing["uploaded_voices"][0]["kind"] == "precomputed"
    assert used.status_code == 200 and fake.encoded == []
    assert deleted.status_code == 409 and "read-only" in deleted.json()["error"]["message"]


def test_voice_json_from_a_hostile_preload_cannot_point_outside_its_folder(tmp_path):
    folder = tmp_path / "pre" / "evil"
    folder.mkdir(parents=True)
    (folder / "voice.json").write_text(json.dumps({"name": "evil", "consent": "x", "created": 1,
                                                   "reference_file": "../../../etc/passwd"}))
    client, _ = front(tmp_path / "own", preload_voices=[tmp_path / "pre"])
    with client:
        assert client.get("/v1/audio/voices").json()["uploaded_voices"] == []


def test_a_precomputed_voice_encodes_for_a_new_model_once_and_keeps_it_in_memory(tmp_path):
    client, _ = front(tmp_path / "a")
    with client:
        upload(client)
    client, fake = front(tmp_path / "b", ("piper", "cosyvoice3", "cosyvoice3-big"),
                         preload_voices=[tmp_path / "a"])
    with client:
        for _ in range(2):
            r = client.post("/v1/audio/speech", json={"model": "cosyvoice3-big", "input": "Hi.", "voice": "Alice"})
            assert r.status_code == 200
    assert [e["model"] for e in fake.encoded] == ["cosyvoice3-big_prompt"]
    assert not (tmp_path / "a" / "alice" / "features" / "cosyvoice3-big.safetensors").exists()


# --- voice modes: what an upload with or without a transcript asks each model ---------------

from tritontts.families import FAMILIES  # noqa: E402

# A family with a voice mode that takes no transcript, found by its declaration.
BARE = next(f for f in FAMILIES.values() if any(not m.transcript for m in f.voice_modes))


def upload_without_transcript(client, name="Alice"):
    return client.post("/v1/audio/voices", data={"name": name, "consent": "rec-1"},
                       files={"audio_sample": ("alice.wav", wav(2.0), "audio/wav")})


def test_an_upload_without_ref_text_asks_for_the_familys_mode_without_a_transcript(tmp_path):
    client, fake = front(tmp_path, ("piper", BARE.name))
    with client:
        r = upload_without_transcript(client)
        listed = client.get("/v1/audio/voices").json()["uploaded_voices"][0]
    mode = BARE.voice_mode(False)
    assert r.status_code == 200, r.text
    assert not mode.transcript and mode.params, "the declaration under test selects its mode by params"
    assert fake.encoded[0]["params"] == {"ref_audio": base64.b64encode(wav(2.0)).decode(), **mode.params}
    assert listed["modes"] == {BARE.name: mode.name} and listed["ref_text"] is None


def test_an_upload_with_ref_text_asks_for_the_familys_mode_with_one(tmp_path):
    """Control for the test above: the transcript selects the other mode, whose request
    carries ref_text and none of the other mode's fields."""
    client, fake = front(tmp_path, ("piper", BARE.name))
    with client:
        r = upload(client)
    mode = BARE.voice_mode(True)
    assert r.status_code == 200 and r.json()["voice"]["modes"] == {BARE.name: mode.name}
    params = fake.encoded[0]["params"]
    assert params["ref_text"] == "The reference voice." and not set(BARE.voice_mode(False).params) & set(params)


def test_an_upload_without_ref_text_to_a_family_that_needs_one_is_400_asking_for_it_without_asking_triton(tmp_path):
    client, fake = front(tmp_path)          # piper and cosyvoice3
    with client:
        r = upload_without_transcript(client)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "ref_text", r.text
    assert "cosyvoice3: a transcript of the recording is required (ref_text)" in error["message"]
    assert fake.encoded == [] and list(tmp_path.iterdir()) == []


def test_without_ref_text_the_voice_is_stored_for_the_models_that_take_none_and_the_others_say_why(tmp_path):
    client, fake = front(tmp_path, ("piper", "cosyvoice3", BARE.name))
    with client:
        r = upload_without_transcript(client)
    voice = r.json()["voice"]
    assert r.status_code == 200 and voice["models"] == [BARE.name]
    assert "transcript" in voice["unusable_by"]["cosyvoice3"]
    assert [e["model"] for e in fake.encoded] == [BARE.voice_encoder]


def test_a_model_served_later_encodes_the_kept_recording_in_the_mode_it_was_stored_in(tmp_path):
    client, _ = front(tmp_path, ("piper", BARE.name))
    with client:
        upload_without_transcript(client)
    other = f"{BARE.name}-other"
    client, fake = front(tmp_path, ("piper", BARE.name, other))
    with client:
        r = client.post("/v1/audio/speech", json={"model": other, "input": "Hi.", "voice": "Alice"})
    # The scripted stage's features pass; what matters is the request it was asked.
    assert r.status_code == 200, r.text
    assert fake.encoded[0]["model"] == f"{other}_{BARE.voice_encoder[len(BARE.name) + 1:]}"
    assert fake.encoded[0]["params"] == {"ref_audio": base64.b64encode(wav(2.0)).decode(),
                                         **BARE.voice_mode(False).params}
