"""Find, prepare and run the tritonserver binary that ships in the nvidia-pytriton wheel.

Facts behind this (docs/triton-on-cpu.md): the Python backend needs the stub built for
the running interpreter copied next to it; the wheel's shared libraries and the
interpreter's own libpython must come first on LD_LIBRARY_PATH; the stub imports
packages from this environment's site-packages, and our code from the repository root;
and everything the stub starts (vLLM's model inspection child, the stub's own idea of
which interpreter it is) comes from PATH, so this environment's bin goes first there.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path

from ..serving.cancellation import CANCEL_DIR_ENV, CANCEL_MODEL
from ..serving.stage import STAGE_THREAD_ENV

logger = logging.getLogger("tritontts.deploy.tritonserver")

REPO_ROOT = Path(__file__).resolve().parents[2]
STAGE_REPOSITORY = REPO_ROOT / "model_repository"
ENSEMBLE_REPOSITORY = REPO_ROOT / "ensembles"
MODEL_REPOSITORIES = (STAGE_REPOSITORY, ENSEMBLE_REPOSITORY)


def pytriton_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed: run scripts/setup.sh")
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


BACKEND_NAME = "tritontts"
BACKEND_SOURCE = Path(__file__).resolve().parents[1] / "serving" / "triton_backend"


def prepare_python_backend() -> Path:
    """The backend directory tritonserver needs, made ready (idempotent): the stub for this
    Python version beside libtriton_python.so, and our Python-based backend (`tritontts`,
    the stage host every stage model names) linked in beside it."""
    root = pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    target = root / "backends" / "python" / "triton_python_backend_stub"
    if not stub.is_file():
        raise RuntimeError(f"no Triton Python backend stub for Python {version} in {stub.parent}")
    if not target.is_file() or target.stat().st_size != stub.stat().st_size:
        shutil.copy2(stub, target)
    target.chmod(0o755)
    link = root / "backends" / BACKEND_NAME
    if not (link.is_symlink() and link.resolve() == BACKEND_SOURCE):
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)
        link.symlink_to(BACKEND_SOURCE, target_is_directory=True)
    return root / "backends"


def base_command() -> list[str]:
    """The tritonserver binary with the Python backend this environment prepared."""
    return [str(pytriton_root() / "bin" / "tritonserver"),
            f"--backend-directory={prepare_python_backend()}"]


# Variables from the caller's shell that would point the stub, or the Python children it
# starts, at another interpreter's installation.
FOREIGN_PYTHON_VARIABLES = ("PYTHONHOME", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONEXECUTABLE",
                            "__PYVENV_LAUNCHER__", "CONDA_PREFIX")


def environment_bin() -> Path:
    """The bin folder of this environment: where `python3` is this interpreter (the venv's
    bin, not the base interpreter's; sys.executable is not resolved through links)."""
    return Path(sys.executable).parent


def triton_env(extra: dict[str, str] | None = None,
               base: dict[str, str] | None = None) -> dict[str, str]:
    """tritonserver's environment: the caller's, made to point at this environment only.

    Whatever the caller's shell holds (no venv activated, only system directories on PATH,
    another interpreter's PYTHONHOME), the stub and every process it starts see this
    interpreter first: vLLM inspects model classes in a `python3 -m ...` child found on
    PATH, and the stub derives its prefix (its standard library) from the `python3` on PATH.
    """
    root = pytriton_root()
    libs = root.parent.parent / "nvidia_pytriton.libs"
    libdir = sysconfig.get_config_var("LIBDIR")
    env = dict(os.environ if base is None else base)
    for name in FOREIGN_PYTHON_VARIABLES:
        env.pop(name, None)
    bin_dir = str(environment_bin())
    env["PATH"] = os.pathsep.join(
        [bin_dir, *(p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != bin_dir)])
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    else:
        env.pop("VIRTUAL_ENV", None)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (libdir, str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
    env["TRITONTTS_PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), *site.getsitepackages()) if p)
    env.setdefault("LC_ALL", "C.UTF-8")
    for name, value in STAGE_THREAD_ENV.items():      # stages set their own intra-op threads
        env.setdefault(name, value)
    env.update(extra or {})
    return env


# The readiness poll's channel: reconnect attempts at most 0.5 s apart.
READY_POLL_CHANNEL = [("grpc.initial_reconnect_backoff_ms", 250),
                      ("grpc.min_reconnect_backoff_ms", 250),
                      ("grpc.max_reconnect_backoff_ms", 500)]



def stage_label(argv: list[str]) -> str:
    """What a process of the server's group runs: a Python stub's model (its first argument
    is <repository>/<model>/<version>/model.py), else its command line, shortened."""
    if argv and argv[0].endswith("triton_python_backend_stub") and len(argv) > 1:
        return f"the stub of model {Path(argv[1]).parents[1].name}"
    return " ".join(argv)[:80] or "?"


def describe_death(pid: int, label: str) -> str:
    """`pid` (`label`) died, and how, from its zombie's /proc/<pid>/stat exit_code field
    (waitpid's status; Linux 3.5+), when tritonserver has not reaped it yet."""
    try:
        status = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[49])
    except (OSError, IndexError, ValueError):
        return f"stage process {pid} ({label}) died (its exit status is gone)"
    if status & 0x7F:
        sig = status & 0x7F
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        why = (": the kernel's out-of-memory killer (see dmesg) or a kill" if sig == signal.SIGKILL
               else bus_error_hint() if sig == signal.SIGBUS
               else ": its native stack is in the server log (faulthandler)" if sig in
               (signal.SIGSEGV, signal.SIGABRT, signal.SIGFPE, signal.SIGILL) else "")
        return f"stage process {pid} ({label}) was killed by signal {sig} ({name}{why})"
    return f"stage process {pid} ({label}) exited with code {status >> 8}"


def bus_error_hint() -> str:
    """What a stage's SIGBUS usually is: a page of a mapped file that cannot be backed (a
    /dev/shm region grown past what tmpfs has, or a file truncated under its mapping), or
    Triton's Python backend crashing as its stage processes start (TritonServer.start_ready)."""
    from ..serving.shared_memory import free_text

    return (f": a mapped page that could not be backed, usually shared memory (/dev/shm: {free_text()} now) or a "
            "file truncated while mapped; its native stack is in the server log (faulthandler)")


def client_ready(client) -> bool:
    """Whether the server behind `client` answers and is ready (its start models loaded)."""
    try:
        return client.is_server_ready()
    except Exception:  # noqa: BLE001 - not listening yet
        return False


@dataclass
class StartProgress:
    """Whether a start is moving: the last moment a model changed state or the server's
    processes used CPU beyond idling (at least 1 CPU-second, and 2 % of the time since)."""

    cpu_at_mark: float
    mark: float

    def moved(self, now: float) -> None:
        self.mark = now

    def cpu(self, used: float, now: float) -> None:
        if used - self.cpu_at_mark >= max(1.0, 0.02 * (now - self.mark)):
            self.cpu_at_mark, self.mark = used, now

    def idle_cpu(self, used: float) -> float:
        return used - self.cpu_at_mark


class ProcessCpu:
    """The CPU time a changing set of processes (a server and its process group) has used,
    read from /proc, never less than before: a process that ended keeps the count it had
    when last seen (a stage that dies mid-start, or a helper process an export runs, takes
    its CPU time with it from /proc, which made a start that had worked look idle)."""

    def __init__(self):
        self.seen: dict[tuple[int, str], float] = {}     # (pid, start time) -> CPU-seconds

    def read(self, pids) -> float:
        """The total over every process seen so far, after reading `pids` afresh."""
        tick = os.sysconf("SC_CLK_TCK")
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue        # ended meanwhile: its last reading stays
            # (pid, start time): a pid the kernel hands out again is another process.
            self.seen[(pid, fields[19])] = (int(fields[11]) + int(fields[12])) / tick   # utime, stime
        return sum(self.seen.values())


@dataclass(frozen=True)
class LoadOrder:
    """How a server's models load: what tritonserver loads at start (every stage but the
    vLLM engines, loaded together), then each engine alone, then the ensembles that need
    them. An engine sizes its KV cache on the memory available when it starts
    (tritontts.engine.kv_budget), so it must start once every other stage holds its weights,
    and after the engine before it holds its cache: then that memory is what is really
    left, not what a stage still loading beside it is about to take."""

    at_start: tuple[str, ...]
    engines: tuple[str, ...] = ()
    after_engines: tuple[str, ...] = ()

    @classmethod
    def of(cls, models: list[str], repositories: tuple[Path, ...], always: tuple[str, ...] = ()) -> "LoadOrder":
        from .profiles import engine_settings_path
        from .repository import model_folder, read_config

        at_start, engines, after = list(always), [], []
        for model in models:
            where = model_folder(model, repositories)
            steps = [step.model_name for step in read_config(where / "config.pbtxt").ensemble_scheduling.step] \
                if where else []
            step_engines = [s for s in steps
                            if (f := model_folder(s, repositories)) is not None and engine_settings_path(f)]
            if not step_engines:
                at_start.append(model)
                continue
            at_start += [s for s in steps if s not in step_engines]
            engines += [s for s in step_engines if s not in engines]
            after.append(model)
        return cls(tuple(dict.fromkeys(at_start)), tuple(engines), tuple(after))


class SharedMemoryShort(RuntimeError):
    """/dev/shm cannot hold the regions of the server's stage processes: the message says
    how much there is, how much is needed and how to give more."""


@dataclass
class TritonServer:
    """A tritonserver child process with explicit model control, its models loaded in
    LoadOrder."""

    models: list[str]
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    repositories: tuple[Path, ...] = MODEL_REPOSITORIES
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    restarts: int = 0                       # times supervise() brought the server back
    cancel_dir: Path | None = None          # the stages' cancellation marks (a temp folder)
    _stopping: bool = field(default=False, repr=False)
    _supervisor: threading.Thread | None = field(default=None, repr=False)
    _cpu: ProcessCpu = field(default_factory=ProcessCpu, repr=False)
    _late_error: str | None = field(default=None, repr=False)   # an engine or ensemble that failed to load

    def load_order(self) -> LoadOrder:
        # The cancel model rides along with every server (tritontts/serving/cancellation.py).
        return LoadOrder.of(self.models, self.repositories, always=(CANCEL_MODEL,))

    def command(self) -> list[str]:
        cmd = [*base_command(), "--model-control-mode=explicit",
               f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
               f"--metrics-port={self.metrics_port}",
               "--exit-timeout-secs=10", "--log-verbose=0"]
        # Its stages' shared-memory regions under a prefix of its own: what a server killed
        # or crashed leaves in /dev/shm is found and removed (_kill_group), never another's.
        cmd += [f"--backend-config=python,shm-region-prefix-name={self.region_prefix}"]
        cmd += [f"--model-repository={repo}" for repo in self.repositories]
        cmd += [f"--load-model={model}" for model in self.load_order().at_start]
        return cmd

    def start(self) -> "TritonServer":
        """Start tritonserver (wait_ready waits for its models). Refused before anything
        starts, with SharedMemoryShort, where /dev/shm cannot hold its stages' regions."""
        self.check_shared_memory()
        log = open(self.log_path, "ab") if self.log_path else None
        if self.cancel_dir is None:
            import tempfile

            self.cancel_dir = Path(tempfile.mkdtemp(prefix="tritontts-cancel-"))
        env = {**self.env, CANCEL_DIR_ENV: str(self.cancel_dir)}
        self._late_error = None
        self.process = subprocess.Popen(self.command(), env=triton_env(env),
                                        stdout=log or None, stderr=subprocess.STDOUT if log else None,
                                        start_new_session=True)
        order = self.load_order()
        if order.engines:
            threading.Thread(target=self._load_late, args=(self.process, order), daemon=True,
                             name="tritonserver-engine-loader").start()
        return self

    def check_shared_memory(self) -> None:
        """/dev/shm against what this server's stage processes take (deploy/shared_memory.py):
        too little to start raises SharedMemoryShort; too little to serve large requests
        logs a warning."""
        from . import shared_memory

        order = self.load_order()
        need = shared_memory.check((*order.at_start, *order.engines, *order.after_engines), self.repositories)
        refusal = need.refusal()
        if refusal is not None:
            raise SharedMemoryShort(refusal)
        warning = need.warning()
        if warning is not None:
            logger.warning("%s", warning)

    def _load_late(self, process: subprocess.Popen, order: LoadOrder) -> None:
        """Once tritonserver has loaded its start models (it then opens its ports), load
        each vLLM engine alone, then the ensembles (LoadOrder). A failure is kept for
        wait_ready, with Triton's reason (a KV cache that does not fit says so, with its
        numbers)."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(self.grpc_url, channel_args=READY_POLL_CHANNEL)
        try:
            while not client_ready(client):
                if self._stopping or process.poll() is not None or self.process is not process:
                    return
                time.sleep(0.5)
            for name in (*order.engines, *order.after_engines):
                if self._stopping or self.process is not process:
                    return
                try:
                    client.load_model(name)
                except InferenceServerException as exc:
                    # Triton's reason without the Python backend's traceback ("At: ...", in the log)
                    reason = exc.message().split("\n\nAt:")[0].strip()
                    self._late_error = reason if name in reason else f"{name}: {reason}"
                    return
        finally:
            client.close()

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    def wait_ready(self, timeout: float | None = None, report: Callable[[str], None] | None = None,
                   stall_s: float = 300.0) -> None:
        """Wait until the server and every requested model are ready; fail loudly. No fixed
        deadline by default: a start waits as long as it makes progress (a model changes
        state, or the server's processes use CPU: loading weights, an ONNX export, an engine
        build) and fails when it exits, when a model fails, or when nothing moved for
        `stall_s`; `timeout` adds a deadline. `report` gets one line per model whose load
        state changes (the launcher prints them: a talker takes minutes, and the user
        should see which stage is loading), and the reason Triton gives for a failure."""
        import tritonclient.grpc as grpcclient

        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        # Triton opens its gRPC port only once its start models have loaded; until then each
        # poll fails to connect, and gRPC's default reconnect backoff (x1.6 per failure, up to
        # 120 s) would notice the ready server up to 20 s late after a minute of loading.
        client = grpcclient.InferenceServerClient(self.grpc_url, channel_args=READY_POLL_CHANNEL)
        states: dict[str, str] = {}
        progress = StartProgress(self.cpu_seconds(), started)
        try:
            while deadline is None or time.monotonic() < deadline:
                if self._stopping:
                    raise RuntimeError("tritonserver is being stopped")
                if self.process and self.process.poll() is not None:
                    failed = [f"{m}: {r}" for m, r in states.items() if r.startswith("UNAVAILABLE")]
                    raise RuntimeError(f"tritonserver exited with code {self.process.returncode}"
                                       + (f" ({'; '.join(failed)})" if failed else "")
                                       + (f"; see {self.log_path}" if self.log_path else ""))
                if self._late_error is not None:
                    raise RuntimeError(self._late_error
                                       + (f"; see {self.log_path}" if self.log_path else ""))
                try:
                    before = dict(states)
                    self._report_states(client, states, report or (lambda line: None),
                                        time.monotonic() - started)
                    if states != before:
                        progress.moved(time.monotonic())
                    if client.is_server_ready() and all(client.is_model_ready(m) for m in self.models):
                        return
                except Exception:
                    pass
                now = time.monotonic()
                progress.cpu(self.cpu_seconds(), now)
                if now - progress.mark > stall_s:
                    raise TimeoutError(f"tritonserver's start stalled: for {stall_s:.0f} s no model changed "
                                       f"state and its processes used {progress.idle_cpu(self.cpu_seconds()):.1f} "
                                       f"CPU-seconds (after {now - started:.0f} s)"
                                       + (f"; see {self.log_path}" if self.log_path else ""))
                time.sleep(0.5)
        finally:
            client.close()
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f}s (--startup-timeout)"
                           + (f"; see {self.log_path}" if self.log_path else ""))

    def cpu_seconds(self) -> float:
        """CPU time used so far by the server and its process group (the stage stubs),
        never less than before (ProcessCpu)."""
        if self.process is None:
            return 0.0
        return self._cpu.read({self.process.pid} | set(self._group()))

    @staticmethod
    def _report_states(client, states: dict[str, str], report: Callable[[str], None],
                       elapsed: float) -> None:
        index = client.get_model_repository_index(as_json=True).get("models", [])
        loaded = [m for m in index if m.get("state")]
        ready = sum(1 for m in loaded if m["state"] == "READY")
        for model in loaded:
            state = model["state"] + (f": {model['reason']}" if model.get("reason") else "")
            if states.get(model["name"]) != state:
                states[model["name"]] = state
                report(f"[{elapsed:5.0f} s] {model['name']}: {state} ({ready}/{len(loaded)} ready)")

    def start_ready(self, timeout: float | None = None, report: Callable[[str], None] | None = None,
                    stall_s: float = 300.0, tries: int = 2) -> "TritonServer":
        """start() and wait_ready(); a start whose tritonserver crashed (killed by a signal
        other than SIGKILL, which is the out-of-memory killer's) is made again, up to `tries`
        starts in all, each retry reported. Triton 2.51's Python backend can crash while its
        stage processes start (a stub's "Fatal Python error: Bus error", then tritonserver's
        boost::interprocess::lock_exception abort): seen in one CI run and in one local run of
        two test workers, /dev/shm at 20 MiB used of 24 GiB; the same start made again
        succeeded.
        A model that fails to load, a refusal (SharedMemoryShort) or a stall is not retried."""
        for attempt in range(1, tries + 1):
            self.start()
            try:
                self.wait_ready(timeout, report, stall_s)
                return self
            except (RuntimeError, TimeoutError):
                code = self.process.poll() if self.process else None
                self._kill_group()
                if code is None or code >= 0 or -code == signal.SIGKILL or attempt == tries:
                    raise
                name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
                (report or logger.warning)(f"tritonserver crashed while starting (signal {-code}, {name}); "
                                           f"starting it again ({attempt + 1} of {tries})")
        raise AssertionError("unreachable")

    def supervise(self, poll_s: float = 0.5, max_backoff_s: float = 30.0) -> None:
        """Bring the server back whenever it exits without stop() (killed, crashed): what
        its process group left (Python stubs, a talker's with its vLLM engine: still
        running, holding cores and memory) is killed first, then it starts again on the same ports with the
        same models. Clients get 503 meanwhile and need no reconnect: gRPC channels do."""
        def watch():
            backoff = 1.0
            stages = self._group()     # its stage processes (stubs) once ready
            while not self._stopping:
                code = self.process.poll()
                lost = set(stages) - set(self._group()) if code is None else set()
                if code is None and not lost:
                    time.sleep(poll_s)
                    continue
                if code is None:
                    # A stage process that dies takes its in-flight requests with it and
                    # leaves its model unusable (Triton never answers them): restart all.
                    logger.error("%s; restarting tritonserver",
                                 "; ".join(describe_death(pid, stages[pid]) for pid in sorted(lost)))
                else:
                    logger.error("tritonserver exited with code %s; restarting it in %.0f s", code, backoff)
                self._kill_group()
                time.sleep(backoff)
                if self._stopping:
                    return
                try:
                    self.start().wait_ready()
                    stages = self._group()
                    self.restarts += 1
                    backoff = 1.0
                    logger.warning("tritonserver is back (restart %d)", self.restarts)
                except Exception as exc:  # noqa: BLE001 - try again, waiting longer
                    logger.error("tritonserver restart failed: %s", exc)
                    backoff = min(2 * backoff, max_backoff_s)

        self._supervisor = threading.Thread(target=watch, name="tritonserver-supervisor", daemon=True)
        self._supervisor.start()

    def _group(self) -> dict[int, str]:
        """The live processes of the server's process group but the server itself, each with
        what it runs (stage_label); a stage that died stays a zombie until tritonserver
        reaps it, which it does not."""
        out = subprocess.run(["pgrep", "-g", str(self.process.pid)], capture_output=True, text=True)
        live = {}
        for pid in out.stdout.split():
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if state not in ("Z", "X"):
                live[int(pid)] = stage_label([a.decode(errors="replace") for a in argv if a])
        live.pop(self.process.pid, None)
        return live

    @property
    def region_prefix(self) -> str:
        """The name prefix of its stages' regions in /dev/shm (Triton's Python backend adds a
        UUID), unique to this launcher process and port."""
        return f"tritontts_{os.getpid()}_{self.grpc_port}_"

    def _kill_group(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self._remove_regions()

    def _remove_regions(self) -> None:
        """The regions a server that was killed or crashed left in /dev/shm (one that stops
        cleanly removes its own): memory nothing frees otherwise, run after run."""
        from ..serving.shared_memory import SHM_DIR

        for region in SHM_DIR.glob(self.region_prefix + "*"):
            try:
                region.unlink()
            except OSError:
                pass

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.join(timeout)   # a restart in progress gives up (wait_ready)
        if not self.process:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Whatever the server left in its process group (a stub, a talker's holding its vLLM
        # KV cache) goes too: nothing may outlive the server.
        self._kill_group()
        if self.cancel_dir is not None:
            shutil.rmtree(self.cancel_dir, ignore_errors=True)


def family_repository_args(args: list[str]) -> list[str]:
    """`--families A,B [--profile P] [--gpus 0,1]` among tritonserver's flags -> a model
    repository with those families' stages (rewritten for the profile) and ensembles in a
    fresh folder, and the flags that serve them (explicit model control, each family and
    the cancel model loaded). Other flags pass through. What a tritonserver pod runs
    (deploy/k8s) without knowing the families' stage lists."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--families")
    parser.add_argument("--profile", default=os.environ.get("TRITONTTS_PROFILE", "cpu"))
    parser.add_argument("--gpus", default="0")
    known, rest = parser.parse_known_args(args)
    if not known.families:
        return args
    from ..families import FAMILIES
    from .profiles import copy_ensembles, gpu_ids, write_profile_repository

    families = [f.strip() for f in known.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    out = Path(tempfile.mkdtemp(prefix=f"tritontts-{known.profile}-"))
    stages = sorted({CANCEL_MODEL, *(s for f in families for s in FAMILIES[f].stages)})
    write_profile_repository(known.profile, stages, out, gpus=gpu_ids(known.gpus))
    copy_ensembles(out)
    return [f"--model-repository={out}", "--model-control-mode=explicit",
            *(f"--load-model={m}" for m in [*families, CANCEL_MODEL]), *rest]


def flag_values(args: list[str], flag: str) -> list[str]:
    """The values of `flag` in tritonserver's argv (--flag=value or --flag value)."""
    values = []
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
        elif arg == flag and i + 1 < len(args):
            values.append(args[i + 1])
    return values


def shared_memory_refusal(args: list[str]) -> str | None:
    """TritonServer.check_shared_memory for a tritonserver command line: the models it loads
    (--load-model; every model of its repositories without explicit model control)."""
    from . import shared_memory

    repositories = tuple(Path(r) for r in flag_values(args, "--model-repository"))
    models = flag_values(args, "--load-model")
    if not models or "*" in models:
        models = [d.name for repo in repositories if repo.is_dir() for d in sorted(repo.iterdir())
                  if (d / "config.pbtxt").is_file()]
    need = shared_memory.check(models, repositories)
    warning = need.warning()
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return need.refusal()


def main(argv: list[str] | None = None) -> None:
    """`python -m tritontts.deploy.tritonserver [tritonserver flags]`: the real tritonserver with this
    environment prepared (stub, LD_LIBRARY_PATH, TRITONTTS_PYTHONPATH, --backend-directory).

    e.g. python -m tritontts.deploy.tritonserver --model-repository model_repository \\
             --model-repository ensembles --model-control-mode explicit --load-model piper
         python -m tritontts.deploy.tritonserver --families piper,cosyvoice3 --profile gpu
             (the families' stages, rewritten for the profile, in a fresh repository)
    """
    args = list(sys.argv[1:] if argv is None else argv)
    args = family_repository_args(args)
    refusal = shared_memory_refusal(args)
    if refusal is not None:
        print(f"tritonserver not started: {refusal}", file=sys.stderr, flush=True)
        sys.exit(1)
    command = base_command()
    if any(a.startswith("--backend-directory") for a in args):
        command = command[:1]  # the user's own backend directory wins
    os.execve(command[0], [*command, *args], triton_env())


if __name__ == "__main__":
    main()
