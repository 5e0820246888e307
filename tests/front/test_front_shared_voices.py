"""One voices directory shared by several fronts (a ReadWriteMany volume): what one front
uploads, deletes or computes, the others see at once, with no restart; two uploads of one
name land exactly one voice; leftovers are swept only once stale; a directory that cannot
be written is refused at start, naming it. Two VoiceStores, or two apps against a scripted
Triton, on one tmp directory stand for two fronts."""
from __future__ import annotations

import base64
import json
import os
import shutil
import threading
import time

import pytest
from fake_triton import FakeTritonClient
from test_front_voices import front, upload

import frontend.voices as voices_module
from frontend.__main__ import main
from frontend.app import create_app
from frontend.voices import STALE_TMP_S, StoredVoice, VoiceError, VoiceStore
from tritontts.voice import VOICE_FEATURES


def new_voice(name: str = "Alice", consent: str = "rec-1", ref_text: str = "The reference.") -> StoredVoice:
    return StoredVoice(name=name, consent=consent, created=int(time.time()), ref_text=ref_text)


def make_old(path) -> None:
    then = time.time() - STALE_TMP_S - 60
    os.utime(path, (then, then))


def speak(client, voice="Alice", model="cosyvoice3"):
    return client.post("/v1/audio/speech", json={"model": model, "input": "Hi.", "voice": voice})


class RecordingTriton(FakeTritonClient):
    """The scripted Triton, keeping the features it returned (and, if given, running
    `during_encode` while it encodes)."""

    def __init__(self, during_encode=None):
        super().__init__()
        self.returned: list[bytes] = []
        self.during_encode = during_encode

    async def encode_voice(self, model, params):
        if self.during_encode is not None:
            self.during_encode()
        blob = await super().encode_voice(model, params)
        self.returned.append(blob)
        return blob


# --- seen on the other front at once --------------------------------------------------------

def test_a_voice_uploaded_on_one_front_is_listed_and_spoken_on_another_started_before_it(tmp_path):
    # Negative control: a store that loads its folder only at start (the former one) lists
    # nothing on B and B's request finds no voice (400: cosyvoice3 asks for a reference).
    root = tmp_path / "voices"      # absent when both start: A's upload creates it
    a, _ = front(root)
    b, fake_b = front(root)
    with a, b:
        assert upload(a).status_code == 200
        listed = b.get("/v1/audio/voices").json()
        spoken = speak(b, "alice")
    assert [v["name"] for v in listed["uploaded_voices"]] == ["Alice"]
    assert spoken.status_code == 200 and fake_b.encoded == [], "B encoded the reference again"
    assert base64.b64decode(fake_b.calls[0]["params"][VOICE_FEATURES]).startswith(b"features of cosyvoice3_prompt")


def test_a_voice_deleted_on_one_front_is_absent_on_another_that_used_it_at_once(tmp_path):
    # Negative control: with B's cached voice trusted (no stat of its voice.json), B would
    # still speak it (200), list it, and its DELETE would fail renaming a missing folder (500).
    a, _ = front(tmp_path)
    b, _ = front(tmp_path)
    with a, b:
        upload(a)
        assert speak(b).status_code == 200            # B has it cached now
        assert a.delete("/v1/audio/voices/Alice").status_code == 200
        spoken = speak(b)
        listed = b.get("/v1/audio/voices").json()["uploaded_voices"]
        deleted = b.delete("/v1/audio/voices/Alice")
    assert spoken.status_code == 400 and "ref_audio" in spoken.json()["error"]["message"]
    assert listed == []
    assert deleted.status_code == 404 and "does not exist" in deleted.json()["error"]["message"]


def test_a_voice_another_front_uploaded_can_be_deleted_here(tmp_path):
    a, _ = front(tmp_path)
    b, _ = front(tmp_path)
    with a, b:
        upload(a)
        deleted = b.delete("/v1/audio/voices/alice")
        on_a = speak(a)
    assert deleted.status_code == 200 and deleted.json()["name"] == "Alice"
    assert on_a.status_code == 400 and not (tmp_path / "alice").exists()


