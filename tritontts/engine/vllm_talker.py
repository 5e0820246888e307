"""The engine host every talker shares: vLLM's engine core in the stage's own process,
stepped by a thread of its own (InprocEngine), behind an async interface on the stage's
asyncio loop (Triton's vllm_backend shape). A talker folder is config.pbtxt + 1/model.json:

  {"engine_args": {...},   vLLM EngineArgs, as-is (the only place they are set)
   ...}                    the family's own talker settings (e.g. CosyVoice3's "hops")

A family's talker subclasses VllmTalkerStage: it names the model folder vLLM loads
(`model_path`), adds what the engine needs beyond model.json (`engine_extras`, e.g. logits
processors) and implements `run` with `generate`. A talker whose model shares per-request
state with the stage (tritontts.engine.vllm_frames: per-frame sub-models) sets
`shares_rows = True`, which adds the RowTracker that maps batch rows to requests.

Why in this process, not AsyncLLM's engine-core process: a model that shares state with
the stage needs it here (AsyncLLM cannot host its core in-process: "Running EngineCore in
asyncio without multiprocessing is not currently supported"), and on a CPU the core's own
process is spawned and imports vLLM again, then spawns a worker process that does the same
(vLLM forces both on CPU) and reserves a core for the scheduler: CosyVoice3's tiny talker
loaded in 28-44 s instead of 57-72 s, and served 1.20-1.24x the audio-seconds per second at
concurrency 1 (docs/benchmarks.md, "The talker's engine host").
"""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from typing import Any, AsyncIterator, Callable, Iterator

from ..serving.stage import EngineStage, StageContext
from .engine_dtype import DTYPE_ENV
from .kv_budget import (DEFAULT_KV_REQUESTS, GIB, SizingError, engine_capacity, read_config, size_cpu_kv,
                        size_gpu_share, stored_dtype)

logger = logging.getLogger("tritontts.talker")


class TalkerCancelled(Exception):
    """The client went away; the engine request was aborted."""


# The launcher's --engine-arg STAGE.KEY=VALUE, handed to tritonserver's stages as JSON
# {stage: {key: value}}: engine arguments over model.json's (a released checkpoint's KV
# budget or dtype) without editing the repository.
ENGINE_ARGS_ENV = "TRITONTTS_ENGINE_ARGS"
# The launcher's --kv-requests N: full-length requests every vLLM stage's KV cache holds.
KV_REQUESTS_ENV = "TRITONTTS_KV_REQUESTS"


def engine_arg_overrides(stage: str, environ=None) -> dict[str, Any]:
    import json

    text = (os.environ if environ is None else environ).get(ENGINE_ARGS_ENV, "")
    return dict(json.loads(text).get(stage, {})) if text else {}


# A request's max_new_tokens, handed from its prompt stage to a talker that generates its
# segments one after another (INT32 [1]; 0: no cap beyond each segment's own).
TOKEN_BUDGET = "token_budget"


class TokenBudget:
    """max_new_tokens counted across a request's segments: each segment's token bounds are
    cut to what is left, and the segment that spends it is the request's last."""

    def __init__(self, total: int | None):
        self.left = total

    @classmethod
    def of(cls, inputs) -> "TokenBudget":
        return cls(int(inputs.scalar(TOKEN_BUDGET, 0)) or None)

    def bounds(self, min_tokens: int, max_tokens: int) -> tuple[int, int]:
        if self.left is None:
            return min_tokens, max_tokens
        return min(min_tokens, self.left), min(max_tokens, self.left)

    def spent_by(self, tokens: int) -> bool:
        """Whether a segment that made `tokens` so far has used all that was left."""
        return self.left is not None and tokens >= self.left

    def spend(self, tokens: int) -> bool:
        """Counts a finished segment's tokens; True when nothing is left."""
        if self.left is None:
            return False
        self.left -= tokens
        return self.left <= 0


def no_audio():
    """What a talker whose engine made no frame at all answers (it cannot happen: an engine
    request ends after a step, which makes a frame, the end frame included); a talker whose
    first frame was the end sends an empty final chunk instead (a valid, empty response)."""
    from ..protocol import InvalidRequest

    return InvalidRequest("the model made no frame: try another seed or other text")


