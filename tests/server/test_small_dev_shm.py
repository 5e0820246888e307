"""A server whose /dev/shm is small, in a mount namespace of its own (a tmpfs of a few MiB
over /dev/shm, as a container's default 64 MB is for a large model set): Triton's Python
backend gives each stage process a 1 MiB region there and grows it for large tensors
(tritontts/deploy/shared_memory.py).

- Too small to start: the launcher refuses before tritonserver starts, in one line with the
  numbers and the remedy, and nothing is left running.

Enough to start but not to grow is a warning at launch (tests/test_dev_shm_check.py); a
stage whose response then does not fit ends the request with a 503 where Triton lets it
send one (tests/test_stage_backend.py).
"""
from __future__ import annotations

import shlex
import subprocess

import pytest

from tritontts.testing.stack import Stack


def can_mount_namespaces() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = pytest.mark.skipif(not can_mount_namespaces(),
                                reason="needs root to mount a small tmpfs over /dev/shm in a mount namespace")


class SmallShmStack(Stack):
    """The launcher, and so tritonserver and its stages, see a /dev/shm of `kib` KiB."""

    def __init__(self, tmp, kib: int):
        super().__init__(tmp, ("piper",))
        self.kib = kib

    def command(self) -> list[str]:
        return ["unshare", "-m", "sh", "-c",
                f"mount -t tmpfs -o size={self.kib}k tmpfs /dev/shm && exec {shlex.join(super().command())}"]


def left_running(stack: Stack) -> list[str]:
    return subprocess.run(["pgrep", "-f", "--", f"--grpc-port={stack.grpc_port}"],
                          capture_output=True, text=True).stdout.split()


def test_a_dev_shm_too_small_to_start_the_stages_stops_the_launch_in_one_line_and_nothing_runs(tmp_path):
    stack = SmallShmStack(tmp_path, 2048)     # piper's 4 stage processes need 4 MiB to start
    try:
        with pytest.raises(RuntimeError) as failed:
            stack.start(timeout=120)
        message = str(failed.value)
        assert "launcher exited 1" in message, message[-3000:]
        line = next(line for line in stack.log.read_text().splitlines() if "/dev/shm has" in line)
        assert line.startswith("tritonserver did not start: /dev/shm has 2.0 MiB free, but the 4 stage "
                               "processes of this server need 4 MiB to start"), line
        assert "--shm-size=" in line
        assert not left_running(stack)
        assert not stack.triton_log.exists() or "Unable to initialize shared memory" not in stack.triton_log.read_text()
    finally:
        stack.stop()


def test_a_server_killed_with_its_stages_leaves_no_region_in_dev_shm_once_stopped(tmp_path):
    """Killed (SIGKILL of its process group: a crash, the out-of-memory killer), a server
    leaves its stages' regions in /dev/shm, memory nothing else frees, run after run (a CI
    run left some 60 behind). Its regions carry a prefix of its own, and stopping it removes
    what is left (the supervisor's restart and a retried start go the same way)."""
    import os
    import signal
    import time

    from tritontts.deploy.tritonserver import TritonServer
    from tritontts.serving.shared_memory import SHM_DIR
    from tritontts.testing.stack import free_port

    server = TritonServer(["piper"], free_port(), free_port(), free_port(), log_path=tmp_path / "triton.log")
    server.start().wait_ready(timeout=300)
    try:
        regions = sorted(SHM_DIR.glob(server.region_prefix + "*"))
        assert len(regions) == 4, regions          # its 4 stage processes (the cancel model's too)
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(30)
        time.sleep(0.5)
        assert all(region.exists() for region in regions)     # killed: left behind
    finally:
        server.stop()
    assert not list(SHM_DIR.glob(server.region_prefix + "*"))
