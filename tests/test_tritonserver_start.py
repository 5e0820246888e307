"""The launcher's start-up wait (TritonServer.wait_ready): no fixed deadline while the server's
processes work, a clear failure when they stall, exit, or pass --startup-timeout. Real child
processes stand in for a loading tritonserver (no port answers: as before Triton's gRPC opens)."""
import subprocess
import sys
import time

import pytest

from tritontts.deploy.tritonserver import StartProgress, TritonServer
from tritontts.testing.stack import free_port


def server_running(code: str) -> TritonServer:
    server = TritonServer(models=["nothing"], grpc_port=free_port())
    server.process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    return server


def stop(server: TritonServer) -> None:
    server.process.kill()
    server.process.wait()


def test_a_start_whose_processes_do_nothing_fails_as_stalled_after_the_stall_time():
    server = server_running("import time; time.sleep(60)")
    try:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="stalled: for 2 s no model changed state"):
            server.wait_ready(stall_s=2.0)
        assert time.monotonic() - began < 10
    finally:
        stop(server)


def test_a_start_whose_processes_work_outlasts_the_stall_time_and_stops_only_at_the_given_timeout():
    server = server_running("while True: pass")       # an export or an engine build, say
    try:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match=r"not ready after 6s \(--startup-timeout\)"):
            server.wait_ready(timeout=6.0, stall_s=2.0)
        assert time.monotonic() - began >= 6.0
        assert server.cpu_seconds() > 3.0
    finally:
        stop(server)


def test_a_start_whose_server_exits_fails_with_its_exit_code():
    server = server_running("import sys; sys.exit(3)")
    with pytest.raises(RuntimeError, match="exited with code 3"):
        server.wait_ready(stall_s=30.0)


def test_cpu_seconds_keep_the_work_of_a_process_that_ended():
    """A process of the server's group that worked and ended (reaped, gone from /proc) keeps
    its count: the total never falls, so a start that worked never looks idle (before, the
    stall detector printed negative CPU-seconds after stage processes died)."""
    # The child idles a moment after its work, so the reader sees all of it before it ends
    # (read every 0.1 s, a child ending straight after its work could leave its last 0.1 s unseen).
    child = "import time; end = time.process_time() + 1.5\nwhile time.process_time() < end: pass\ntime.sleep(0.5)"
    server = server_running(f"import subprocess, sys, time; time.sleep(0.3); "
                            f"subprocess.run([sys.executable, '-c', {child!r}]); time.sleep(60)")
    try:
        readings, deadline = [], time.monotonic() + 20
        while time.monotonic() < deadline:
            readings.append(server.cpu_seconds())
            if len(server._group()) == 0 and readings[-1] > 1.0:
                break           # the child worked, ended and was reaped
            time.sleep(0.1)
        assert readings == sorted(readings), readings
        assert readings[-1] >= 1.4 and not server._group(), readings
    finally:
        stop(server)


def test_progress_counts_cpu_beyond_idling_and_state_changes():
    progress = StartProgress(cpu_at_mark=10.0, mark=0.0)
    progress.cpu(10.5, now=5.0)                 # half a CPU-second: idling
    assert progress.mark == 0.0
    progress.cpu(11.2, now=20.0)                # 1.2 s of CPU in 20 s: work
    assert progress.mark == 20.0 and progress.cpu_at_mark == 11.2
    progress.cpu(12.3, now=120.0)               # 1.1 s in 100 s: under 2 %, idling
    assert progress.mark == 20.0
    progress.moved(now=130.0)                   # a model changed state
    assert progress.mark == 130.0


def dead_unreaped(code: str, sig: int | None) -> subprocess.Popen:
    """A child that ended (by `sig`, or by itself) and is not reaped yet: a zombie, as a dead
    stage is under tritonserver."""
    import os

    child = subprocess.Popen([sys.executable, "-c", code])
    if sig is not None:
        time.sleep(0.2)
        os.kill(child.pid, sig)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            return child
        time.sleep(0.05)
    raise AssertionError("the child did not end")