def register_vllm_model(architecture: str, model_class: str) -> None:
    """Register an out-of-tree vLLM model ("module:Class", imported by vLLM when first
    built) under its architecture name, once per process."""
    from vllm import ModelRegistry

    if architecture not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(architecture, model_class)


def parse_engine_arg(text: str) -> tuple[str, str, Any]:
    """STAGE.KEY=VALUE -> (stage, key, value); VALUE is JSON when it parses as JSON (numbers,
    true/false), else a string. ValueError says what is wrong."""
    import json

    target, sep, value = text.partition("=")
    stage, dot, key = target.partition(".")
    if not sep or not dot or not stage or not key:
        raise ValueError(f"--engine-arg takes STAGE.KEY=VALUE (e.g. fish_s2_pro_talker.dtype=bfloat16), "
                         f"got {text!r}")
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return stage, key, parsed


class VllmTalkerStage(EngineStage):
    shares_rows = False     # the model keeps per-request state with this stage (vllm_frames)

    def __init__(self, context: StageContext):
        super().__init__(context)
        self.settings = context.settings("model.json")
        overrides = engine_arg_overrides(context.name)
        engine_args = {**self.settings["engine_args"], **overrides}
        self.max_model_len = int(engine_args["max_model_len"])
        args = {**engine_args, **self.engine_extras()}
        try:
            config, _ = read_config(self.model_path())
        except SizingError:
            config = None           # an engine without config.json: vLLM says what it lacks
        args["dtype"] = self._dtype(context, overrides.get("dtype") or os.environ.get(DTYPE_ENV)
                                    or engine_args.get("dtype", "auto"), config or {})
        asked = os.environ.get(KV_REQUESTS_ENV)
        requests = int(asked or DEFAULT_KV_REQUESTS)
        self.kv_budget = None
        if not context.device.startswith("cuda") and not {"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(args):
            # The KV cache from the checkpoint's config (kv_budget); a given byte count or
            # share (--engine-arg) wins.
            from .engine_dtype import bf16_kind, cpu_bf16_flags

            self.kv_budget = size_cpu_kv(context.name, self.model_path(), args, requests, config=config,
                                         asked=asked is not None, bf16=bf16_kind(cpu_bf16_flags()))
            args["kv_cache_memory_bytes"] = self.kv_budget.bytes
            logger.info("%s: %s", context.name, self.kv_budget.describe())
            if self.kv_budget.requests < requests:
                logger.warning("%s: the KV cache holds %d of the default %d full-length requests: that is what "
                               "fits beside the weights (%.2f GiB) in the memory the other stages left; more "
                               "requests at once wait in vLLM's queue (or are preempted). --kv-requests N "
                               "asks for N and refuses a launch that cannot hold them", context.name,
                               self.kv_budget.requests, requests, self.kv_budget.weights / GIB)
        elif context.device.startswith("cuda") and "gpu_memory_utilization" in args \
                and "gpu_memory_gib" in self.settings and "kv_cache_memory_bytes" not in args:
            # On a GPU the profile's share of the card sets the cache; the checkpoint's
            # weights and full-length requests must fit in it.
            self.kv_budget = size_gpu_share(context.name, self.model_path(), args, requests,
                                            int(float(self.settings["gpu_memory_gib"]) * GIB), config=config)
            logger.info("%s: %s within gpu_memory_utilization %s", context.name, self.kv_budget.describe(),
                        args["gpu_memory_utilization"])
        pin_engine_gpu(context.device)
        self.engine = InprocEngine(self.model_path(), args, self.loop)
        self.kv_capacity = self._report_capacity(context.name)

    def _dtype(self, context: StageContext, given: str, config: dict) -> str:
        """The engine's dtype (engine_dtype.resolve_dtype: "auto" is the checkpoint's own
        where the device runs it well), logged with the reason."""
        from .engine_dtype import cpu_bf16_flags, resolve_dtype

        dtype, why = resolve_dtype(given, stored_dtype(self.model_path(), config), context.device,
                                   cpu_bf16_flags())
        logger.info("%s: dtype %s (%s)", context.name, dtype, why)
        return dtype

    def _report_capacity(self, stage: str) -> float | None:
        """Full-length requests the built engine holds (vLLM's own count), logged; a warning
        when fewer than the budget was sized for (the checkpoint's config misread)."""
        try:
            capacity = engine_capacity(self.engine.vllm_config)
        except AttributeError:
            return None
        if capacity is None:
            return None
        logger.info("%s: the KV cache holds %.2f requests of %d positions", stage, capacity, self.max_model_len)
        if self.kv_budget is not None and capacity < self.kv_budget.requests - 0.01:
            logger.warning("%s: sized for %d requests but vLLM fits %.2f: the KV estimate from %s/config.json "
                           "is short; set --engine-arg %s.kv_cache_memory_bytes", stage, self.kv_budget.requests,
                           capacity, self.model_path(), stage)
        return capacity

    def model_path(self) -> str:
        raise NotImplementedError

    def engine_extras(self) -> dict[str, Any]:
        """Beyond model.json. A model that keeps per-request state with the stage
        (tritontts.engine.vllm_frames) needs the RowTracker, and takes token ids, not text."""
        if self.shares_rows:
            from .vllm_frames import ROW_TRACKER

            return {"skip_tokenizer_init": True, "logits_processors": [ROW_TRACKER]}
        return {}

    async def generate(self, prompt_ids: list[int], sampling_params, request_id: str,
                       cancelled: Callable[[], bool] = lambda: False) -> AsyncIterator[list[int]]:
        """The token ids generated so far, after each engine step. A cancelled client, or a
        consumer that stops early, aborts the engine request."""
        from vllm import TokensPrompt

        finished = False
        try:
            async for output in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids),
                                                     sampling_params, request_id):
                if cancelled():
                    logger.info("talker request %s cancelled", request_id)
                    raise TalkerCancelled("the client cancelled the request")
                yield output.outputs[0].token_ids
                finished = output.finished
        finally:
            if not finished:
                await self.engine.abort(request_id)

    def close(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            super().close()


def pin_engine_gpu(device: str) -> None:
    """Put the engine on the instance's GPU: vLLM takes the first visible GPU, so a
    KIND_GPU instance on GPU N makes N the only one it sees. Must happen before anything
    in this stub process starts CUDA, which stage construction guarantees (the engine is
    its first CUDA user)."""
    if not device.startswith("cuda"):
        return
    import torch

    index = device.partition(":")[2] or "0"
    if torch.cuda.is_initialized():
        logger.warning(f"CUDA already started in this process; the engine stays on the "
                       f"current GPU, not {device}")
        return
    # Triton's device id counts the GPUs this process already sees.
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[int(index)] if visible else index


class InprocEngine:
    """vLLM's LLMEngine with its engine core in this process, driven by one thread: requests
    and aborts reach it through a queue, outputs go back to each request's asyncio queue on
    the stage's loop. AsyncLLM's async surface (generate, abort, shutdown)."""

    def __init__(self, model: str, args: dict[str, Any], loop: asyncio.AbstractEventLoop):
        # Read by vLLM when the engine is built: the core must be an InprocClient.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.loop = loop
        self.commands: queue.Queue = queue.Queue()
        self.streams: dict[str, asyncio.Queue] = {}
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        self.preemptions = 0                          # requests vLLM preempted (KV cache full), in all
        self._preempted: dict[str, int] = {}          # engine request id -> its preemptions so far
        self.thread = threading.Thread(target=self._run, args=(model, args),
                                       name="vllm-inproc-engine", daemon=True)
        self.thread.start()
        self.ready.wait()
        if self.failure is not None:
            raise RuntimeError(f"the in-process vLLM engine failed to start: {self.failure!r}") \
                from self.failure

    def _run(self, model: str, args: dict[str, Any]) -> None:
        try:
            from vllm.engine.arg_utils import EngineArgs
            from vllm.v1.engine.llm_engine import LLMEngine

            engine = LLMEngine.from_engine_args(EngineArgs(model=model, **args))
            self.vllm_config = engine.vllm_config
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor
            # A build refused late (a KV cache too large for the node) has already set up
            # torch.distributed and vLLM's parallel groups in this process: undo them, so a
            # retry in the same process (a model reload) does not find them taken.
            release_vllm_parallel_state()
            self.failure = exc
            self.ready.set()
            return
        self.ready.set()
        try:
            self._serve(engine)
        finally:
            # The engine core's own shutdown frees the KV cache and the worker at finalize
            # (and where a stage runs inside a longer-lived process, e.g. a test's).
            try:
                engine.engine_core.shutdown()
            finally:
                release_vllm_parallel_state()

    def _serve(self, engine) -> None:
        while True:
            # Block for work only when nothing is running.
            try:
                command = self.commands.get(block=not engine.has_unfinished_requests())
            except queue.Empty:
                command = None
            while command is not None:
                if command[0] == "stop":
                    return
                if command[0] == "add":
                    _, request_id, prompt, params = command
                    try:
                        engine.add_request(request_id, prompt, params)
                    except Exception as exc:  # noqa: BLE001 - the request fails, not the engine
                        self._deliver(request_id, exc)
                elif command[0] == "abort":
                    engine.abort_request([command[1]])
                try:
                    command = self.commands.get_nowait()
                except queue.Empty:
                    command = None
            if engine.has_unfinished_requests():
                try:
                    outputs = engine.step()
                except Exception as exc:  # noqa: BLE001 - every waiting request learns of it
                    logger.exception("vLLM engine step failed")
                    for request_id in list(self.streams):
                        self._deliver(request_id, exc)
                    continue
                self._count_preemptions(engine)
                for output in outputs:
                    self._deliver(output.request_id, output)

    def _count_preemptions(self, engine) -> None:
        """Log each time vLLM preempts a request (its KV cache full: the request waits and
        is recomputed when room frees), with the count so far; vLLM itself only counts them
        in its metrics. The KV sizing (kv_budget) is meant to make this never happen."""
        scheduler = getattr(getattr(engine.engine_core, "engine_core", None), "scheduler", None)
        requests = getattr(scheduler, "requests", None) or {}
        for request_id in set(self._preempted) - set(requests):
            del self._preempted[request_id]          # finished or aborted
        for request_id, request in requests.items():
            count = getattr(request, "num_preemptions", 0)
            if count > self._preempted.get(request_id, 0):
                self.preemptions += count - self._preempted.get(request_id, 0)
                self._preempted[request_id] = count
                logger.warning("vLLM preempted request %s: the KV cache is full (%d preemption(s) in this "
                               "engine so far); size it for more requests with --kv-requests", request_id,
                               self.preemptions)

    def _deliver(self, request_id: str, item) -> None:
        stream = self.streams.get(request_id)
        if stream is not None:
            self.loop.call_soon_threadsafe(stream.put_nowait, item)

    async def generate(self, prompt, params, request_id: str):
        stream: asyncio.Queue = asyncio.Queue()
        self.streams[request_id] = stream
        self.commands.put(("add", request_id, prompt, params))
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self.streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))

    def shutdown(self) -> None:
        self.commands.put(("stop",))
        self.thread.join(timeout=30)


