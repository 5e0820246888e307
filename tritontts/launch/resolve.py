"""MODEL, as `vllm serve MODEL` takes it, to a local checkpoint folder and the family that
serves it: a local path is taken as is; a Hugging Face repo id is looked up in the HF cache
(the snapshot its refs/main names, found by huggingface_hub), else downloaded, and offline
refused in one line; the family is told from the folder's own files (each family's
Layout), never from the name."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..families import FAMILIES
from ..family import Family, config_json

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ResolveError(Exception):
    """MODEL cannot be served: the message (one line) says what was found and what to do."""


@dataclass(frozen=True)
class Resolved:
    model: str              # as the user gave it: the served model id
    family: Family
    path: Path | None       # the checkpoint folder (None: the family's built-in default)
    variant: str = ""       # what kind of the family's checkpoints it is, in words


def hub_cache() -> str:
    """Where the HF cache is: $HF_HUB_CACHE, else $HF_HOME/hub, else huggingface_hub's default
    (read now, not when huggingface_hub was imported)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return str(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def snapshot(repo_id: str) -> Path:
    """The local snapshot of `repo_id`: the cached one, else downloaded (not when offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    fetch = f"fetch it first with `huggingface-cli download {repo_id}` (or `hf download {repo_id}`)"
    try:
        return Path(snapshot_download(repo_id, cache_dir=hub_cache(), local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError):
        pass
    if hub_offline():
        raise ResolveError(f"{repo_id}: not in the Hugging Face cache ({hub_cache()}) and downloads are off "
                           f"(HF_HUB_OFFLINE): {fetch}")
    try:
        return Path(snapshot_download(repo_id, cache_dir=hub_cache()))
    except Exception as exc:  # noqa: BLE001 - no network, no such repo, no access: one line
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ResolveError(f"{repo_id}: not in the Hugging Face cache ({hub_cache()}) and the download failed "
                           f"({reason}): {fetch}") from None


def checkpoint_folder(model: str) -> Path:
    """A local path as is (~ expanded); otherwise MODEL must be a repo id (org/name)."""
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ResolveError(f"{model}: a checkpoint is a folder, not a file")
        return path.resolve()
    if REPO_ID.match(model):
        return snapshot(model)
    raise ResolveError(f"{model}: no such folder, and not a Hugging Face repo id (org/name)")


def detect(root: Path) -> Family:
    """The one family whose Layout the folder has."""
    matches = [family for family in FAMILIES.values() if family.layout is not None and family.layout.matches(root)]
    if len(matches) == 1:
        return matches[0]
    if matches:      # two layouts overlap: a bug of ours (tests/launch/test_serve.py would fail)
        raise ResolveError(f"{root}: the checkpoint layouts of {', '.join(f.name for f in matches)} all match")
    files = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())[:12] if root.is_dir() else []
    model_type = config_json(root).get("model_type")
    known = "; ".join(f"{f.name}: {f.layout.describe()}" for f in FAMILIES.values() if f.layout is not None)
    raise ResolveError(f"{root}: no served family's checkpoint: found {', '.join(files) or 'nothing'}"
                       + (f" (config.json model_type {model_type!r})" if model_type else "")
                       + f"; known layouts: {known}")


def resolve(model: str) -> Resolved:
    """MODEL to what serves it. A family's own name serves its built-in default (the default voice)
    where it needs no checkpoint."""
    family = FAMILIES.get(model)
    if family is not None and not family.checkpoint_required and not Path(model).exists():
        return Resolved(model, family, None)
    root = checkpoint_folder(model)
    family = detect(root)
    variant = ""
    if family.open_checkpoint is not None:
        from ..weights.checkpoint import CheckpointError

        try:
            opened = family.open_checkpoint(root)
        except CheckpointError as exc:
            raise ResolveError(f"{model}: a {family.name} checkpoint, but {exc}") from None
        variant = family.variant_of(opened) if family.variant_of is not None else ""
    return Resolved(model, family, root, variant)
