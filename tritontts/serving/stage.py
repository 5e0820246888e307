"""Stage classes, shared by every family's stages (no Triton import: the backend host,
tritontts/serving/triton_stage.py, wires them to Triton; tests run them directly).

Stage classes: every stage model runs on our Python-based Triton backend (`backend:
"tritontts"`, tritontts/serving/triton_stage.py), which instantiates the class named by the
config's `stage` parameter. A stage class only computes; the backend reads its inputs and
output types from config.pbtxt, checks cancellation, forwards the stream metadata, sends
responses and maps errors. Three kinds:

  Stage           run(inputs) -> outputs             one response per request; in a
                                                     decoupled model, scheduled earliest
                                                     chunk first (tritontts/serving/scheduling.py);
                                                     run_batch(list) for the dynamic batcher's
                                                     batches (default: run each); a decoupled
                                                     model with run_batch sends each result
                                                     as soon as the stage says it is ready
  StreamingStage  run(inputs) -> iterator of outputs one response per chunk (decoupled)
  EngineStage     async run(inputs) -> async iterator   the same on an asyncio loop of the
                                                     stage's own (an engine such as vLLM)
"""
from __future__ import annotations

import asyncio
import json
import secrets
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import numpy as np

from ..protocol import (
    PARAMS, STREAM_ID, TEXT, VOICE, InvalidRequest, check_text, decode_params)

# The launcher's --stage-setting STAGE.KEY=VALUE, handed to tritonserver's stages as JSON
# {stage: {key: value}}: a stage's own settings over its 1/model.json's (CosyVoice3's talker's
# sampling_method) without editing the repository. --engine-arg is the same for engine_args.
STAGE_SETTINGS_ENV = "TRITONTTS_STAGE_SETTINGS"
# Every GroupedStage's max_rows_per_call over its config's, for a whole server: 0 computes a
# batch whole, 1 its rows one by one (tritontts.benchmark.batching --served serves the same
# checkpoint both ways side by side).
MAX_ROWS_PER_CALL_ENV = "TRITONTTS_MAX_ROWS_PER_CALL"
# The thread environment every stage process starts in, unless the caller's sets it
# (tritontts.deploy.tritonserver gives it to tritonserver; tritontts-voice precompute runs a
# voice encoder in it): a stage sets the intra-op threads of what it computes with
# (uses_torch, an onnxruntime session's options); torch in a stage that does not is on one
# thread. The thread count changes float results: a precompute on both cores wrote other
# bytes than the server stored for the same recording.
STAGE_THREAD_ENV = {"OMP_NUM_THREADS": "1"}


@dataclass(frozen=True)
class StageContext:
    """What a stage learns about the Triton model it runs as."""
    name: str                                  # the model's name
    model_dir: Path                            # its folder (config.pbtxt, 1/)
    version: str = "1"
    parameters: dict[str, str] = field(default_factory=dict)   # config.pbtxt `parameters`
    instance_count: int = 1
    device: str = "cpu"                        # "cuda:N" for a KIND_GPU instance on GPU N

    def settings(self, filename: str = "model.json") -> dict[str, Any]:
        """A JSON file in the version folder (a talker's engine arguments), as vllm_backend
        keeps its model.json."""
        import os

        path = self.model_dir / self.version / filename
        try:
            settings = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        overrides = os.environ.get(STAGE_SETTINGS_ENV, "")
        if filename == "model.json" and overrides:
            settings.update(json.loads(overrides).get(self.name, {}))
        return settings

    def int_parameter(self, name: str, default: int) -> int:
        return int(self.parameters.get(name, default))

    def checkpoint(self, family) -> Path | None:
        """This model's checkpoint: its `checkpoint` parameter (another checkpoint of the
        family, served beside the default one), else the family's default (launcher)."""
        path = self.parameters.get("checkpoint")
        return Path(path) if path else family.checkpoint()

    def open_checkpoint(self, family):
        """This model's checkpoint, opened by the family's reader."""
        return family.open_checkpoint(self.checkpoint(family))


class Inputs(dict):
    """A request's input tensors by name, without the batch dimension. `cancelled()` says
    whether the client has gone away (the backend wires it to Triton's request)."""

    @staticmethod
    def cancelled() -> bool:
        return False

    def scalar(self, name: str, default: Any = None) -> Any:
        """The first element; BYTES decode to str."""
        array = self.get(name)
        if array is None or array.size == 0:
            return default
        value = array.reshape(-1)[0]
        if isinstance(value, bytes):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequest(f"{name} must be UTF-8 text") from None
        return value.item() if hasattr(value, "item") else value

    def flat(self, name: str) -> np.ndarray:
        return self[name].reshape(-1)