@pytest.mark.parametrize("sig, says", [
    (9, "was killed by signal 9 (SIGKILL: the kernel's out-of-memory killer"),
    (11, "was killed by signal 11 (SIGSEGV: its native stack is in the server log"),
    (None, "exited with code 3"),
])
def test_a_dead_stage_is_named_with_how_it_died(sig, says):
    from tritontts.deploy.tritonserver import describe_death

    child = dead_unreaped("import sys; sys.exit(3)" if sig is None else "import time; time.sleep(30)", sig)
    try:
        said = describe_death(child.pid, "the stub of model piper_vits")
        assert said.startswith(f"stage process {child.pid} (the stub of model piper_vits) {says}"), said
    finally:
        child.wait()
    assert "its exit status is gone" in describe_death(child.pid, "x")     # reaped: no record left


def test_a_stub_is_labelled_by_its_model_folder():
    from tritontts.deploy.tritonserver import stage_label

    stub = ["/x/backends/python/triton_python_backend_stub", "/tmp/repo/higgs_audio_v2_decoder/1/model.py",
            "triton_tritontts_backend_shm_region_1", "1048576"]
    assert stage_label(stub) == "the stub of model higgs_audio_v2_decoder"
    assert stage_label(["python", "-m", "vllm.engine"]) == "python -m vllm.engine"


def test_the_vllm_engines_load_alone_after_every_other_stage_then_their_ensembles():
    """LoadOrder on the committed repositories: tritonserver loads every stage but the vLLM
    engines at start (and a family without an engine whole), the launcher then each engine,
    then the ensembles that need them; so an engine sizes its KV cache on what is left."""
    from tritontts.deploy.profiles import engine_settings_path
    from tritontts.deploy.tritonserver import MODEL_REPOSITORIES, STAGE_REPOSITORY, LoadOrder
    from tritontts.families import FAMILIES

    def engines(family):
        return [s for s in FAMILIES[family].stages if engine_settings_path(STAGE_REPOSITORY / s)]

    plain = next(f for f in FAMILIES if not engines(f))
    talking = [f for f in FAMILIES if engines(f)][:2]
    order = LoadOrder.of([plain, *talking], MODEL_REPOSITORIES, always=("tritontts_cancel",))
    assert order.engines == tuple(e for f in talking for e in engines(f))
    assert order.after_engines == tuple(talking)
    assert set(order.at_start) == {"tritontts_cancel", plain, *(s for f in talking for s in FAMILIES[f].stages)} \
        - set(order.engines)
    server = TritonServer(models=[plain, talking[0]])
    loaded = [a.removeprefix("--load-model=") for a in server.command() if a.startswith("--load-model=")]
    assert plain in loaded and talking[0] not in loaded and not set(engines(talking[0])) & set(loaded)


class CrashingServer:
    """A stand-in for tritonserver's process: the first `crashes` starts abort (SIGABRT, as
    Triton's Python backend race does), later ones stay up."""

    def __init__(self, crashes: int, signal_number: int = 6):
        self.crashes, self.signal_number, self.starts = crashes, signal_number, 0


def fake_server(behaviour: CrashingServer, tmp_path):
    import subprocess
    import sys

    from tritontts.deploy.tritonserver import TritonServer

    class Fake(TritonServer):
        def check_shared_memory(self):
            pass

        def start(self):
            behaviour.starts += 1
            code = (f"import os; os.kill(os.getpid(), {behaviour.signal_number})"
                    if behaviour.starts <= behaviour.crashes else "import time; time.sleep(60)")
            self.process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
            return self

        def wait_ready(self, timeout=None, report=None, stall_s=300.0):
            try:
                self.process.wait(1.5)
            except subprocess.TimeoutExpired:
                return
            raise RuntimeError(f"tritonserver exited with code {self.process.returncode}")

    return Fake(["piper"], log_path=tmp_path / "triton.log")


def test_a_start_that_crashes_is_made_again_once_and_says_so(tmp_path):
    behaviour, lines = CrashingServer(crashes=1), []
    server = fake_server(behaviour, tmp_path).start_ready(report=lines.append)
    try:
        assert behaviour.starts == 2 and server.process.poll() is None
        assert lines == ["tritonserver crashed while starting (signal 6, SIGABRT); starting it again (2 of 2)"]
    finally:
        server.stop(timeout=5)


def test_a_start_that_crashes_twice_or_is_killed_fails_without_more_tries(tmp_path):
    import pytest

    for behaviour, starts in ((CrashingServer(crashes=2), 2), (CrashingServer(crashes=1, signal_number=9), 1)):
        server = fake_server(behaviour, tmp_path)
        with pytest.raises(RuntimeError, match="exited with code -"):
            server.start_ready(report=lambda line: None)
        assert behaviour.starts == starts      # SIGKILL (the OOM killer's) is not retried
