"""Triton gRPC streaming for the front: one bidirectional stream per speech request, all
over one shared channel (asyncio client)."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Protocol

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from tritontts import protocol
from tritontts.serving.cancellation import CANCEL_MODEL, REQUEST_ID
from tritontts.voice import VOICE_FEATURES

logger = logging.getLogger("tritontts.frontend")


class TritonUnavailable(RuntimeError):
    """Triton cannot be reached or the model is not ready (HTTP 503)."""


class TritonBusy(RuntimeError):
    """A stage's queue is full (its config's queue policy): retry later (HTTP 429)."""


class StageRejected(ValueError):
    """A stage said the request is invalid (HTTP 400)."""


class StageFailed(RuntimeError):
    """A stage failed on a valid request (HTTP 500)."""


@dataclass
class AudioChunk:
    audio: np.ndarray
    sample_rate: int
    index: int
    final: bool
    # Word timestamps asked for: the words placed with this chunk ({word, start_ms, end_ms},
    # ms in the model's audio from the request's first sample); else None.
    words: list[dict] | None = None


class SpeechClient(Protocol):
    """What the front asks of Triton; TritonSpeechClient is the real one, and the front's
    unit tests serve a scripted one in its place (tests/front/fake_triton.py)."""

    def synthesize(self, model: str, text: str, voice: str, params: dict,
                   request_id: str) -> AsyncIterator[AudioChunk]: ...

    async def encode_voice(self, model: str, params: dict) -> bytes: ...

    async def model_ready(self, model: str) -> bool: ...

    async def server_ready(self) -> bool: ...

    async def close(self) -> None: ...


def _bytes_input(name: str, value: str) -> InferInput:
    tensor = InferInput(name, [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[value.encode("utf-8")]], dtype=np.object_))
    return tensor


def _classify(message: str) -> Exception:
    client_part = protocol.split_invalid_request(message)
    if client_part is not None:
        return StageRejected(client_part)
    if "Exceeds maximum queue size" in message:
        return TritonBusy(message)
    unavailable = protocol.split_unavailable(message)
    if unavailable is not None:
        return TritonUnavailable(unavailable)
    if any(s in message for s in ("failed to connect", "StatusCode.UNAVAILABLE", "not ready", "is not healthy",
                                  "Request for unknown model", "is not found")):
        return TritonUnavailable(message)
    return StageFailed(message)


class StageStalled(RuntimeError):
    """No chunk within the stall timeout: a stage died or hangs (HTTP 503)."""


async def _bounded(responses, seconds: float, progress: Callable[[], Awaitable[int | None]] | None = None):
    """The stream's responses, each within `seconds` of the one before, while the server
    works: with `progress` (a count of the pipeline's executions, None if unknown), a wait
    past `seconds` in which that count grew is queueing behind other requests' work, not a
    stall, and the stream waits on (the request timeout still bounds it)."""
    iterator = responses.__aiter__()
    # The count at the start, asked beside the stream (never delaying its first response)
    # and awaited only if a wait runs past `seconds`.
    baseline = asyncio.ensure_future(progress()) if progress is not None else None
    seen: int | None = None
    pending: asyncio.Task | None = None
    try:
        while True:
            # The wait for the next response is never cancelled by a timeout (that would end
            # the stream): the same task is waited on again while the server makes progress.
            pending = pending or asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=seconds)
            if done:
                task, pending = pending, None
                try:
                    item = task.result()
                except StopAsyncIteration:
                    return
                yield item
                continue
            if baseline is not None and seen is None:
                seen = await baseline
            now = await progress() if progress is not None else None
            if seen is not None and now is not None and now > seen:
                seen = now
                logger.info("no audio for %g s, but the server is executing this model's stages: "
                            "still waiting (queued behind other requests)", seconds)
                continue
            idle = " and none of its stages executed anything" if now is not None else ""
            raise StageStalled(f"no audio for {seconds:g} s{idle}: a stage stopped responding "
                               "(it died or hangs); retry")
    finally:
        for task in (pending, baseline):
            if task is not None and not task.done():
                task.cancel()


async def _ended(responses, seconds: float) -> None:
    """Wait up to `seconds` for the server to end a stream (what is left of it is read)."""
    async def rest():
        async for _ in responses:
            pass

    try:
        await asyncio.wait_for(rest(), seconds)
    except Exception:  # noqa: BLE001 - it is cancelled next, as any other stream
        pass


class TritonSpeechClient:
    def __init__(self, url: str, request_timeout_s: float = 600.0, stall_timeout_s: float = 120.0):
        """stall_timeout_s: the longest wait for a stream's next chunk while its stages
        execute nothing. A stage whose process dies mid-request never answers it (Triton
        does not fail the ensemble), so without this bound the client would wait for the
        whole request timeout; a stream queued behind other requests' work (its stages
        finishing executions meanwhile) waits on, up to the request timeout."""
        self.url = url
        self.request_timeout_s = request_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self._client = grpcaio.InferenceServerClient(url)
        self._steps: dict[str, frozenset[str]] = {}      # an ensemble's stage models
        self._cancelling: set[asyncio.Task] = set()

    async def close(self):
        await self._client.close()

    async def server_ready(self) -> bool:
        try:
            return await self._client.is_server_ready()
        except Exception:
            return False

    async def model_ready(self, model: str) -> bool:
        try:
            return await self._client.is_model_ready(model)
        except Exception:
            return False

    async def pipeline_executions(self, model: str) -> int | None:
        """How many executions the ensemble `model`'s stages have finished (Triton's
        statistics), None if the server cannot say: what tells a stream queued behind other
        requests' work from one whose stage died."""
        try:
            steps = self._steps.get(model)
            if steps is None:
                config = (await self._client.get_model_config(model, as_json=True))["config"]
                steps = frozenset(step["model_name"] for step in
                                  config.get("ensemble_scheduling", {}).get("step", [])) or frozenset([model])
                self._steps[model] = steps
            stats = await self._client.get_inference_statistics(as_json=True)
            return sum(int(m.get("execution_count", 0)) for m in stats.get("model_stats", [])
                       if m.get("name") in steps)
        except Exception:  # noqa: BLE001 - unknown progress: the plain stall bound applies
            return None

    async def encode_voice(self, model: str, params: dict) -> bytes:
        """A reference's packed features from a family's voice encoder stage (its prompt
        stage, asked for its voice_features output alone; tritontts/voice.py). Sent on a
        stream: a decoupled prompt stage (one that streams segments) takes no unary call."""
        request = {
            "model_name": model,
            "inputs": [_bytes_input(protocol.TEXT, ""), _bytes_input(protocol.VOICE, "default"),
                       _bytes_input(protocol.PARAMS, json.dumps(params))],
            "outputs": [InferRequestedOutput(VOICE_FEATURES)],
        }

        async def one_request():
            yield request

        responses = None
        try:
            responses = self._client.stream_infer(one_request(), stream_timeout=self.request_timeout_s)
            async for result, error in responses:
                if error is not None:
                    raise _classify(str(error))
                return bytes(result.as_numpy(VOICE_FEATURES).reshape(-1)[0])
            raise StageFailed(f"{model} ended the stream without voice features")
        except InferenceServerException as exc:
            raise _classify(str(exc)) from None
        except grpc.aio.AioRpcError as exc:
            raise TritonUnavailable(f"{exc.code().name}: {exc.details()}") from None
        finally:
            if responses is not None:
                responses.cancel()

    async def synthesize(self, model: str, text: str, voice: str, params: dict,
                         request_id: str) -> AsyncIterator[AudioChunk]:
        """Yield the ensemble's chunks in order until the one marked final."""
        request = {
            "model_name": model,
            "inputs": [_bytes_input(protocol.TEXT, text), _bytes_input(protocol.VOICE, voice),
                       _bytes_input(protocol.PARAMS, json.dumps(params))],
            "outputs": [InferRequestedOutput(name) for name in protocol.ENSEMBLE_OUTPUTS],
            "request_id": request_id,
        }
        aligned = params.get(protocol.WORD_TIMESTAMPS) is True
        if aligned:         # the word_aligner ends the ensemble (a --word-aligner server)
            request["outputs"].append(InferRequestedOutput(protocol.WORDS))

        async def one_request():
            yield request

        try:
            responses = self._client.stream_infer(one_request(), stream_timeout=self.request_timeout_s)
        except InferenceServerException as exc:
            raise _classify(str(exc)) from None
        expected = 0
        finished = False
        try:
            async for result, error in _bounded(responses, self.stall_timeout_s,
                                                lambda: self.pipeline_executions(model)):
                if error is not None:
                    raise _classify(str(error))
                chunk = AudioChunk(
                    audio=result.as_numpy(protocol.AUDIO).reshape(-1),
                    sample_rate=int(result.as_numpy(protocol.SAMPLE_RATE).reshape(-1)[0]),
                    index=int(result.as_numpy(protocol.CHUNK_INDEX).reshape(-1)[0]),
                    final=bool(result.as_numpy(protocol.IS_FINAL).reshape(-1)[0]),
                    words=(json.loads(bytes(result.as_numpy(protocol.WORDS).reshape(-1)[0]))
                           if aligned else None))
                if chunk.index != expected:
                    raise StageFailed(f"chunk {chunk.index} arrived, expected {expected}")
                expected += 1
                # Finished as soon as the final chunk is out: a caller that stops reading
                # there (every caller does) has nothing left running to cancel.
                finished = chunk.final
                yield chunk
                if finished:
                    return
            raise StageFailed("the stream ended before the final chunk")
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise TritonUnavailable(f"{exc.code().name}: {exc.details()}") from None
            raise _classify(f"{exc.code().name}: {exc.details()}") from None
        finally:
            try:
                if finished:
                    # Triton ends a finished stream itself, at once (< 1 ms). Cancelling it
                    # instead races Triton's release of the ensemble request: in about half
                    # of the server stops that followed, the ensemble never unloaded and
                    # tritonserver waited out its whole exit timeout.
                    await _ended(responses, 1.0)
            finally:
                # Stop the server-side work if the caller went away (client disconnect) or
                # the stream failed: Triton stops the ensemble's later steps, the cancel
                # model the steps already running (a talker mid-generation).
                responses.cancel()
                if not finished:
                    task = asyncio.get_running_loop().create_task(self._cancel(request_id))
                    self._cancelling.add(task)
                    task.add_done_callback(self._cancelling.discard)

    async def _cancel(self, request_id: str) -> None:
        try:
            await self._client.infer(CANCEL_MODEL, [_bytes_input(REQUEST_ID, request_id)],
                                     client_timeout=10)
        except Exception as exc:  # noqa: BLE001 - best effort; Triton may be gone
            logger.warning("could not cancel %s in the running stages: %s", request_id, exc)
