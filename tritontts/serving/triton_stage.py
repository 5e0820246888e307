"""The `tritontts` Python-based Triton backend: runs a stage class (tritontts.serving.stage) as a
Triton model. Importable only inside the Triton stub (or with a stand-in
`triton_python_backend_utils`, as the unit tests do).

A stage model's config.pbtxt says `backend: "tritontts"` and names its class:

    parameters { key: "stage" value: { string_value: "tritontts.families.piper.stages:PiperVitsStage" } }

Everything Triton-bound lives here, once for every stage: tensor names and output types
are read from the model config; each request's inputs become an `Inputs` dict; outputs
that are also inputs (stream metadata, forwarded tensors) pass through unless the stage
sets them; cancelled requests are skipped; request errors are tagged for HTTP 400.
"""
from __future__ import annotations

import importlib
import json
import locale
import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from . import cancellation
from .scheduling import ChunkScheduler
from ..protocol import (
    AUDIO, CHUNK_INDEX, INVALID_REQUEST_TAG, IS_FINAL, PARAMS, SAMPLE_RATE, STREAM_ID, TEXT, UNAVAILABLE_TAG,
    WORD_ALIGNER_LANGUAGES_ENV, WORD_TIMESTAMPS, WORDS_REQUEST, InvalidRequest, decode_params, words_request)
from .stage import EngineStage, Inputs, Stage, StageContext, StreamingStage
from ..voice import VOICE_FEATURES

# The stub's embedded interpreter starts in the C locale; torch and espeak data paths
# then fail on non-ASCII. Set it once, before any stage imports its heavy modules.
try:
    locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
except locale.Error:  # pragma: no cover - every supported image has C.UTF-8
    pass

logger = logging.getLogger("tritontts")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(os.environ.get("TRITONTTS_LOG_LEVEL", "INFO"))

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def load_stage_class(spec: str) -> type[Stage]:
    """`package.module:Class` -> the class (a Stage subclass)."""
    module_name, _, class_name = spec.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise ValueError(f"stage {spec!r} is not a tritontts.serving.stage.Stage subclass")
    return cls


def instance_device(args: dict) -> str:
    """Where this instance's tensors live: Triton names the instance's kind and device in
    initialize()'s args (KIND_GPU -> "GPU" and the GPU's index)."""
    if str(args.get("model_instance_kind", "CPU")).upper() == "GPU":
        return f"cuda:{int(args.get('model_instance_device_id', 0))}"
    return "cpu"


def audio_seconds(response) -> float:
    """Seconds of audio a response carries (0 for an error or no audio)."""
    audio = pb_utils.get_output_tensor_by_name(response, AUDIO)
    rate = pb_utils.get_output_tensor_by_name(response, SAMPLE_RATE)
    if audio is None or rate is None:
        return 0.0
    return audio.as_numpy().size / float(rate.as_numpy().reshape(-1)[0])


def error_response(exc: BaseException) -> "pb_utils.InferenceResponse":
    """Request errors carry INVALID_REQUEST_TAG so the front answers 400; the rest are 500."""
    if isinstance(exc, InvalidRequest):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(
            f"{INVALID_REQUEST_TAG} {exc}", pb_utils.TritonError.INVALID_ARG))
    logger.error("stage failure", exc_info=exc)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"internal error: {exc!r}"))


def send_response(sender, response, flags: int = 0, stage: str = "a stage") -> bool:
    """Send one response. One that cannot be sent (its tensors do not fit the stage's
    shared-memory region and /dev/shm has no room to grow it) ends its request with an error
    that says so (HTTP 503 at the front), instead of leaving the request without an end or
    stopping the thread that sends; False then. A sender already closed (the request has
    ended) is only logged."""
    try:
        sender.send(response, flags=flags)
        return True
    except Exception as exc:  # noqa: BLE001 - the request fails, not the stage
        logger.error("%s: sending a response failed: %s", stage, exc)
        if "shared memory" not in str(exc):
            return False
        from .shared_memory import free_text

        free = free_text()
        reason = (f"{UNAVAILABLE_TAG} {stage} could not send its response: it does not fit the shared memory "
                  f"Triton's Python backend moves tensors through (/dev/shm, {free}); retry later, or give the "
                  f"server more /dev/shm ({exc})")
        try:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(reason)), flags=FINAL)
        except Exception:  # noqa: BLE001 - nothing more can be said to this request
            logger.exception("%s: sending the error response failed too", stage)
        return False


