"""scripts/serve.sh chooses the setup: only Piper served (the default) -> `setup.sh
--minimal` (no torch, no vLLM); any other family -> the full setup. Run against stand-ins
for setup.sh and the venv's python that record how they were called."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "serve.sh", tmp_path / "scripts" / "serve.sh")
    (tmp_path / "scripts" / "setup.sh").write_text('echo "setup $*" >> calls\n')
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    python = tmp_path / ".venv" / "bin" / "python"
    python.write_text('#!/bin/sh\necho "python $*" >> calls\n')
    python.chmod(0o755)
    return tmp_path


def serve(checkout: Path, *args: str, env: dict | None = None) -> list[str]:
    (checkout / "calls").unlink(missing_ok=True)
    subprocess.run(["bash", "scripts/serve.sh", *args], cwd=checkout, check=True,
                   env={"PATH": "/usr/bin:/bin", **(env or {})})
    return (checkout / "calls").read_text().splitlines()


@pytest.mark.parametrize("args, env, minimal", [
    ((), {}, True),
    (("--families", "piper", "--port", "9000"), {}, True),
    (("--families=piper",), {}, True),
    (("--families", "cosyvoice3"), {}, False),
    (("--families=piper,qwen3_tts",), {}, False),
    ((), {"TRITONTTS_FAMILIES": "qwen3_tts"}, False),
    (("--families", "piper"), {"TRITONTTS_FAMILIES": "qwen3_tts"}, True),
])
def test_serve_sets_up_minimally_only_when_piper_alone_is_served(checkout, args, env, minimal):
    calls = serve(checkout, *args, env=env)
    assert [c.rstrip() for c in calls] == [("setup --minimal" if minimal else "setup"), f"python -m frontend {' '.join(args)}".rstrip()]