# The reason of the stages that prepare a request for the networks after them.
PREPARES_REQUESTS = ("per-request preparation: text normalizing and tokenizing in Python, and a reference's "
                     "features, cached by content, so its encoders run once per voice, not per chunk")


class Stage:
    """One response per request: `run` returns the outputs by name. Outputs the config
    declares that are also inputs (stream_id, chunk_index, is_final, forwarded tensors) are
    passed through unless `run` sets them."""

    # A stage computing with torch sets this: its process's torch then runs on the config's
    # `torch_threads` parameter (default 1) threads, set once as the stage is built.
    uses_torch = False
    # Why the requests of a batch Triton hands this stage are computed one after another; a
    # stage whose config batches must compute a batch together (GroupedStage, run_batch),
    # run on a ChunkScheduler's workers (decoupled, one response), talk through an engine
    # (EngineStage), or say why here (tests/contract/test_batched_compute.py).
    one_by_one: str | None = None

    def __init__(self, context: StageContext):
        self.context = context
        if self.uses_torch:
            import torch

            torch.set_num_threads(context.int_parameter("torch_threads", 1))

    def run(self, inputs: Inputs) -> dict[str, Any]:
        raise NotImplementedError

    def run_batch(self, batch: list[Inputs], ready: Callable[[int, Any], None] | None = None
                  ) -> list[dict[str, Any] | Exception]:
        """The requests Triton's dynamic batcher gathered, in order: one result (outputs, or
        the exception that request fails with) per request. The default runs them one by
        one; a stage whose network gains from batching computes them together. A stage
        that computes a batch in parts may call `ready(index, result)` as each part is done:
        in a decoupled model that result is sent at once (not at the end of the batch)."""
        results: list[dict[str, Any] | Exception] = []
        for inputs in batch:
            try:
                results.append(self.run(inputs))
            except Exception as exc:  # noqa: BLE001 - that request fails, not the batch
                results.append(exc)
        return results

    def encode_voice(self, inputs: Inputs) -> bytes:
        """A family's prompt stage that stores cloned voices (Family.voice_encoder) returns
        the reference's packed features (tritontts.voice) for a request that asks for its
        `voice_features` output alone."""
        raise InvalidRequest(f"{self.context.name} does not encode voices")

    def voice_fingerprint(self) -> str:
        """The checkpoint fingerprint (tritontts.voice.checkpoint_fingerprint) that the
        voice features this stage packs carry, and the only one it accepts."""
        raise InvalidRequest(f"{self.context.name} does not encode voices")

    def close(self) -> None:
        """Called when Triton unloads the model."""


def one_row_per_stream(batch: list[Inputs], rows: list[int]) -> list[list[int]]:
    """`rows` (indices into `batch`) in rounds that hold at most one row of each stream: a
    stream's first row in round 0, its second in round 1, ...; rows without a stream_id
    are streams of their own."""
    rounds: list[list[int]] = []
    seen: dict[Any, int] = {}
    for i in rows:
        stream = batch[i].scalar(STREAM_ID)
        depth = 0 if stream is None else seen.get(stream, 0)
        if stream is not None:
            seen[stream] = depth + 1
        if depth == len(rounds):
            rounds.append([])
        rounds[depth].append(i)
    return rounds