def cancelled_response() -> "pb_utils.InferenceResponse":
    """For a request whose client went away: Triton 2.51 cancels an ensemble's later steps
    (not the step already running), so stages check and skip the work."""
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED))


class TritonPythonModel:
    """One class for every stage model; what differs is the stage class it hosts."""

    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        if "stage" not in parameters:
            raise ValueError(f"{config['name']}: config.pbtxt needs parameters "
                             '{ key: "stage" value: { string_value: "package.module:Class" } }')
        context = StageContext(
            name=config["name"], model_dir=Path(args["model_repository"]),
            version=str(args.get("model_version", "1")), parameters=parameters,
            instance_count=sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1,
            device=instance_device(args))
        self.input_names = [t["name"] for t in config.get("input", [])]
        self.output_types = {t["name"]: pb_utils.triton_string_to_numpy(t["data_type"])
                             for t in config.get("output", [])}
        self.passthrough = [n for n in self.output_types if n in self.input_names]
        # The first stage of a word-aligned server: words_request is made here from the
        # request's text and params (tritontts.protocol.words_request), then passed on.
        self.sets_words_request = WORDS_REQUEST in self.output_types and WORDS_REQUEST not in self.input_names
        if self.sets_words_request:
            self.passthrough.append(WORDS_REQUEST)
            languages = os.environ.get(WORD_ALIGNER_LANGUAGES_ENV)
            self.aligner_languages = tuple(languages.split(",")) if languages else None
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        cls = load_stage_class(parameters["stage"])
        streaming = issubclass(cls, StreamingStage)
        if streaming and not self.decoupled:
            raise ValueError(f"{context.name}: a streaming stage needs "
                             "model_transaction_policy { decoupled: true }")
        self.name = context.name
        self.stage = cls(context)
        # The stage computes a dynamic batch together (it overrides Stage.run_batch).
        self.batched = type(self.stage).run_batch is not Stage.run_batch
        self.scheduler = None
        self.responder = None
        if isinstance(self.stage, EngineStage):
            # Responses leave from a thread of their own, never from the engine's loop.
            self.responder = _Responder(context.name)
        # (A batched stage in a decoupled model, one response per request, needs no
        # scheduler: execute sends each result when the stage says it is ready, so a batch
        # computed in parts, OmniVoice's generator's later segments after their first, does
        # not hold the early results back.)
        elif not streaming and self.decoupled and not self.batched:
            # A one-response stage in a decoupled model: chunks of all streams are run by
            # the scheduler's workers, earliest chunk index first, and released in order
            # per stream; one instance owns that order.
            if context.instance_count != 1:
                raise ValueError(f"{context.name} must run one instance: its scheduler keeps "
                                 "each stream's chunks in order (raise `workers` instead)")
            # A stage that makes audio is scheduled by its listeners' deadlines.
            makes_audio = AUDIO in self.output_types and SAMPLE_RATE in self.output_types
            self.scheduler = ChunkScheduler(
                context.int_parameter("workers", 2), context.name,
                context.int_parameter("chunks_per_stream", 1),
                context.int_parameter("later_chunks_per_stream", 0) or None,
                played=audio_seconds if makes_audio else None,
                first_audio_target=context.int_parameter("first_audio_target_ms", 500) / 1000,
                margin=context.int_parameter("playback_margin_ms", 500) / 1000)

    # --- tensors ------------------------------------------------------------------------

    def inputs(self, request) -> Inputs:
        inputs = Inputs()
        # Triton marks a cancelled ensemble's later steps only; the front's cancel model
        # marks the running ones (tritontts/serving/cancellation.py).
        request_id = request.request_id()
        inputs.cancelled = lambda: request.is_cancelled() or cancellation.requested(request_id)
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                continue
            array = tensor.as_numpy()
            if array.shape[:1] != (1,):
                raise InvalidRequest(f"{name}: send one item per request (batch size 1), "
                                     f"got shape {list(array.shape)}")
            inputs[name] = array[0]
        if self.sets_words_request:
            params = decode_params(inputs.scalar(PARAMS, ""))
            named = WORD_TIMESTAMPS in params
            asked = words_request(inputs.scalar(TEXT, ""), params, self.aligner_languages)
            if named:       # words_request took the field out: the stage gets params without it
                inputs[PARAMS] = np.array([json.dumps(params).encode()], dtype=np.object_)
            inputs[WORDS_REQUEST] = np.array([asked.encode()], dtype=np.object_)
        return inputs

    def response(self, outputs: dict[str, Any], inputs: Inputs,
                 names: set[str] | None = None) -> "pb_utils.InferenceResponse":
        """The outputs in `names` (default: every declared output but voice_features)."""
        tensors = []
        for name, dtype in self.output_types.items():
            if (name not in names) if names else name == VOICE_FEATURES:
                continue
            if name in outputs:
                value = outputs[name]
            elif name in self.passthrough and name in inputs:
                value = inputs[name]
            else:
                raise RuntimeError(f"{self.stage.context.name} produced no {name!r}")
            if dtype == np.object_:
                value = [v.encode() if isinstance(v, str) else v for v in np.asarray(value, object).reshape(-1)]
            array = np.asarray(value, dtype=dtype)
            if array.ndim == 0:
                array = array.reshape(1)
            tensors.append(pb_utils.Tensor(name, array[None]))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    # --- execution ----------------------------------------------------------------------

    def execute(self, requests):
        if self.scheduler is not None:
            for request in requests:
                self._schedule(request)
            return None
        if isinstance(self.stage, EngineStage):
            for request in requests:
                self.stage.submit(self._stream_async(request, request.get_response_sender()))
            return None
        if isinstance(self.stage, StreamingStage):
            for request in requests:
                self._stream(request, request.get_response_sender())
            return None
        if self.decoupled:      # batched (initialize checked): each response when ready
            senders = [request.get_response_sender() for request in requests]
            sent = set()

            def send(slot, response):
                if slot not in sent:
                    sent.add(slot)
                    senders[slot].send(response, flags=FINAL)

            for slot, response in enumerate(self._respond_batch(requests, send)):
                send(slot, response)
            return None
        return self._respond_batch(requests)

    def _respond_batch(self, requests, send=None) -> list:
        """A batch of the dynamic batcher: voice encodings and bad or cancelled requests are
        answered one by one, the rest go to the stage's run_batch together. `send(slot,
        response)`, when given, is called for each result the stage reports ready early."""
        responses: list = [None] * len(requests)
        batch, slots = [], []
        for slot, request in enumerate(requests):
            try:
                if request.is_cancelled() or set(request.requested_output_names()) == {VOICE_FEATURES}:
                    responses[slot] = self._respond(request)
                    continue
                batch.append(self.inputs(request))
                slots.append(slot)
            except Exception as exc:
                responses[slot] = error_response(exc)
        def respond(slot, inputs, result):
            request = requests[slot]
            try:
                return (error_response(result) if isinstance(result, Exception) else
                        self.response(result, inputs,
                                      set(request.requested_output_names()) - {VOICE_FEATURES}))
            except Exception as exc:
                return error_response(exc)

        def ready(index, result):
            responses[slots[index]] = respond(slots[index], batch[index], result)
            send(slots[index], responses[slots[index]])

        if batch:
            try:
                results = self.stage.run_batch(batch, ready) if send else self.stage.run_batch(batch)
            except Exception as exc:
                results = [exc] * len(batch)
            for slot, inputs, result in zip(slots, batch, results):
                if responses[slot] is None:
                    responses[slot] = respond(slot, inputs, result)
        return responses

    def _respond(self, request) -> "pb_utils.InferenceResponse":
        if request.is_cancelled():  # the client went away: skip the work
            return cancelled_response()
        try:
            inputs = self.inputs(request)
            # A request for voice_features alone (the front storing a voice) encodes the
            # reference; the ensemble never maps that output, so it never asks for it.
            requested = set(request.requested_output_names())
            if requested == {VOICE_FEATURES}:
                return self.response({VOICE_FEATURES: [self.stage.encode_voice(inputs)]}, inputs, requested)
            return self.response(self.stage.run(inputs), inputs, requested - {VOICE_FEATURES})
        except Exception as exc:
            return error_response(exc)

    def _schedule(self, request) -> None:
        sender = request.get_response_sender()

        def deliver(result):
            send_response(sender, error_response(result) if isinstance(result, Exception) else result,
                          FINAL, self.name)

        try:
            inputs = self.inputs(request)
            stream_id = int(inputs.scalar(STREAM_ID))
            index = int(inputs.scalar(CHUNK_INDEX))
            final = bool(inputs.scalar(IS_FINAL))
        except Exception as exc:
            deliver(exc)
            return
        self.scheduler.submit(stream_id, index, final,
                              lambda: self._respond(request), deliver)

    def _stream(self, request, sender) -> None:
        """Send each chunk `run` yields; the last with the FINAL flag."""
        chunks = _Chunks(self, request)

        def send(response, flags=0):
            if not send_response(sender, response, flags, self.name):
                raise Unsent
        try:
            requested = set(request.requested_output_names())
            if requested == {VOICE_FEATURES}:   # the front storing a voice: one response
                inputs = chunks.inputs()
                send(self.response({VOICE_FEATURES: [self.stage.encode_voice(inputs)]}, inputs, requested), FINAL)
                return
            for chunk in self.stage.run(chunks.inputs()):
                if chunks.add(chunk, send):
                    return          # the final chunk has gone, and with it the sender
            chunks.finish(send)
        except Unsent:              # its request has ended with the reason (send_response)
            return
        except Exception as exc:  # the request fails, the model stays up
            send_response(sender, error_response(exc), FINAL, self.name)

    async def _stream_async(self, request, sender) -> None:
        send = self.responder.sender(sender)
        chunks = _Chunks(self, request)
        generator = None
        try:
            generator = self.stage.run(chunks.inputs())
            async for chunk in generator:
                if send.failed:      # the request has ended with the reason (send_response)
                    return
                if chunks.cancelled():
                    send(cancelled_response(), FINAL)
                    return
                if chunks.add(chunk, send):
                    return
            chunks.finish(send)
        except BaseException as exc:  # CancelledError included: every request gets its end
            send(error_response(exc if isinstance(exc, Exception) else RuntimeError(repr(exc))), FINAL)
        finally:
            if generator is not None:
                await generator.aclose()  # an unfinished generator aborts its engine work
            cancellation.clear(request.request_id())

    def finalize(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        self.stage.close()
        if self.responder is not None:
            self.responder.close()


class _Chunks:
    """Numbering and finality of one request's chunks (StreamingStage's contract)."""

    def __init__(self, model: TritonPythonModel, request):
        self.model, self.request = model, request
        self.index = 0
        self.held: dict[str, Any] | None = None
        self.numbered = CHUNK_INDEX in model.output_types and CHUNK_INDEX not in model.passthrough
        self._inputs: Inputs | None = None

    def inputs(self) -> Inputs:
        self._inputs = self.model.inputs(self.request)
        return self._inputs

    def cancelled(self) -> bool:
        return self._inputs.cancelled() if self._inputs is not None else self.request.is_cancelled()

    def _send(self, chunk: dict[str, Any], final: bool, send) -> None:
        if self.numbered:
            chunk.setdefault(CHUNK_INDEX, self.index)
        self.index += 1
        if IS_FINAL in self.model.output_types:
            chunk[IS_FINAL] = final
        send(self.model.response(chunk, self._inputs), FINAL if final else 0)

    def add(self, chunk: dict[str, Any], send) -> bool:
        """Send what can be sent; True once the request's final chunk has gone."""
        chunk = dict(chunk)
        if self.held is not None:
            self._send(self.held, False, send)
            self.held = None
        if IS_FINAL in chunk:
            final = bool(chunk[IS_FINAL])
            self._send(chunk, final, send)
            return final
        self.held = chunk
        return False

    def finish(self, send) -> None:
        if self.held is None:
            raise InvalidRequest("input has nothing to speak")
        self._send(self.held, True, send)
        self.held = None


class Unsent(Exception):
    """A response could not be sent; send_response has ended its request with the reason."""


class _QueuedSender:
    """One request's sender through a _Responder: `failed` once a response of it could not
    be sent (its request then has its end; the stage stops its work)."""

    def __init__(self, queue_: queue.Queue, sender):
        self.queue, self.sender, self.failed = queue_, sender, False

    def __call__(self, response, flags: int = 0) -> None:
        self.queue.put((self, response, flags))


class _Responder:
    """Sends responses from a thread of its own (vllm_backend keeps the engine loop free)."""

    def __init__(self, name: str):
        self.name = name
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=f"{name}-responses", daemon=True)
        self.thread.start()

    def sender(self, response_sender) -> "_QueuedSender":
        return _QueuedSender(self.queue, response_sender)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            queued, response, flags = item
            # A failure never stops other requests' responses (send_response).
            if not queued.failed and not send_response(queued.sender, response, flags, self.name):
                queued.failed = True

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=5)
