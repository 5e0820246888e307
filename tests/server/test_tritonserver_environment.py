"""The environment the launcher hands tritonserver points at this environment only, whatever
the caller's shell holds (a fresh clone once failed from a login shell: the stub and vLLM's
`python3 -m ...` child found the system interpreter on PATH)."""
from __future__ import annotations

import subprocess
import sys

from tritontts.deploy.tritonserver import environment_bin, triton_env

# A new user's login shell, plus variables that point at another Python installation.
HOSTILE_SHELL = {"HOME": "/root", "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                 "PYTHONHOME": "/nonexistent", "PYTHONPATH": "/nonexistent/site-packages"}


def test_environment_bin_comes_first_on_path_and_foreign_python_variables_are_dropped():
    env = triton_env(base=HOSTILE_SHELL)
    path = env["PATH"].split(":")
    assert path[0] == str(environment_bin())
    assert path[1:] == ["/usr/local/bin", "/usr/bin", "/bin"]
    assert "PYTHONHOME" not in env and "PYTHONPATH" not in env
    assert env["LD_LIBRARY_PATH"].split(":")[0]  # the interpreter's LIBDIR first


def test_python3_on_that_path_is_this_environment_and_imports_vllm():
    """What vLLM's model-inspection child runs: `python3` found on PATH."""
    out = subprocess.run(
        ["python3", "-c", "import sys, numpy, vllm.model_executor.models.registry; print(sys.prefix)"],
        env=triton_env(base=HOSTILE_SHELL), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == sys.prefix


def test_control_without_the_fix_python3_is_another_interpreter():
    """Negative control: the same shell as it is finds another interpreter than this
    environment (the fault a new user hit: it had no vLLM)."""
    shell = {k: v for k, v in HOSTILE_SHELL.items() if not k.startswith("PYTHON")}
    out = subprocess.run(["python3", "-c", "import sys; print(sys.prefix)"], env=shell,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() != sys.prefix
