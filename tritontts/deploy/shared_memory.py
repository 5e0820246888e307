"""/dev/shm, where Triton's Python backend moves every tensor between tritonserver and a
stage process (one stub per model instance): each stub gets a region there of
`REGION_START_BYTES` when it starts (allocated whole: a start without the room fails with
Triton's "Unable to initialize shared memory key") and grows it by `REGION_GROWTH_BYTES`
steps when a request's tensors need more ("Failed to increase the shared memory pool size").

What the launcher does with that (docs/triton-on-cpu.md, "Shared memory"):
- before tritonserver starts, `check` counts the stubs of the models to load and compares
  /dev/shm's free space with what they take at start (a launch that cannot start is refused
  in one line that says how much there is, how much is needed and how to give more) and
  with `SERVING_BYTES_PER_STUB` each (a warning: requests with large tensors may be answered
  503 until there is room);
- a stage whose response does not fit answers that request with a 503 that names /dev/shm
  (tritontts.serving.triton_stage.send_response), instead of leaving it without an end.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..serving.shared_memory import MIB, SHM_DIR, free_bytes
# The Python backend's shm-default-byte-size and shm-growth-byte-size (Triton 2.51's
# defaults; the launcher does not change them).
REGION_START_BYTES = REGION_GROWTH_BYTES = 1 << 20
# Room per stub while serving: the start region and growth for the largest tensors a stage
# handles at once (a 30 s reference recording at 48 kHz in float32 is 5.5 MiB; a batch of 8
# one-second chunks at 48 kHz is 1.5 MiB). Measured over the family contract suite's replay
# tests in two workers (two servers at once), sampled each second: regions of 1 MiB, one of
# 2 MiB, 23 MiB in use at most.
SERVING_BYTES_PER_STUB = 8 << 20


@dataclass(frozen=True)
class SharedMemoryNeed:
    stubs: int
    free_bytes: int
    path: Path = SHM_DIR

    @property
    def start_bytes(self) -> int:
        return self.stubs * REGION_START_BYTES

    @property
    def serving_bytes(self) -> int:
        return self.stubs * SERVING_BYTES_PER_STUB

    def refusal(self) -> str | None:
        """Why tritonserver cannot start here, in one line, or None."""
        if self.free_bytes >= self.start_bytes:
            return None
        return (f"{self.path} has {self.free_bytes / MIB:.1f} MiB free, but the {self.stubs} stage processes of "
                f"this server need {self.start_bytes / MIB:.0f} MiB to start (Triton's Python backend gives each "
                f"a {REGION_START_BYTES // MIB} MiB shared-memory region) and about {self.serving_bytes / MIB:.0f} "
                f"MiB to serve: {remedy(self.serving_bytes)}")

    def warning(self) -> str | None:
        """A line for a start that fits but may answer large requests 503, or None."""
        if self.refusal() is not None or self.free_bytes >= self.serving_bytes:
            return None
        return (f"{self.path} has {self.free_bytes / MIB:.1f} MiB free for {self.stubs} stage processes: enough to "
                f"start, but requests with large tensors may be answered 503 until there is room (about "
                f"{self.serving_bytes / MIB:.0f} MiB is enough): {remedy(self.serving_bytes)}")


def remedy(need: int) -> str:
    size = max(64, -(-need // MIB))
    return (f"give it more (docker run --shm-size={size}m, a Kubernetes emptyDir with medium Memory at "
            f"/dev/shm, or mount -o remount,size={size}m /dev/shm) or free what is there")


def stub_count(models: list[str] | tuple[str, ...], repositories: tuple[Path, ...]) -> int:
    """The Python-backend processes tritonserver starts for `models` (ensembles expanded to
    their steps; each stage's instance_group counts, 1 where it names none)."""
    from .repository import model_folder, read_config

    stubs: dict[str, int] = {}
    todo = list(models)
    while todo:
        name = todo.pop()
        where = model_folder(name, repositories)
        if name in stubs or where is None:
            continue
        config = read_config(where / "config.pbtxt")
        if config.platform == "ensemble":
            todo += [step.model_name for step in config.ensemble_scheduling.step]
            stubs[name] = 0
            continue
        stubs[name] = sum(group.count or 1 for group in config.instance_group) or 1
    return sum(stubs.values())


def check(models: list[str] | tuple[str, ...], repositories: tuple[Path, ...],
          path: Path = SHM_DIR) -> SharedMemoryNeed:
    return SharedMemoryNeed(stub_count(models, repositories), free_bytes(path), path)
