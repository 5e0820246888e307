"""A real tritonserver + OpenAI front, started through the launcher users run
(`python -m frontend`), from a new user's environment; and a pool that keeps one such stack
alive at a time, restarting it only when the families wanted change."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ..families import DEFAULT_FAMILY

REPO = Path(__file__).resolve().parents[2]


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


def engine_processes() -> set[int]:
    """tritonserver and vLLM engine-core processes alive now."""
    out = subprocess.run(["pgrep", "-f", "VLLM::EngineCore|tritonserver --backend"],
                         capture_output=True, text=True)
    return {int(pid) for pid in out.stdout.split()}


class Stack:
    """`python -m frontend` serving `families`, on free ports."""

    def __init__(self, tmp: Path, families: tuple[str, ...] = (DEFAULT_FAMILY,),
                 checkpoints: dict[str, Path] | None = None, caches: Path | None = None,
                 extra_args: tuple[str, ...] = (), checkout: Path = REPO):
        # `checkout`: another checkout of this repository (with its own .venv), e.g. a
        # baseline commit measured side by side with this one.
        self.checkout = Path(checkout)
        self.python = sys.executable if self.checkout == REPO else str(self.checkout / ".venv/bin/python")
        self.families = tuple(families)
        self.checkpoints = dict(checkpoints or {})
        self.extra_args = extra_args
        self.env = new_user_environment(caches or tmp / "caches")
        self.port, self.grpc_port = free_port(), free_port()
        self.http_port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_url = f"localhost:{self.grpc_port}"
        self.log = tmp / "stack.log"
        self.triton_log = tmp / "triton.log"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "frontend", "--host", "127.0.0.1", "--port", str(self.port),
               "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
               "--metrics-port", str(self.metrics_port), "--triton-log", str(self.triton_log),
               "--families", ",".join(self.families)]
        for family, path in self.checkpoints.items():
            cmd += ["--checkpoint", f"{family}={path}"]
        if "--voices-dir" not in self.extra_args:    # each server its own uploaded voices
            cmd += ["--voices-dir", str(self.log.parent / "voices")]
        return cmd + list(self.extra_args)

    def start(self, timeout: float = 600) -> "Stack":
        # The venv's interpreter by path from a new user's environment, as
        # `bash scripts/serve.sh` runs it: the launcher must not rely on the caller's shell.
        self.proc = subprocess.Popen(self.command(), cwd=self.checkout, stdout=open(self.log, "wb"),
                                     stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"launcher exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(self.tail())

    def tail(self, chars: int = 4000) -> str:
        triton = self.triton_log.read_text()[-chars:] if self.triton_log.exists() else ""
        return f"{self.log.read_text()[-chars:]}\n--- triton ---\n{triton}"

    def tritonserver_pid(self) -> int:
        out = subprocess.run(["pgrep", "-f", "--", f"--grpc-port={self.grpc_port}"],
                             capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split()]
        if len(pids) != 1:
            raise RuntimeError(f"expected one tritonserver on gRPC port {self.grpc_port}: {pids}")
        return pids[0]

    def server_cpu_seconds(self) -> float:
        """CPU time used so far by tritonserver and everything in its process group (the
        stage stubs, vLLM engine cores)."""
        out = subprocess.run(["pgrep", "-g", str(self.tritonserver_pid())], capture_output=True, text=True)
        total = 0
        for pid in out.stdout.split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue        # ended meanwhile
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)
        return self.proc.returncode if self.proc else 0


class StackPool:
    """One live stack at a time (2 cores, 24 GiB): `get(families)` reuses the live stack if
    it serves exactly those families, else stops it and starts one that does. Every stop
    checks that the server left no process behind."""

    def __init__(self, tmp_factory, caches: Path, checkpoints: dict[str, Path]):
        self.tmp_factory, self.caches, self.checkpoints = tmp_factory, caches, checkpoints
        self.live: Stack | None = None
        self.started: list[tuple[str, ...]] = []

    def get(self, families: tuple[str, ...]) -> Stack:
        families = tuple(families)
        if self.live is not None and self.live.families == families:
            return self.live
        self.close()
        before = engine_processes()
        stack = Stack(self.tmp_factory.mktemp("stack-" + "-".join(families)), families,
                      {f: self.checkpoints[f] for f in families if f in self.checkpoints},
                      self.caches)
        stack.before = before
        self.live = stack.start()
        self.started.append(families)
        return self.live

    def close(self) -> None:
        stack, self.live = self.live, None
        if stack is None:
            return
        code = stack.stop()
        assert code == 0, stack.tail()
        # Nothing the server started may outlive it (vLLM's engine core holds GBs of KV cache).
        leftover = engine_processes() - stack.before
        assert not leftover, f"processes outlived the server: {leftover}"
