"""What every family's checkpoint loader shares: one error type that names the file, one
check for the files a layout needs, one strict state-dict load, one cache folder."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable


def cache_root(given: str | Path | None = None) -> Path:
    """Where conversions and exports made from checkpoints are kept: `given`, else
    $TRITONTTS_CACHE, else ~/.cache/tritontts."""
    return Path(given or os.environ.get("TRITONTTS_CACHE") or Path.home() / ".cache" / "tritontts")


class CheckpointError(ValueError):
    """A checkpoint file is missing or malformed; the message names the file."""


def require_dir(root: str | Path, what: str) -> Path:
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise CheckpointError(f"{root}: {what} checkpoint directory not found")
    return root


def require_files(root: Path, names: Iterable[str], what: str) -> None:
    for name in names:
        if not (root / name).is_file():
            raise CheckpointError(f"{root / name}: missing from the {what} checkpoint")


def load_strict(module, state_dict, what: str) -> None:
    """Load a state dict that matches the module exactly; otherwise raise CheckpointError
    naming every missing, unexpected and wrongly shaped key (nothing is loaded then)."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = sorted(f"{k} {tuple(state_dict[k].shape)} vs {tuple(expected[k].shape)}"
                        for k in set(expected) & set(state_dict)
                        if tuple(state_dict[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or mismatched:
        parts = [f"{label}: {', '.join(keys)}" for label, keys in
                 (("missing keys", missing), ("unexpected keys", unexpected),
                  ("shape mismatches", mismatched)) if keys]
        raise CheckpointError(f"{what} does not match the model; " + "; ".join(parts))
    module.load_state_dict(dict(state_dict), strict=True)
