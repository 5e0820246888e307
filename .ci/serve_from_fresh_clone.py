"""The README's first command, run as a newcomer runs it: a fresh clone of this checkout, the
command exactly as the README writes it (a new minimal .venv: no torch, no vLLM), then
/health, one sentence synthesized and its WAV checked (rate, duration, not silent), then
SIGTERM and a check that nothing it started is left running.

Standard library only: it runs with the system's python3, before any venv exists.
Exit 0 when all of that held; 1 with the reason otherwise.
"""
from __future__ import annotations

import array
import io
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PORT = 8091                  # the README's: the command takes no arguments
TRITON_PORTS = (8000, 8001, 8002)
READY_S = 900                # setup (pip) + tritonserver + the front
SENTENCE = "Hello there, this is the default voice."
RATE = 22050                 # Piper en_US-joe-medium


def fail(message: str) -> None:
    print(f"[serve-from-fresh-clone] FAILED: {message}", flush=True)
    sys.exit(1)


def readme_first_command() -> str:
    """The first line of the README's first bash block, without its comment."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    if block is None:
        fail("README.md has no ```bash block")
    return block.group(1).splitlines()[0].split("#")[0].strip()


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def get(path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def processes_under(folder: Path) -> list[str]:
    """Processes whose command line or working directory is inside `folder`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if str(folder) in cmdline or cwd.startswith(str(folder)):
            found.append(f"{proc.name}: {cmdline.strip()[:160]}")
    return found


def check_wav(body: bytes) -> str:
    with wave.open(io.BytesIO(body)) as w:
        rate, frames, width = w.getframerate(), w.getnframes(), w.getsampwidth()
        samples = array.array("h", w.readframes(frames)) if width == 2 else None
    if rate != RATE:
        fail(f"WAV at {rate} Hz, expected {RATE}")
    if samples is None:
        fail(f"WAV of {8 * width}-bit samples, expected 16-bit")
    seconds = frames / rate
    if not 1.0 <= seconds <= 10.0:
        fail(f"{seconds:.2f} s of audio for {len(SENTENCE.split())} words")
    rms = math.sqrt(sum(s * s for s in samples) / max(len(samples), 1)) / 32768
    if rms < 0.01:
        fail(f"silent audio (RMS {rms:.4f})")
    return f"{rate} Hz, {seconds:.2f} s, RMS {rms:.3f}"


def main() -> None:
    command = readme_first_command()
    if command != "bash scripts/serve.sh":
        fail(f"the README's first command is {command!r}; this check knows how to judge "
             "'bash scripts/serve.sh'")
    busy = [p for p in (PORT, *TRITON_PORTS) if not port_free(p)]
    if busy:
        fail(f"ports {busy} are taken before the start: stop what serves them")
    work = Path(tempfile.mkdtemp(prefix="tritontts-fresh-clone-"))
    clone = work / "tritontts"
    log = work / "serve.log"
    server = None
    try:
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
        started = time.monotonic()
        with log.open("wb") as out:
            server = subprocess.Popen(command.split(), cwd=clone, stdout=out, stderr=subprocess.STDOUT,
                                      env=dict(os.environ), start_new_session=True)
        while True:
            if server.poll() is not None:
                fail(f"`{command}` exited with {server.returncode} before /health answered:\n"
                     + log.read_text(errors="replace")[-4000:])
            if time.monotonic() - started > READY_S:
                fail(f"no healthy /health after {READY_S} s:\n" + log.read_text(errors="replace")[-4000:])
            try:
                status, _ = get("/health", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(1)
        ready_s = time.monotonic() - started
        request = urllib.request.Request(
            f"http://127.0.0.1:{PORT}/v1/audio/speech", method="POST",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"input": SENTENCE, "voice": "default", "response_format": "wav"}).encode())
        with urllib.request.urlopen(request, timeout=120) as reply:
            if reply.status != 200:
                fail(f"speech answered {reply.status}")
            audio = check_wav(reply.read())
        venv = clone / ".venv"
        size_mb = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6
        if (venv / "lib").exists() and any(venv.glob("lib/python3*/site-packages/torch")):
            fail("the minimal .venv has torch in it")
        print(f"[serve-from-fresh-clone] ok: `{command}` healthy after {ready_s:.0f} s "
              f"(fresh .venv {size_mb:.0f} MB, no torch); one sentence: {audio}", flush=True)
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)   # the front stops, then its tritonserver
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
                print("[serve-from-fresh-clone] FAILED: still running 60 s after SIGTERM", flush=True)
                sys.exit(1)
        deadline = time.monotonic() + 30
        while (left := processes_under(clone)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if left:
            for line in left:
                pid = int(line.split(":")[0])
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            fail("left running after the server stopped:\n" + "\n".join(left))
        busy = [p for p in (PORT, *TRITON_PORTS) if not port_free(p)]
        if busy:
            fail(f"ports {busy} still taken after the server stopped")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