def test_deleting_a_voice_another_front_deleted_between_lookup_and_rename_is_404(tmp_path, monkeypatch):
    # The lookup found it, then the other front's rename won: without the store catching
    # the failed rename, this is a FileNotFoundError (a 500).
    a, b = VoiceStore(tmp_path), VoiceStore(tmp_path)
    a.add(new_voice(), b"RIFF", "wav", {"m": b"features"})
    seen = b.get("alice")
    assert seen is not None, "B does not read A's upload through"
    a.delete("alice")
    monkeypatch.setattr(b, "get", lambda name: seen)
    with pytest.raises(VoiceError) as refused:
        b.delete("Alice")
    assert refused.value.status == 404


def test_a_voice_replaced_by_another_front_is_read_again_not_served_from_cache(tmp_path):
    # Negative control: checking only that the folder exists would keep B's old voice.
    a, b = VoiceStore(tmp_path), VoiceStore(tmp_path)
    a.add(new_voice(ref_text="first"), b"RIFF1", "wav", {"m": b"first"})
    assert b.get("alice").ref_text == "first"
    a.delete("alice")
    a.add(new_voice(ref_text="second"), b"RIFF2", "wav", {"m": b"second"})
    again = b.get("Alice")
    assert again.ref_text == "second" and b.features(again, "m") == b"second"
    assert b.reference(again) == b"RIFF2"


def test_a_lookup_by_a_name_that_is_not_a_voice_name_reads_nothing_outside_the_folder(tmp_path):
    # A read-through that joined any name onto the root would find ../outside/voice.json.
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "voice.json").write_text(json.dumps({"name": "outside", "consent": "x",
                                                                 "created": 1}))
    (tmp_path / "voices").mkdir()     # (a missing root would stop the path at once)
    store = VoiceStore(tmp_path / "voices")
    assert store.get("outside") is None
    assert store.get("../outside") is None and store.get("voices/../../outside") is None


# --- one name, two uploads at once ----------------------------------------------------------

