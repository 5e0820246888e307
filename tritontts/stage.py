"""Stage conventions shared by every family (no Triton import: the front uses them too).

Every family ensemble takes the same inputs and streams the same outputs, so the front,
tritonclient users and perf_analyzer talk to all families alike:

  inputs   text   BYTES [1]   UTF-8 text to speak
           voice  BYTES [1]   voice name ("" = the family's default voice)
           params BYTES [1]   JSON object of per-request parameters ("" = {}), validated
                              by the family's own parser (e.g. tritontts.piper.request)
  outputs  audio        FP32  [-1]  mono samples in [-1, 1] for one chunk
           sample_rate  INT32 [1]
           chunk_index  INT32 [1]   0, 1, 2, ... in order
           is_final     BOOL  [1]   true on the request's last chunk

Between stages, every chunk also carries stream_id (INT64 [1], random per request, set by
the family's first stage): any per-stream state in a later stage is keyed by it, never by
instance or arrival order.

Errors: a stage answers a bad request with a TritonError whose message starts with
INVALID_REQUEST_TAG; the front turns that into HTTP 400 with the rest of the message.
Any other error is a server fault (HTTP 500).

Stage classes: every stage model runs on our Python-based Triton backend (`backend:
"tritontts"`, tritontts/triton_stage.py), which instantiates the class named by the
config's `stage` parameter. A stage class only computes; the backend reads its inputs and
output types from config.pbtxt, checks cancellation, forwards the stream metadata, sends
responses and maps errors. Three kinds:

  Stage           run(inputs) -> outputs             one response per request; in a
                                                     decoupled model, scheduled earliest
                                                     chunk first (tritontts/scheduling.py);
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

TEXT, VOICE, PARAMS = "text", "voice", "params"
AUDIO, SAMPLE_RATE, CHUNK_INDEX, IS_FINAL = "audio", "sample_rate", "chunk_index", "is_final"
STREAM_ID = "stream_id"
ENSEMBLE_INPUTS = (TEXT, VOICE, PARAMS)
ENSEMBLE_OUTPUTS = (AUDIO, SAMPLE_RATE, CHUNK_INDEX, IS_FINAL)
STREAM_METADATA = (STREAM_ID, CHUNK_INDEX, IS_FINAL)

INVALID_REQUEST_TAG = "[invalid_request]"

# Longest text one request may carry; longer input is a 400, not an hour of audio.
MAX_INPUT_CHARS = 4096


class InvalidRequest(ValueError):
    """The request is wrong and the message says what to fix (HTTP 400)."""


def check_text(text: str) -> str:
    """The input text rules every family shares (the front checks them too, for a 400
    before Triton is asked)."""
    if not text or not text.strip():
        raise InvalidRequest("input is empty: give the text to speak")
    if len(text) > MAX_INPUT_CHARS:
        raise InvalidRequest(f"input is {len(text)} characters; the limit is {MAX_INPUT_CHARS}: "
                             "split it into several requests")
    return text


def parse_params(raw: str | bytes | None) -> dict[str, Any]:
    """Decode the `params` tensor: empty means no parameters."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="strict")
    if not raw:
        return {}
    try:
        params = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"params must be a JSON object: {exc}") from None
    if not isinstance(params, dict):
        raise InvalidRequest("params must be a JSON object")
    return params


def split_invalid_request(message: str) -> str | None:
    """Return the client-facing part of a stage error if it is a request error."""
    idx = message.find(INVALID_REQUEST_TAG)
    if idx < 0:
        return None
    return message[idx + len(INVALID_REQUEST_TAG):].strip()


def reject_unknown(params: dict[str, Any], known: set[str] | frozenset[str], family: str) -> None:
    """Every family's parser starts here: a field it does not know is a 400 naming it."""
    unknown = set(params) - set(known)
    if unknown:
        raise InvalidRequest(
            f"unknown parameter(s) {sorted(unknown)} for {family}; known: {sorted(known)}")


def reject_unsupported(params: dict[str, Any], unsupported: dict[str, str]) -> None:
    """Fields other families take that this one cannot honour: a 400 with the family's own
    reason. speed 1 and an automatic language mean "nothing asked", so they pass."""
    for name, why in unsupported.items():
        value = params.get(name)
        if value is None or (name == "speed" and value == 1) or (name == "language" and value in ("", "auto", "Auto")):
            continue
        raise InvalidRequest(f"{name}: {why}")


# Largest uploaded audio a request may carry (decoded), e.g. a voice-cloning reference.
MAX_AUDIO_PARAM_BYTES = 16 * 1024 * 1024