def run_in_groups(batch: list[Inputs], key: Callable[[Inputs], Any],
                  compute: Callable[[list[Inputs]], list[dict[str, Any]]],
                  ready: Callable[[int, Any], None] | None = None,
                  max_rows: int = 0) -> list[dict[str, Any] | Exception]:
    """A stage's run_batch for a network without masks: the requests whose `key` (their
    shapes, and whatever else changes the computation) is equal are computed together by
    `compute(members)`, one result per member, in one call (at most `max_rows` per call;
    0: the whole group); requests of another key in another. A request whose `key` raises
    fails alone; a group whose compute raises is computed again one request at a time, so
    only the request that fails fails. `ready` is told of each group's results as they
    are done.

    A call never holds two requests of one stream (`stream_id`): a stream's chunks that
    the batcher queued together are computed in successive calls, in arrival order. A
    batch's float sums depend on its row count (a kernel for one row is not the kernel for
    two), so a request served alone computes every chunk as a batch of one, whatever the
    timing of its chunks: the seeded-replay contract (docs/api.md, `seed`)."""
    results: list[dict[str, Any] | Exception | None] = [None] * len(batch)
    groups: dict[Any, list[int]] = {}
    for i, inputs in enumerate(batch):
        try:
            groups.setdefault(key(inputs), []).append(i)
        except Exception as exc:  # noqa: BLE001 - that request fails, not the batch
            results[i] = exc
            if ready is not None:
                ready(i, exc)
    calls = [members[at:at + (max_rows or len(members))] for group in groups.values()
             for members in one_row_per_stream(batch, group)
             for at in range(0, len(members), max_rows or len(members))]
    for members in calls:
        try:
            outputs: list[dict[str, Any] | Exception] = list(compute([batch[i] for i in members]))
        except Exception as exc:  # noqa: BLE001 - find the request that fails
            outputs = [exc] if len(members) == 1 else \
                [run_in_groups([batch[i]], key, compute)[0] for i in members]
        for i, result in zip(members, outputs):
            results[i] = result
            if ready is not None:
                ready(i, result)
    return results  # type: ignore[return-value]


class GroupedStage(Stage):
    """A stage whose network computes the dynamic batcher's requests of equal `batch_key`
    (their shapes and whatever else changes the computation) together, `run_group` taking
    one such group; a request alone is a batch of one (run_in_groups). The config's
    `max_rows_per_call` parameter caps the rows of one call (0, the default: no cap; 1:
    one by one, where a device computes a batch no faster than its rows in turn)."""

    def batch_key(self, inputs: Inputs) -> Any:
        raise NotImplementedError

    def run_group(self, members: list[Inputs]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def run(self, inputs: Inputs) -> dict[str, Any]:
        (result,) = self.run_batch([inputs])
        if isinstance(result, Exception):
            raise result
        return result

    def run_batch(self, batch: list[Inputs], ready: Callable[[int, Any], None] | None = None
                  ) -> list[dict[str, Any] | Exception]:
        return run_in_groups(batch, self.batch_key, self.run_group, ready, self.max_rows_per_call)

    @property
    def max_rows_per_call(self) -> int:
        import os

        given = os.environ.get(MAX_ROWS_PER_CALL_ENV)
        return int(given) if given else self.context.int_parameter("max_rows_per_call", 0)


class StreamingStage(Stage):
    """Many responses per request (a decoupled model): `run` yields one output dict per
    chunk. chunk_index is numbered 0, 1, ... for you. A chunk that sets is_final is sent at
    once; one that does not is held until the next chunk (or the end) shows whether it was
    the last, so only cheap-to-produce chunks should leave is_final to the base."""

    def run(self, inputs: Inputs) -> Iterator[dict[str, Any]]:
        raise NotImplementedError


class EngineStage(StreamingStage):
    """A streaming stage whose work runs on an asyncio loop of its own (vllm_backend's
    engine host): `run` is an async generator, scheduled on that loop; the backend sends
    its responses from another thread, off the loop. Closing the generator (the client
    went away) is where an engine request is aborted."""

    def __init__(self, context: StageContext):
        super().__init__(context)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever,
                                        name=f"{context.name}-loop", daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        raise NotImplementedError
        yield {}  # pragma: no cover - makes this an async generator

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


@dataclass(frozen=True)
class RequestStart:
    """What a family's first stage derives from the ensemble inputs."""
    text: str
    voice: str
    params: Any            # the family parser's result
    seed: int              # the request's seed, or a random one
    stream_id: int         # random per request: keys per-stream state in later stages


def default_voice_only(voice: str, how: str) -> None:
    """A family without named voices takes voice "" or "default"; any other name is a 400
    that says `how` to get the voice wanted."""
    if voice not in ("", "default"):
        raise InvalidRequest(f"unknown voice {voice!r}: {how}")


def begin_request(inputs: Inputs, parser: Callable[[dict[str, Any]], Any]) -> RequestStart:
    """Check text, parse params with the family's parser, pick seed and stream_id."""
    text = check_text(inputs.scalar(TEXT, ""))
    params = parser(decode_params(inputs.scalar(PARAMS, "")))
    seed = getattr(params, "seed", None)
    return RequestStart(text, inputs.scalar(VOICE, ""), params,
                        seed if seed is not None else secrets.randbits(62), secrets.randbits(63))