def test_two_fronts_uploading_one_name_at_once_land_one_voice_and_the_other_gets_409(tmp_path, monkeypatch):
    # Both uploads pass check_new, then wait for each other before renaming (the barrier in
    # _fsync_tree, the last step before the rename). Negative control: the former add removed
    # an existing folder before its rename, so both answered 200 and the last one won.
    barrier = threading.Barrier(2, timeout=10)
    fsync = voices_module._fsync_tree

    def both_ready(folder):
        fsync(folder)
        barrier.wait()

    monkeypatch.setattr(voices_module, "_fsync_tree", both_ready)
    fakes = {"A": RecordingTriton(), "B": RecordingTriton()}
    clients = {k: front(tmp_path, fake=fake)[0] for k, fake in fakes.items()}
    answers = {}

    def post(k):
        answers[k] = upload(clients[k], consent=f"rec-{k}", ref_text=f"Spoken on {k}.")

    with clients["A"], clients["B"]:
        threads = [threading.Thread(target=post, args=(k,)) for k in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    statuses = sorted(r.status_code for r in answers.values())
    assert statuses == [200, 409], {k: r.text for k, r in answers.items()}
    winner = next(k for k, r in answers.items() if r.status_code == 200)
    loser = "B" if winner == "A" else "A"
    assert "exists" in answers[loser].json()["error"]["message"]
    folder = tmp_path / "alice"
    stored = json.loads((folder / "voice.json").read_text())
    assert (stored["consent"], stored["ref_text"]) == (f"rec-{winner}", f"Spoken on {winner}.")
    assert (folder / "features" / "cosyvoice3.safetensors").read_bytes() == fakes[winner].returned[0]
    assert fakes[winner].returned[0] != fakes[loser].returned[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alice"], "a temporary folder was left"
    assert sorted(p.name for p in folder.rglob("*")) == ["cosyvoice3.safetensors", "features",
                                                         "reference.wav", "voice.json"]


def test_a_folder_of_the_name_that_is_not_a_voice_is_409_naming_it_and_is_kept(tmp_path):
    # Negative control: the former add removed such a folder and uploaded over it (200).
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "notes.txt").write_text("someone's files")
    client, _ = front(tmp_path)
    with client:
        r = upload(client)
    assert r.status_code == 409
    message = r.json()["error"]["message"]
    assert "'alice'" in message and "remove that folder" in message
    assert (tmp_path / "alice" / "notes.txt").read_text() == "someone's files"
    assert str(tmp_path) not in message, "a server path reached the client"


def test_a_folder_appearing_between_check_and_rename_is_409_and_kept(tmp_path, monkeypatch):
    # Another front's upload landing there (a non-empty folder): rename must fail, not replace.
    store = VoiceStore(tmp_path)
    fsync = voices_module._fsync_tree

    def other_front_lands(folder):
        fsync(folder)
        (tmp_path / "alice").mkdir(exist_ok=True)
        (tmp_path / "alice" / "theirs").write_text("theirs")

    monkeypatch.setattr(voices_module, "_fsync_tree", other_front_lands)
    with pytest.raises(VoiceError) as refused:
        store.add(new_voice(), b"RIFF", "wav", {"m": b"mine"})
    assert refused.value.status == 409
    assert sorted(p.name for p in (tmp_path / "alice").iterdir()) == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["alice"]


# --- what is counted, swept and shared -------------------------------------------------------

def test_the_voice_cap_counts_voices_other_fronts_uploaded(tmp_path):
    # Negative control: a cap on this front's own voices would let A store a second one.
    a, b = VoiceStore(tmp_path, max_voices=1), VoiceStore(tmp_path)
    b.add(new_voice("Bob"), b"RIFF", "wav", {"m": b"features"})
    with pytest.raises(VoiceError) as refused:
        a.check_new("Carol")
    assert refused.value.status == 409 and "limit" in str(refused.value)


def test_a_stale_temporary_folder_is_swept_by_a_rescan_and_a_fresh_one_is_kept(tmp_path):
    # A fresh one may be another live front's upload being written: the former start swept
    # every leftover, so `fresh` would be gone after the second store's start.
    store = VoiceStore(tmp_path)
    store.add(new_voice(), b"RIFF", "wav", {"m": b"features"})
    stale, fresh = tmp_path / ".tmp-stale", tmp_path / ".tmp-fresh"
    for folder in (stale, fresh):
        folder.mkdir()
        (folder / "voice.json").write_text(json.dumps({"name": "Half", "consent": "x", "created": 1}))
    make_old(stale)
    stale_features = tmp_path / "alice" / "features" / ".tmp-stale"
    fresh_features = tmp_path / "alice" / "features" / ".tmp-fresh"
    stale_features.write_bytes(b"half")
    fresh_features.write_bytes(b"half")
    make_old(stale_features)
    VoiceStore(tmp_path)                            # another front starts
    assert not stale.exists() and not stale_features.exists()
    assert fresh.exists() and fresh_features.exists()
    make_old(fresh)
    assert [v.name for v in store.list()] == ["Alice"]     # never listed, now swept
    assert not fresh.exists()


def test_features_one_front_computes_later_are_read_by_another(tmp_path):
    # A serves one cloning model; B and C a second one, served after the upload. B computes
    # its features once and writes them; C must read them, not encode again.
    a, _ = front(tmp_path, ("cosyvoice3",))
    b, fake_b = front(tmp_path, ("cosyvoice3-big",))
    c, fake_c = front(tmp_path, ("cosyvoice3-big",))
    with a, b, c:
        upload(a)
        first = speak(b, model="cosyvoice3-big")
        second = speak(c, model="cosyvoice3-big")
        listed = c.get("/v1/audio/voices").json()["uploaded_voices"][0]["models"]
    assert first.status_code == second.status_code == 200
    assert [e["model"] for e in fake_b.encoded] == ["cosyvoice3-big_prompt"] and fake_c.encoded == []
    assert fake_c.calls[0]["params"][VOICE_FEATURES] == fake_b.calls[0]["params"][VOICE_FEATURES]
    assert sorted(listed) == ["cosyvoice3", "cosyvoice3-big"]


def test_features_computed_while_another_front_deletes_the_voice_are_dropped_and_the_request_answers(tmp_path):
    # The voice's folder goes while B encodes for a model served after the upload. The former
    # add_features created its temporary file in the missing folder: FileNotFoundError, a 500.
    a, _ = front(tmp_path, ("cosyvoice3",))
    b, fake_b = front(tmp_path, ("cosyvoice3-big",),
                      fake=RecordingTriton(during_encode=lambda: shutil.rmtree(tmp_path / "alice")))
    with a, b:
        upload(a)
        spoken = speak(b, model="cosyvoice3-big")
        after = speak(b, model="cosyvoice3-big")
    assert spoken.status_code == 200 and VOICE_FEATURES in fake_b.calls[0]["params"]
    assert after.status_code == 400                 # deleted: the name is nobody now
    assert not (tmp_path / "alice").exists(), "features were written into a deleted voice"


def test_add_features_into_a_folder_removed_after_its_check_does_not_raise(tmp_path, monkeypatch):
    # The folder goes between the stat and the write (the stat is made to agree): the write
    # itself fails and must be dropped, not raised.
    store = VoiceStore(tmp_path)
    voice = store.add(new_voice(), b"RIFF", "wav", {"m": b"features"})
    shutil.rmtree(tmp_path / "alice")
    monkeypatch.setattr(voices_module, "_stamp", lambda path: voice.stamp)
    store.add_features(voice, "later", b"later features")
    assert not (tmp_path / "alice").exists() and "later" not in voice.models


# --- a directory that cannot be written -------------------------------------------------------

def test_a_voices_dir_under_a_regular_file_is_refused_at_start_naming_it(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    for root in (tmp_path / "file" / "voices", tmp_path / "file"):
        with pytest.raises(VoiceError, match=str(root)):
            VoiceStore(root)
        with pytest.raises(VoiceError, match=str(root)):
            create_app("fake:0", ["piper"], client=FakeTritonClient(), voices_dir=root)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod; the regular-file and "
                    "read-only-filesystem cases refuse as root")
def test_a_voices_dir_without_write_permission_is_refused_naming_it(tmp_path):
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o500)
    try:
        for root in (tmp_path / "ro", tmp_path / "ro" / "voices"):
            with pytest.raises(VoiceError, match=str(root)):
                VoiceStore(root)
    finally:
        os.chmod(tmp_path / "ro", 0o700)


