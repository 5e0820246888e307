"""A Hugging Face cache written by hand, in the cache's own layout, so that `tritontts serve
ORG/NAME` finds tiny checkpoints under released repo ids offline (nothing is downloaded)."""
from __future__ import annotations

import shutil
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"


def hf_cache(root: Path, repo_id: str, checkpoint: Path) -> Path:
    """`checkpoint` as `huggingface-cli download repo_id` leaves it in an HF cache at `root`:
    models--ORG--NAME/snapshots/<revision>/ and refs/main naming that revision. Returns the
    snapshot folder."""
    repo = Path(root) / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(checkpoint, repo / "snapshots" / REVISION, symlinks=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return repo / "snapshots" / REVISION
