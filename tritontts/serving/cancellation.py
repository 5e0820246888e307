"""Cancellation that reaches the stages of an ensemble while they run.

Triton cancels an ensemble request between its steps only: a composing request already in
flight (a talker generating) is never marked cancelled, so it would run to its token limit
for a client that left, holding its engine slot. (Measured on a Qwen3-TTS talker: after
the client hung up, the server kept burning one core until the 3000-frame limit.)

So the front, when a stream ends before its final chunk, asks the `tritontts_cancel` model
(this module's CancelStage, in the same tritonserver) to cancel its request id. That model
marks the id in a directory every stage process of this server shares; every stage's
`Inputs.cancelled()` also looks for the mark of its request's id (the ensemble hands its id
to the composing requests), so a talker aborts its engine request at its next step.

Marks are empty files named by the request id (ids are checked to be plain tokens, never
paths); a stage removes its mark when its request ends, and old marks are swept.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from ..protocol import InvalidRequest
from .stage import Inputs, Stage

CANCEL_MODEL = "tritontts_cancel"
CANCEL_DIR_ENV = "TRITONTTS_CANCEL_DIR"
REQUEST_ID = "request_id"
_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
MAX_MARK_AGE_S = 600.0


def cancel_dir() -> Path:
    """The directory of this server's marks: the launcher's, else one per tritonserver
    (the stage processes' parent)."""
    configured = os.environ.get(CANCEL_DIR_ENV)
    return Path(configured) if configured else Path(f"/tmp/tritontts-cancel-{os.getppid()}")


def _mark(request_id: str) -> Path | None:
    return cancel_dir() / request_id if request_id and _ID.match(request_id) else None


def requested(request_id: str) -> bool:
    mark = _mark(request_id)
    return mark is not None and mark.exists()


def clear(request_id: str) -> None:
    mark = _mark(request_id)
    if mark is not None:
        try:
            mark.unlink()
        except FileNotFoundError:
            pass


def request(request_id: str) -> None:
    mark = _mark(request_id)
    if mark is None:
        raise InvalidRequest("request_id must be 1-128 letters, digits, '_', '-' or '.'")
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    _sweep(mark.parent)


def _sweep(directory: Path) -> None:
    cutoff = time.time() - MAX_MARK_AGE_S
    for old in directory.iterdir():
        try:
            if old.stat().st_mtime < cutoff:
                old.unlink()
        except FileNotFoundError:
            pass


class CancelStage(Stage):
    """model_repository/tritontts_cancel: marks a request id cancelled."""

    one_by_one = "bookkeeping: a cancel marks a request id, no computation"

    def run(self, inputs: Inputs) -> dict[str, Any]:
        request(str(inputs.scalar(REQUEST_ID, "")))
        return {"cancelled": True}