def test_a_voices_dir_on_a_read_only_filesystem_is_refused_naming_it(tmp_path, monkeypatch):
    # EROFS is what creating anything in it answers (as root too); the probe must see it.
    import errno

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(voices_module.tempfile, "mkdtemp", read_only)
    with pytest.raises(VoiceError, match=f"{tmp_path}.*not writable"):
        VoiceStore(tmp_path)


def test_a_missing_voices_dir_is_accepted_and_not_created_until_an_upload(tmp_path):
    # Kept from before: a writability check that made the folder would leave it behind.
    client, _ = front(tmp_path / "voices")
    with client:
        assert client.get("/v1/audio/voices").json()["uploaded_voices"] == []
        assert list(tmp_path.iterdir()) == []
        assert upload(client).status_code == 200
    assert (tmp_path / "voices" / "alice" / "voice.json").is_file()


def test_the_launcher_exits_2_naming_a_voices_dir_it_cannot_write_before_tritonserver_starts(
        tmp_path, capsys, monkeypatch):
    # Negative control: without the launcher's check, main goes on to start tritonserver
    # (made to fail here) and would find out only minutes later, at the store's start.
    import tritontts.deploy.tritonserver as tritonserver

    class NoServer:
        def __init__(self, *args, **kwargs):
            raise AssertionError("tritonserver was started")

    monkeypatch.setattr(tritonserver, "TritonServer", NoServer)
    (tmp_path / "file").write_text("not a folder")
    root = tmp_path / "file" / "voices"
    code = main(["--families", "piper", "--voices-dir", str(root)])
    err = capsys.readouterr().err
    assert code == 2 and str(root) in err and "--voices-dir" in err
