"""A real tritonserver + OpenAI front, started through the launcher users run
(`python -m frontend`), from a new user's environment; and a pool that keeps one such stack
alive at a time, restarting it only when the families wanted change."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import httpx

from ..deploy.tritonserver import ProcessCpu
from ..families import DEFAULT_FAMILY

REPO = Path(__file__).resolve().parents[2]


_handed_out: set[int] = set()
# The share of the ports below the ephemeral range this process draws from: (index, count).
# Test processes run side by side (pytest-xdist workers, tests/conftest.py) each take their
# own slice, so two of them never draw the same port between its check and a server's bind.
_port_slice = (0, 1)


def set_port_slice(index: int, count: int) -> None:
    """Draw free_port()'s ports from slice `index` of `count` equal slices only."""
    global _port_slice
    if not 0 <= index < count:
        raise ValueError(f"port slice {index} of {count}")
    _port_slice = (index, count)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768        # Linux's default


def free_port() -> int:
    """A TCP port nothing listens on, on any address (tritonserver binds 0.0.0.0), drawn
    from below the kernel's ephemeral range (this process's slice of it, set_port_slice) and
    never the same twice in this process. A port the kernel itself handed out (bind to port
    0) sits inside that range, where any process's next outgoing connection or port-0 bind
    can take it before the server binds it: a CI run lost a stack start that way (a vLLM
    engine core of the stopping server, or of the new one, took the gRPC port between the
    check and tritonserver's bind)."""
    index, count = _port_slice
    low_end = _ephemeral_low()
    width = (low_end - 10000) // count
    if width > 1000:
        low = 10000 + index * width
        rng = random.Random()
        for _ in range(200):
            port = rng.randrange(low, low + width)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:          # no room below the range: the kernel's choice
        s.bind(("", 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port


def new_user_environment(caches: Path) -> dict[str, str]:
    """The environment of a new user's login shell: no venv activated, only system
    directories on PATH, nothing Python-specific inherited, and caches that start empty
    (vLLM caches its model inspection across runs, which once hid a broken PATH). No VLLM_*
    variable either: an in-process test engine sets VLLM_ENABLE_V1_MULTIPROCESSING=0 in the
    test process, and servers started after it inherited it, so whether their talkers ran
    vLLM's engine core in a child process depended on the order tests ran in."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")
           and not k.startswith("VLLM_")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env["XDG_CACHE_HOME"] = str(caches)
    env["VLLM_CACHE_ROOT"] = str(caches / "vllm")
    env["TRITONTTS_CACHE"] = str(caches / "tritontts")
    return env


# vLLM's own architectures among the talkers (CosyVoice3's converted talker is a Qwen2,
# GLM-TTS's a Llama); the others are the families' own (tritontts/families/<family>/vllm_model.py).
BUILTIN_TALKER_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")

# What vLLM's inspection child does for one architecture (`python3 -m
# vllm.model_executor.models.registry`), here for all of them in one process: vLLM's own
# code hashes each model's module, inspects its class and writes the result to the cache.
INSPECT_TALKERS = """
import sys
from importlib import import_module

import vllm.model_executor.models.registry as registry
from vllm import ModelRegistry

registry._run_in_subprocess = lambda inspect: inspect()     # this process is that child
architectures, failed = sys.argv[1].split(","), []
for name in sys.argv[2].split(","):
    try:
        module = import_module(name)
        module.register()
        architectures.append(module.ARCHITECTURE)
    except Exception as exc:
        failed.append(f"{name}: {exc!r}")
for architecture in architectures:
    try:
        ModelRegistry.models[architecture].inspect_model_cls()
    except Exception as exc:
        failed.append(f"{architecture}: {exc!r}")
sys.exit("; ".join(failed) or None)
"""


def inspect_talker_models(caches: Path) -> bool:
    """vLLM's inspection of every talker's model class, written once to the servers' vLLM
    cache (`caches`/vllm/modelinfos), where each server's talker finds it. Left to the
    servers, the first talker of each architecture in a run inspects it in a child of its
    own that imports vLLM afresh: 9-13 s each, here done in one process. It runs as that
    child would, by `python3` on the servers' PATH in their environment. Best effort (False
    if it failed): whatever is not cached, a server inspects itself, failing as it would."""
    from importlib.util import find_spec

    from ..families import FAMILIES
    from ..deploy.tritonserver import triton_env

    modules = [f"tritontts.families.{name}.vllm_model" for name in FAMILIES]
    modules = [m for m in modules if find_spec(m) is not None]
    try:
        out = subprocess.run(["python3", "-c", INSPECT_TALKERS, ",".join(BUILTIN_TALKER_ARCHITECTURES),
                              ",".join(modules)], cwd=REPO, env=triton_env(base=new_user_environment(caches)),
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        warnings.warn("the talkers' model inspection timed out: each server inspects its own")
        return False
    if out.returncode != 0:
        warnings.warn(f"the talkers' model inspection failed (each server inspects its own): "
                      f"{out.stderr[-2000:]}")
    return out.returncode == 0


# A server of tiny random checkpoints sizes every vLLM stage's KV cache (from its config,
# tritontts.engine.kv_budget) for TINY_KV_REQUESTS full-length requests, the largest
# max_num_seqs of any stage: vLLM never has to preempt a request, whatever a test sends at
# once. A tiny talker's KV is a few KiB per position, so that is a few MiB.
TINY_KV_REQUESTS = 16


def tiny_engine_args(families: tuple[str, ...]) -> tuple[str, ...]:
    """The launcher's flags for a server of tiny checkpoints of `families`: KV for
    TINY_KV_REQUESTS, and word timestamps (every family's ensemble ends with the word
    aligner, so every pooled test runs through it; the servers tests start themselves, the
    launcher's and restart tests, run without)."""
    return ("--kv-requests", str(TINY_KV_REQUESTS), "--word-aligner")


def engine_processes(session: int | None = None) -> set[int]:
    """tritonserver and vLLM engine-core processes alive now; with `session`, only those of
    that session (a tritonserver starts its own, and its stubs and engine cores stay in it
    even once orphaned: another test run's servers on the machine are not counted)."""
    out = subprocess.run(["pgrep", "-f", "VLLM::EngineCore|tritonserver --backend"],
                         capture_output=True, text=True)
    pids = {int(pid) for pid in out.stdout.split()}
    if session is None:
        return pids
    mine = set()
    for pid in pids:
        try:
            if os.getsid(pid) == session:
                mine.add(pid)
        except OSError:
            continue        # ended meanwhile
    return mine



def wait_healthy(proc: subprocess.Popen, url: str, timeout: float, tail: Callable[[], str],
                 what: str = "front") -> None:
    """Until `url`/health answers 200; RuntimeError if `proc` exits first, TimeoutError
    after `timeout` s (each with `tail()`, its log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}:\n{tail()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(tail())

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
        self.take_ports()
        self.log = tmp / "stack.log"
        self.triton_log = tmp / "triton.log"
        self.proc: subprocess.Popen | None = None
        self.terminated = False
        self.at_stop: set[int] = set()
        self.session: int | None = None
        self._cpu = ProcessCpu()

    def take_ports(self) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        self.http_port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_url = f"localhost:{self.grpc_port}"

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
        # A port taken by another process between free_port() and the server's bind (free_port
        # makes that rare, not impossible) ends the launch at once: once more on new ports.
        for attempt in (1, 2):
            self.terminated = False
            self.proc = subprocess.Popen(self.command(), cwd=self.checkout,
                                         stdout=open(self.log, "wb" if attempt == 1 else "ab"),
                                         stderr=subprocess.STDOUT, env=self.env)
            try:
                wait_healthy(self.proc, self.url, timeout, self.tail, "launcher")
                return self
            except RuntimeError as exc:
                if attempt == 2 or "already in use" not in str(exc):
                    raise
                warnings.warn(f"a port of this stack was taken before the server bound it; "
                              f"starting again on new ports (was {self.command()})")
                self.take_ports()
        raise AssertionError("unreachable")

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
        stage stubs, each talker's with its vLLM engine), never less than before (the
        launcher's own reader, ProcessCpu)."""
        server = self.tritonserver_pid()
        out = subprocess.run(["pgrep", "-g", str(server)], capture_output=True, text=True)
        return self._cpu.read({server} | {int(pid) for pid in out.stdout.split()})

    def terminate(self) -> None:
        """Ask the launcher to stop (once: a second SIGTERM would cut its shutdown short),
        noting the engine processes alive then (StackPool's check)."""
        if self.proc and not self.terminated:
            try:
                self.session = self.tritonserver_pid()      # the session it leads
            except RuntimeError:
                self.session = None                         # none of its own (--triton-url)
            self.at_stop = engine_processes(self.session)
            if self.proc.poll() is None:
                self.proc.terminate()
            self.terminated = True

    def stop(self) -> int:
        self.terminate()
        if self.proc:
            self.proc.wait(60)
        return self.proc.returncode if self.proc else 0

    def abandon(self) -> None:
        """Stop a stack whose start failed, whatever state it is in: asked to stop first,
        then the launcher and the server's whole session killed if either is still there
        after 60 s. A failed start left running would hold its cores and memory under every
        later server (a CI run once had three such starts pile up)."""
        self.terminate()
        if self.proc is None:
            return
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.session is not None:
            try:
                os.killpg(self.session, 9)
            except OSError:
                pass        # the session ended with its launcher


class Front:
    """Another `python -m frontend --triton-url` on a running stack's tritonserver, on its own
    port, with its own front arguments (e.g. another voices directory, media hosts): a second
    front pod, or one that is restarted while the server stays up."""

    def __init__(self, stack: Stack, families: tuple[str, ...], log: Path, extra_args: tuple[str, ...] = ()):
        self.stack, self.families, self.log, self.extra_args = stack, tuple(families), log, extra_args
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 120) -> "Front":
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [self.stack.python, "-m", "frontend", "--host", "127.0.0.1", "--port", str(port),
             "--triton-url", self.stack.grpc_url, "--families", ",".join(self.families), *self.extra_args],
            cwd=self.stack.checkout, env=self.stack.env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        wait_healthy(self.proc, self.url, timeout, lambda: self.log.read_text()[-4000:], "front")
        return self

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)

    def restart(self) -> "Front":
        code = self.stop()
        if code != 0:
            raise RuntimeError(f"front exited {code}:\n{self.log.read_text()[-4000:]}")
        return self.start()


