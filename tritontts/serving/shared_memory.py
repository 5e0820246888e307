"""/dev/shm as a stage sees it: Triton's Python backend moves every tensor between
tritonserver and a stage process through a region there (tritontts/deploy/shared_memory.py
checks it before a server starts; triton_stage.send_response names it when a response does
not fit)."""
from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
MIB = 1 << 20


def free_bytes(path: Path = SHM_DIR) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def free_text(path: Path = SHM_DIR) -> str:
    """'N MiB free' (or why not known), for a message."""
    try:
        return f"{free_bytes(path) / MIB:.1f} MiB free"
    except OSError:
        return "its free space not readable"
