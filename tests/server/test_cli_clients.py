"""The console scripts tritontts-speak and tritontts-batch, as installed in the venv, run
from a new user's shell against the real front: files, stdout, streaming, WebSocket from
standard input, a local reference sent as a data URL, batch files + summary, and errors
that say what to fix."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

from tritontts.client.common import data_url
from tritontts.testing.audio import decode, rms
from tritontts.testing.stack import new_user_environment

STACK_FAMILIES = ("piper",)
BIN = Path(sys.executable).parent


def run(stack, tmp_path, script: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / script), "--url", stack.url, *args], input=stdin.encode(),
                          capture_output=True, cwd=tmp_path, timeout=300,
                          env=new_user_environment(tmp_path / "caches"))


def spoken(data: bytes) -> tuple[float, int]:
    audio, rate = decode(data)
    assert rms(audio) > 0.02
    return audio.size / rate, rate


def test_speak_writes_the_file_and_the_same_seed_to_stdout_gives_the_same_bytes(stack, tmp_path):
    done = run(stack, tmp_path, "tritontts-speak", "Hello from the command line.", "-o", "hi.wav",
               "--seed", "3")
    assert done.returncode == 0, done.stderr.decode()
    seconds, rate = spoken((tmp_path / "hi.wav").read_bytes())
    assert rate == 22050 and seconds > 1.0
    assert b"hi.wav:" in done.stderr and b"first audio after" in done.stderr
    piped = run(stack, tmp_path, "tritontts-speak", "-o", "-", "--format", "wav", "--seed", "3",
                "--stream", stdin="Hello from the command line.")
    assert piped.returncode == 0, piped.stderr.decode()
    # A streamed WAV's header cannot know the length (0xFFFFFFFF); the samples are equal.
    assert piped.stdout[:4] == b"RIFF" and piped.stdout[4:8] == b"\xff" * 4
    streamed, whole = decode(piped.stdout)[0], decode((tmp_path / "hi.wav").read_bytes())[0]
    assert streamed.size == whole.size and np.array_equal(streamed, whole)


def test_speak_format_follows_the_extension_and_errors_name_the_field(stack, tmp_path):
    done = run(stack, tmp_path, "tritontts-speak", "An mp3 this time.", "-o", "x.mp3")
    assert done.returncode == 0, done.stderr.decode()
    assert spoken((tmp_path / "x.mp3").read_bytes())[0] > 0.5
    bad = run(stack, tmp_path, "tritontts-speak", "Too fast.", "-o", "y.wav", "--speed", "99")
    assert bad.returncode == 1 and not (tmp_path / "y.wav").exists()
    assert b"HTTP 400 (speed)" in bad.stderr, bad.stderr


def test_speak_sends_an_instruction_only_request_with_empty_text(stack, tmp_path):
    """`tritontts-speak "" --instructions ...` sends input "" with the instructions (an AuK
    edit or sound); the served family's own answer comes back (Piper takes no instructions);
    without instructions an empty text is refused before any request."""
    sent = run(stack, tmp_path, "tritontts-speak", "", "--instructions", "Rain falls.", "-o", "r.wav")
    assert sent.returncode == 1 and b"HTTP 400 (instructions)" in sent.stderr, sent.stderr
    empty = run(stack, tmp_path, "tritontts-speak", "", "-o", "e.wav")
    assert empty.returncode == 2 and b"no text to speak" in empty.stderr, empty.stderr


def test_speak_sends_a_local_reference_as_a_data_url(stack, tmp_path):
    """Piper does not clone, so the front must refuse the reference by name: proof that
    it arrived as a readable recording, not that it was ignored."""
    sf.write(tmp_path / "me.wav", 0.1 * np.sin(np.arange(24000) / 10), 24000)
    url = data_url(tmp_path / "me.wav")
    assert url.startswith("data:audio/wav;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == (tmp_path / "me.wav").read_bytes()
    done = run(stack, tmp_path, "tritontts-speak", "Clone me.", "-o", "c.wav",
               "--ref-audio", "me.wav", "--ref-text", "A tone.")
    assert done.returncode == 1 and b"HTTP 400" in done.stderr and b"ref_audio" in done.stderr
    missing = run(stack, tmp_path, "tritontts-speak", "x", "--ref-audio", "nope.wav")
    assert missing.returncode != 0 and b"--ref-audio nope.wav" in missing.stderr


def test_speak_over_websocket_speaks_stdin_line_by_line(stack, tmp_path):
    done = run(stack, tmp_path, "tritontts-speak", "--ws", "-o", "live.wav",
               stdin="The first sentence arrives. Then a second\none, on the next line.\n")
    assert done.returncode == 0, done.stderr.decode()
    assert b"[0] The first sentence arrives." in done.stderr
    assert b"[1] Then a second" in done.stderr
    seconds, rate = spoken((tmp_path / "live.wav").read_bytes())
    assert rate == 22050 and seconds > 2.0


def test_batch_writes_one_file_per_line_and_a_summary(stack, tmp_path):
    (tmp_path / "lines.txt").write_text("First line to speak.\n\nSecond line.\nThird and last.\n")
    done = run(stack, tmp_path, "tritontts-batch", "lines.txt", "--out-dir", "out",
               "--concurrency", "2", "--format", "flac")
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["lines"], summary["ok"], summary["failed"]) == (3, 3, 0)
    assert [item["line"] for item in summary["items"]] == [1, 3, 4]
    for item in summary["items"]:
        assert item["status"] == 200 and item["file"] == f"{item['line']:04d}.flac"
        assert spoken((tmp_path / "out" / item["file"]).read_bytes())[0] > 0.5
    assert b"3/3 lines spoken" in done.stderr


def test_batch_reports_failed_lines_and_exits_1(stack, tmp_path):
    (tmp_path / "lines.txt").write_text("Fine.\nAlso fine.\n")
    done = run(stack, tmp_path, "tritontts-batch", "lines.txt", "--out-dir", "out",
               "--extra", '{"speed": 99}')
    assert done.returncode == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["failed"] == 2 and all("HTTP 400 (speed)" in i["error"] for i in summary["items"])
    assert b"failed lines: [1, 2]" in done.stderr