class StackPool:
    """One live stack at a time (2 cores, 24 GiB): `get(families)` reuses the live stack if
    it serves exactly those families and checkpoints, else stops it and starts one that
    does. Every stop checks that the launcher exited 0 and that the server left no process
    behind. Only a stop for the next stack overlaps: the old server's shutdown (models
    unloading, mostly waiting) runs while the next one starts, and is checked once that one
    is up; close() waits."""

    def __init__(self, tmp_factory, caches: Path, checkpoints: dict[str, Path]):
        self.tmp_factory, self.caches, self.checkpoints = tmp_factory, caches, checkpoints
        self.live: Stack | None = None
        self.started: list[tuple[str, ...]] = []
        self.failed: dict[tuple, str] = {}      # (families, checkpoints) -> why its start failed
        self.inspected = False

    def prepare(self, families: tuple[str, ...]) -> None:
        """What a server of `families` needs done once per run before it starts (servers
        the caller starts itself too): the talkers' model inspection (inspect_talker_models)."""
        from ..deploy.profiles import engine_settings_path
        from ..deploy.repository import STAGE_REPOSITORY
        from ..families import FAMILIES

        if not self.inspected and any(engine_settings_path(STAGE_REPOSITORY / s)
                                      for f in families for s in FAMILIES[f].stages):
            self.inspected = True
            inspect_talker_models(self.caches)

    def get(self, families: tuple[str, ...]) -> Stack:
        families = tuple(families)
        checkpoints = {f: self.checkpoints[f] for f in families if f in self.checkpoints}
        if self.live is not None and self.live.families == families and self.live.checkpoints == checkpoints:
            return self.live
        key = (families, tuple(sorted((f, str(p)) for f, p in checkpoints.items())))
        if key in self.failed:      # each module asking again would wait out the start again
            raise RuntimeError(f"this stack's start failed earlier in this run: {self.failed[key]}")
        old, self.live = self.live, None
        stack = None
        if old is not None:
            old.terminate()
        try:
            self.prepare(families)
            stack = Stack(self.tmp_factory.mktemp("stack-" + "-".join(families)), families,
                          checkpoints, self.caches, extra_args=tiny_engine_args(families))
            stack.before = engine_processes()
            self.live = stack.start()
        except BaseException as exc:
            self.failed[key] = f"{type(exc).__name__}: {str(exc)[-3000:]}"
            if stack is not None:
                stack.abandon()
            raise
        finally:
            if old is not None:
                self._check_stopped(old)
        self.started.append(families)
        return self.live

    def close(self) -> None:
        stack, self.live = self.live, None
        if stack is not None:
            self._check_stopped(stack)

    @staticmethod
    def _check_stopped(stack: Stack) -> None:
        """Wait for `stack` to stop: its launcher must exit 0, and no engine process that
        came up while it ran may outlive it (vLLM's engine core holds GBs of KV cache).
        Those started after it was told to stop (the next server's) are not its own."""
        code = stack.stop()
        assert code == 0, stack.tail()
        if stack.session is not None:
            leftover = engine_processes(stack.session)
        else:
            leftover = (engine_processes() & stack.at_stop) - stack.before
        assert not leftover, f"processes outlived the server: {leftover}"
