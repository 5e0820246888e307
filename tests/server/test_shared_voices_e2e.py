"""Two fronts over one real tritonserver, given one voices directory (what two front pods on
a ReadWriteMany volume are): a voice uploaded on front A is spoken by name on front B, a
delete on A is a 404 on B within a second, and two simultaneous uploads of one name, one to
each front, land one voice (one success, one 409); `tritontts-voice precompute` writes the
features file the server stores for an upload of the same recording, byte for byte, and a
voice it writes into the shared directory is spoken by both fronts. cosyvoice3 on its tiny
random checkpoint is the cloning family; one server start for the module."""
from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from tritontts.families import FAMILIES
from tritontts.testing.audio import decode, rms
from tritontts.testing.stack import REPO, Front

FAMILY = "cosyvoice3"
REFERENCE_TEXT = "This is the reference voice."


def reference_wav() -> bytes:
    return base64.b64decode(FAMILIES[FAMILY].example_params()["ref_audio"])


def precompute(voices, name: str, audio, checkpoint) -> subprocess.CompletedProcess:
    """tritontts-voice precompute (its entry point, frontend.voice_cli:main, run as a module
    so that this checkout's code runs whatever the environment has installed)."""
    return subprocess.run(
        [sys.executable, "-m", "frontend.voice_cli", "precompute", "--family", FAMILY,
         "--checkpoint", str(checkpoint), "--voices-dir", str(voices), "--name", name,
         "--audio", str(audio), "--consent", "rec-cli", "--ref-text", REFERENCE_TEXT],
        cwd=REPO, capture_output=True, text=True, timeout=600)


# The family's pooled server (shared with its other end-to-end modules: no extra start);
# its front keeps voices in <its folder>/voices, which the second front is given too.
STACK_FAMILIES = (FAMILY,)


@pytest.fixture(scope="module")
def fronts(stack, tmp_path_factory):
    """(front A's URL, front B's URL, the shared voices directory)."""
    voices = stack.log.parent / "voices"
    second = Front(stack, (FAMILY,), tmp_path_factory.mktemp("shared-voices-b") / "front.log",
                   ("--voices-dir", str(voices)))
    try:
        second.start()
        yield stack.url, second.url, voices
    finally:
        assert second.stop() == 0, second.log.read_text()[-4000:]


def upload(url: str, name: str, consent: str = "rec-1") -> httpx.Response:
    return httpx.post(url + "/v1/audio/voices", timeout=300,
                      data={"name": name, "consent": consent, "ref_text": REFERENCE_TEXT},
                      files={"audio_sample": ("reference.wav", reference_wav(), "audio/wav")})


def speak(url: str, voice: str) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", timeout=300,
                      json={"model": FAMILY, "input": "Hello there, friend.", "voice": voice,
                            "response_format": "wav", "seed": 5})


def test_a_voice_uploaded_on_one_front_speaks_on_the_other_and_a_delete_there_is_404_here_within_a_second(fronts):
    a, b, voices = fronts
    r = upload(a, "Shared")
    assert r.status_code == 200, r.text
    assert "Shared" in [v["name"] for v in httpx.get(b + "/v1/audio/voices").json()["uploaded_voices"]]
    spoken = speak(b, "shared")
    assert spoken.status_code == 200, spoken.text
    audio, rate = decode(spoken.content)
    assert rate == FAMILIES[FAMILY].capabilities.sample_rate
    assert audio.size / rate > 0 and np.isfinite(audio).all() and rms(audio) > 0   # not silent
    # the same voice on both fronts: the same seeded request gives the same audio
    assert speak(a, "Shared").content == spoken.content

    assert httpx.delete(a + "/v1/audio/voices/Shared").status_code == 200
    deleted_at = time.monotonic()
    on_b = httpx.delete(b + "/v1/audio/voices/Shared")
    elapsed = time.monotonic() - deleted_at
    assert on_b.status_code == 404 and elapsed < 1.0, (on_b.status_code, elapsed, on_b.text)
    assert "Shared" not in [v["name"] for v in httpx.get(b + "/v1/audio/voices").json()["uploaded_voices"]]
    gone = speak(b, "Shared")           # the name is nobody now: cloning asks for a reference
    assert gone.status_code == 400, gone.text
    assert not (voices / "shared").exists()


def test_one_name_uploaded_to_both_fronts_at_once_is_one_success_and_one_409(fronts):
    a, b, voices = fronts
    answers: dict[str, httpx.Response] = {}
    start = threading.Barrier(2)

    def post(key: str, url: str):
        start.wait()
        answers[key] = upload(url, "Twice", consent=f"rec-{key}")

    threads = [threading.Thread(target=post, args=item) for item in (("A", a), ("B", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    statuses = sorted(r.status_code for r in answers.values())
    assert statuses == [200, 409], {k: r.text for k, r in answers.items()}
    winner = next(k for k, r in answers.items() if r.status_code == 200)
    for url in (a, b):
        listed = {v["name"]: v for v in httpx.get(url + "/v1/audio/voices").json()["uploaded_voices"]}
        assert listed["Twice"]["consent"] == f"rec-{winner}"
    # one folder for the name, whole: the winner's metadata beside its own reference
    assert [p.name for p in voices.iterdir() if p.name.casefold() == "twice"] == ["twice"]
    assert f"rec-{winner}" in (voices / "twice" / "voice.json").read_text()
    assert speak(b, "Twice").status_code == 200
    assert httpx.delete(b + "/v1/audio/voices/Twice").status_code == 200


def test_precompute_writes_the_features_the_server_stores_byte_for_byte_and_a_voice_it_writes_is_spoken(
        fronts, random_checkpoints, tmp_path):
    a, b, voices = fronts
    checkpoint = random_checkpoints.get(FAMILY)         # the one the server serves
    audio = tmp_path / "reference.wav"
    audio.write_bytes(reference_wav())
    r = upload(a, "Uploaded")
    assert r.status_code == 200, r.text
    done = precompute(tmp_path / "offline", "Uploaded", audio, checkpoint)
    assert done.returncode == 0, done.stderr
    features = f"features/{FAMILY}.safetensors"
    served = (voices / "uploaded" / features).read_bytes()
    assert (tmp_path / "offline" / "uploaded" / features).read_bytes() == served
    assert (tmp_path / "offline" / "uploaded" / "reference.wav").read_bytes() == reference_wav()

    # Written straight into the shared directory: no upload, no restart, both fronts speak it.
    done = precompute(voices, "Offline", audio, checkpoint)
    assert done.returncode == 0, done.stderr
    assert "Offline" in [v["name"] for v in httpx.get(b + "/v1/audio/voices").json()["uploaded_voices"]]
    spoken = speak(b, "offline")
    assert spoken.status_code == 200, spoken.text
    audio_out, rate = decode(spoken.content)
    assert rate == FAMILIES[FAMILY].capabilities.sample_rate and rms(audio_out) > 0
    # One set of features: the seeded request speaks the same audio as the uploaded voice.
    assert speak(a, "Offline").content == spoken.content == speak(b, "Uploaded").content
    # A name the server already holds is refused offline too (exit 2, saying how to free it).
    again = precompute(voices, "offline", audio, checkpoint)
    assert again.returncode == 2 and "exists" in again.stderr, again.stderr
    for name in ("Offline", "Uploaded"):
        assert httpx.delete(f"{a}/v1/audio/voices/{name}").status_code == 200