def audio_param(value: Any, name: str = "ref_audio") -> bytes:
    """An audio file sent inside the JSON params: base64, or a browser's data: URL."""
    import base64
    import binascii

    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{name} must be base64-encoded audio (wav, flac, mp3, ogg) or a data: URL")
    if value.startswith("data:"):   # data:audio/wav;base64,....
        value = value.partition(",")[2]
    if len(value) * 3 // 4 > MAX_AUDIO_PARAM_BYTES:
        raise InvalidRequest(f"{name} is larger than {MAX_AUDIO_PARAM_BYTES // 2**20} MiB")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{name} must be base64-encoded audio (wav, flac, mp3, ogg)") from None


def number_param(params: dict[str, Any], name: str, default: float | None,
                 low: float, high: float) -> float | None:
    """A numeric parameter within [low, high], or the default when absent/null."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{name} must be a number between {low} and {high}")
    if not low <= float(value) <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}, got {value}")
    return float(value)


def int_param(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """An integer parameter within [low, high], or None when absent/null."""
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def seed_param(params: dict[str, Any]) -> int | None:
    value = params.get("seed")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidRequest("seed must be a non-negative integer below 2**63")
    return value


def at_least_one_row(array: np.ndarray) -> np.ndarray:
    """Triton tensors here are never empty: a zero-row array travels as one zero row (the
    count travels beside it)."""
    return array if array.shape[0] else np.zeros((1,) + array.shape[1:], array.dtype)


# --- stage classes ----------------------------------------------------------------------

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
        path = self.model_dir / self.version / filename
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: {exc}") from None

    def int_parameter(self, name: str, default: int) -> int:
        return int(self.parameters.get(name, default))

    def checkpoint(self, family) -> Path | None:
        """This model's checkpoint: its `checkpoint` parameter (another checkpoint of the
        family, served beside the default one), else the family's default (launcher)."""
        path = self.parameters.get("checkpoint")
        return Path(path) if path else family.checkpoint()


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


class Stage:
    """One response per request: `run` returns the outputs by name. Outputs the config
    declares that are also inputs (stream_id, chunk_index, is_final, forwarded tensors) are
    passed through unless `run` sets them."""

    def __init__(self, context: StageContext):
        self.context = context

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

    def close(self) -> None:
        """Called when Triton unloads the model."""


class WindowDecoderStage(Stage):
    """A stateless chunk decoder (a causal codec or VAE): each request is a window of frames
    (`window` input, frames first) whose first `left_context` frames only give context, so
    the window's newer frames decode exactly as in the whole utterance. Windows of equal
    length, from any streams, are decoded as one batch; each keeps only its new samples.
    A subclass sets `window`, `hop` (samples per frame) and `sample_rate`, checks a window in
    `check_window` and decodes a stack of them in `decode_windows`."""

    window: str
    hop: int
    sample_rate: int

    def check_window(self, window: np.ndarray) -> None:
        """Raise InvalidRequest for a window this decoder cannot take."""

    def decode_windows(self, windows: np.ndarray) -> np.ndarray:
        """[B, frames, ...] -> audio [B, frames * hop]."""
        raise NotImplementedError

    def run(self, inputs: Inputs) -> dict[str, Any]:
        (result,) = self.run_batch([inputs])
        if isinstance(result, Exception):
            raise result
        return result

    def run_batch(self, batch: list[Inputs], ready: Callable[[int, Any], None] | None = None
                  ) -> list[dict[str, Any] | Exception]:
        results: list[dict[str, Any] | Exception | None] = [None] * len(batch)
        groups: dict[int, list[int]] = {}
        for i, inputs in enumerate(batch):
            window, context = inputs[self.window], int(inputs.scalar("left_context"))
            try:
                self.check_window(window)
                if not 0 <= context <= window.shape[0]:
                    raise InvalidRequest(f"left_context {context} is not within the window's {window.shape[0]} frames")
            except InvalidRequest as exc:
                results[i] = exc
                continue
            groups.setdefault(window.shape[0], []).append(i)
        for members in groups.values():
            audio = self.decode_windows(np.stack([np.asarray(batch[i][self.window]) for i in members]))
            for row, i in enumerate(members):
                skip = int(batch[i].scalar("left_context")) * self.hop
                results[i] = {AUDIO: audio[row, skip:], SAMPLE_RATE: self.sample_rate}
        return results  # type: ignore[return-value]


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


def begin_request(inputs: Inputs, parser: Callable[[dict[str, Any]], Any]) -> RequestStart:
    """Check text, parse params with the family's parser, pick seed and stream_id."""
    text = check_text(inputs.scalar(TEXT, ""))
    params = parser(parse_params(inputs.scalar(PARAMS, "")))
    seed = getattr(params, "seed", None)
    return RequestStart(text, inputs.scalar(VOICE, ""), params,
                        seed if seed is not None else secrets.randbits(62), secrets.randbits(63))