def release_vllm_parallel_state() -> None:
    """vLLM's own cleanup of torch.distributed and its parallel groups (a no-op where
    nothing is set, and where vLLM itself failed to import)."""
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    except ImportError:
        return
    cleanup_dist_env_and_memory()


def chunk_sizes(chunk_frames: int = 25, initial_chunk_frames: int = 0,
                growth: int | None = None) -> Iterator[int]:
    """Frames per chunk of a stream, in order, without end: a first chunk of
    initial_chunk_frames when 0 < initial_chunk_frames < chunk_frames, then chunk_frames
    each (vLLM-Omni's qwen3_tts boundaries) or, with `growth`, each chunk `growth` times
    the one before, up to chunk_frames."""
    if chunk_frames <= 0 or not 0 <= initial_chunk_frames <= chunk_frames or (growth or 2) < 2:
        raise ValueError(f"need chunk_frames > 0, 0 <= initial_chunk_frames <= chunk_frames "
                         f"and growth >= 2 if given, got {chunk_frames}, {initial_chunk_frames}, {growth}")
    size = initial_chunk_frames if 0 < initial_chunk_frames < chunk_frames else chunk_frames
    while True:
        yield size
        size = min(chunk_frames, size * growth) if growth else chunk_frames


class FrameChunkTalkerStage(VllmTalkerStage):
    """An in-process frame talker (tritontts.engine.vllm_frames.LogitsFrameTalker) whose frames go
    to a stateless codec stage in chunks: first_frames, then frames each (model.json's
    "chunks"), each after up to left_context_frames earlier frames. The family says which
    frame ends the stream (`is_end`: not audio, and only ever the last) and what codes a
    window of frames sends (`window_codes`); `positioned` also sends the window's first
    frame (a codec whose positions are absolute)."""

    shares_rows = True
    positioned = False

    def __init__(self, context: StageContext, default_left_context: int | None = None):
        super().__init__(context)
        chunks = self.settings["chunks"]
        self.chunk_frames, self.first_chunk_frames = int(chunks["frames"]), int(chunks["first_frames"])
        self.left_context_frames = int(chunks.get("left_context_frames") or default_left_context or 0)

    def is_end(self, frame) -> bool:
        raise NotImplementedError

    def window_codes(self, frames):
        """Frames [n, C] (a tensor) -> the codec's codes for them (a numpy array [n, width])."""
        raise NotImplementedError

    def frame_budget(self, prompt_positions: int, asked: int, shorten: str = "the text") -> int:
        """The audio frames a request may make: what it asked for, within what the talker's
        max_model_len leaves after its prompt and the one frame that ends it; a 400 if none."""
        from ..protocol import InvalidRequest

        max_frames = min(asked, self.max_model_len - prompt_positions - 1)
        if max_frames < 1:
            raise InvalidRequest(f"the prompt needs {prompt_positions} of the talker's {self.max_model_len} "
                                 f"positions: shorten {shorten}")
        return max_frames

    async def stream_frames(self, prompt_ids: list[int], stream, key: str, max_frames: int, stop_token: int,
                            cancelled: Callable[[], bool]) -> AsyncIterator[dict[str, Any]]:
        """Run one request's frame stream (its model-side state, registered under `key` for the
        model to find) for up to max_frames audio frames plus the frame that may end them (the
        stop token), yielding its chunks; the stream is released however the request ends."""
        from vllm import SamplingParams

        from .vllm_frames import FRAMES_ARG, register, release

        register(key, stream)
        params = SamplingParams(temperature=0.0, max_tokens=max_frames + 1, stop_token_ids=[stop_token],
                                detokenize=False, extra_args={FRAMES_ARG: key})
        try:
            async for chunk in self.frame_chunks(prompt_ids, params, key, stream.frames, max_frames, cancelled):
                yield chunk
        finally:
            release(key)

    async def frame_chunks(self, prompt_ids: list[int], params, key: str, frames: list, max_frames: int,
                           cancelled: Callable[[], bool]) -> AsyncIterator[dict[str, Any]]:
        """Generate, and yield each chunk as soon as its frames are made (`frames` is the
        stream's list the model appends to)."""
        sizes = chunk_sizes(self.chunk_frames, self.first_chunk_frames)
        sent, size = 0, next(sizes)
        async for _ in self.generate(prompt_ids, params, key, cancelled):
            audio = self.audio_frames(frames, max_frames)
            while audio >= sent + size:
                yield self.chunk(frames, sent, sent + size, final=False)
                sent, size = sent + size, next(sizes)
        audio = self.audio_frames(frames, max_frames)
        if not frames:
            raise no_audio()
        # audio == sent (a stop at the first frame or on a chunk boundary): an empty final chunk.
        yield self.chunk(frames, sent, audio, final=True)

    def audio_frames(self, frames: list, limit: int) -> int:
        """Frames that are audio, at most `limit`: all but an end frame, which can only be
        the last (the engine stops at it)."""
        ended = bool(frames) and self.is_end(frames[-1])
        return min(len(frames) - ended, limit)

    def chunk(self, frames: list, start: int, end: int, final: bool) -> dict[str, Any]:
        import numpy as np
        import torch

        from ..protocol import IS_FINAL

        first = max(0, start - self.left_context_frames)
        position = {"first_frame": first} if self.positioned else {}
        if end <= first:      # nothing to voice and no context (a stop at the first frame):
            # one zero frame, all context, which every codec answers with no audio
            codes = self.window_codes(torch.stack(frames[:1]))
            return {"codes": np.zeros_like(codes), "left_context": 1, **position, IS_FINAL: final}
        return {"codes": self.window_codes(torch.stack(frames[first:end])), "left_context": start - first,
                **position, IS_FINAL: final}
