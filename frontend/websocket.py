"""WebSocket /v1/audio/speech/stream: text in as it is written, audio out as it is spoken.

Client -> server (JSON text messages):
    {"type": "session.config", ...}   the speech fields (no input) + split_granularity
                                      ("none", the default, "sentence" or "clause");
                                      first, within CONFIG_TIMEOUT_S; again between utterances
    {"type": "input.text", "text": "..."}   more text of the current utterance
    {"type": "input.done"}            the utterance is complete: speak the rest; the
                                      connection stays open for the next one
    {"type": "session.close"}         finish what was sent, then close
Server -> client:
    {"type": "audio.start", "utterance_index", "sentence_index", "sentence_text", "format",
     "sample_rate"}, then binary frames of encoded audio, then
    {"type": "audio.done", "utterance_index", "sentence_index", "total_bytes", "error"}
    {"type": "session.done", "utterance_index", "total_sentences"}   after input.done
    {"type": "error", "message", "status", "param"}

By default (split_granularity "none", as vLLM-Omni) the text buffered until input.done is
one request, one "sentence" of the utterance. With "sentence" (or "clause") a sentence is
synthesized as soon as it is complete, before input.done: an LLM streaming its answer into
TTS is heard while it is still writing. Sentences are spoken in order, one after another, by
one task per session; a client that goes away cancels the sentence being synthesized (its
Triton stream and admission slot are freed) and drops the rest.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from contextlib import aclosing
from dataclasses import dataclass, field

from fastapi import WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from tritontts.protocol import MAX_INPUT_CHARS

from .encoding import AudioEncoder
from .media import MediaError, resolve_audio
from .protocol import SessionConfig, SpeechRequest
from .serving import SpeechError, SpeechService, speech_error

logger = logging.getLogger("tritontts.frontend.websocket")

CONFIG_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 120.0
MAX_CONFIG_BYTES = 24 * 1024 * 1024      # a config may carry ref_audio (base64)
MAX_TEXT_MESSAGE_BYTES = 64 * 1024
POLICY_VIOLATION = 1008

# A sentence ends at . ! ? (or CJK 。！？) followed by space; "clause" also cuts at , ; :.
_SENTENCE_END = re.compile(r"([.!?…]+[\"')\]]*)(\s+)|([。！？]+)")
_CLAUSE_END = re.compile(r"([.!?…,;:]+[\"')\]]*)(\s+)|([。！？，；：、]+)")
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "sr", "jr", "vs", "etc", "e.g", "i.e",
                  "no", "fig", "mt", "inc", "ltd", "co"}


class TextSplitter:
    """Cuts text fed piece by piece into complete sentences (or clauses) as they complete."""

    def __init__(self, granularity: str = "sentence"):
        self.granularity = granularity
        self.buffer = ""

    def feed(self, text: str) -> list[str]:
        self.buffer += text
        if self.granularity == "none":
            return []
        pattern = _CLAUSE_END if self.granularity == "clause" else _SENTENCE_END
        pieces, start = [], 0
        for match in pattern.finditer(self.buffer):
            end = match.end(1) if match.group(1) else match.end(3)
            piece = self.buffer[start:end].strip()
            words = piece.rstrip(".").split()
            if match.group(1) and match.group(1).startswith(".") and words and \
                    words[-1].lower().rstrip(".") in _ABBREVIATIONS:
                continue                      # "Dr. Smith": not a sentence end
            if any(c.isalnum() for c in piece):
                pieces.append(piece)
                start = match.end()
        self.buffer = self.buffer[start:]
        return pieces

    def flush(self) -> list[str]:
        rest, self.buffer = self.buffer.strip(), ""
        return [rest] if any(c.isalnum() for c in rest) else []


@dataclass
class Session:
    socket: WebSocket
    service: SpeechService
    config: SessionConfig | None = None
    fields: dict = field(default_factory=dict)      # the config as speech request fields
    splitter: TextSplitter = field(default_factory=TextSplitter)
    utterance: int = 0
    sentences: int = 0                 # sentences queued in the current utterance
    open: bool = False                 # an utterance has text not yet flushed by input.done
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    # Word timestamps: ms of audio sent so far in each utterance (its sentences' timeline).
    utterance_ms: dict = field(default_factory=dict)

    async def send_error(self, message: str, status: int = 400, param: str | None = None) -> None:
        await self.socket.send_json({"type": "error", "message": message, "status": status,
                                     "param": param})


async def serve_session(socket: WebSocket, service: SpeechService,
                        config_timeout: float = CONFIG_TIMEOUT_S,
                        idle_timeout: float = IDLE_TIMEOUT_S) -> None:
    await socket.accept()
    session = Session(socket, service)
    speaker = asyncio.create_task(_speak(session))
    try:
        while True:
            timeout = config_timeout if session.config is None else idle_timeout
            try:
                message = await asyncio.wait_for(socket.receive(), timeout)
            except asyncio.TimeoutError:
                what = "session.config" if session.config is None else "message"
                await session.send_error(f"no {what} within {timeout:g} s; closing", 408)
                await socket.close(POLICY_VIOLATION)
                return
            if message["type"] == "websocket.disconnect":
                return
            msg = await _parse(session, message)
            if msg is None:
                continue
            kind = msg.get("type")
            if kind == "session.config":
                await _configure(session, msg)
            elif session.config is None:
                await session.send_error(f"send session.config first (got {kind!r})", 400, "type")
            elif kind == "input.text":
                await _text(session, msg)
            elif kind == "input.done":
                _flush(session)
            elif kind == "session.close":
                if session.open:
                    _flush(session)
                await session.queue.put(None)           # the speaker closes when done
                await speaker
                await socket.close()
                return
            else:
                await session.send_error(f"unknown message type {kind!r}; expected session.config, "
                                         "input.text, input.done or session.close", 400, "type")
    except WebSocketDisconnect:
        return
    finally:
        if not speaker.done():
            speaker.cancel()            # the client is gone: stop speaking, free the slot
            try:
                await speaker
            except (asyncio.CancelledError, Exception):
                pass


async def _parse(session: Session, message: dict) -> dict | None:
    text = message.get("text")
    if text is None:
        await session.send_error("send JSON text messages; binary frames are not accepted", 400)
        return None
    limit = MAX_CONFIG_BYTES if '"session.config"' in text[:200] else MAX_TEXT_MESSAGE_BYTES
    if len(text) > limit:
        await session.send_error(f"message is {len(text)} bytes; the limit is {limit}", 413)
        return None
    try:
        msg = json.loads(text)
    except ValueError as exc:
        await session.send_error(f"message is not JSON: {exc}", 400)
        return None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        await session.send_error('a message is a JSON object with a "type"', 400, "type")
        return None
    return msg


async def _configure(session: Session, msg: dict) -> None:
    if session.open:
        await session.send_error("session.config cannot change an utterance in progress; "
                                 "send input.done first", 400, "type")
        return
    try:
        config = SessionConfig.model_validate(msg)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
                             for e in exc.errors())
        await session.send_error(f"invalid session.config: {problems}", 400)
        return
    fields = config.model_dump(exclude_none=True, exclude={"type", "split_granularity", "stream_audio"})
    fields.update(config.model_extra or {})
    if isinstance(fields.get("ref_audio"), str):
        try:   # once per session, not per sentence
            audio = await resolve_audio(fields["ref_audio"], session.service.media)
        except MediaError as exc:
            await session.send_error(str(exc), 400, exc.field)
            return
        fields["ref_audio"] = base64.b64encode(audio).decode()
    try:   # every check a request makes, once, before any text arrives
        checked = await session.service.prepare(SpeechRequest.model_validate({**fields, "input": "Check."}))
        if checked.word_timestamps and checked.response_format != "pcm":
            raise SpeechError(400, "word_timestamps on the WebSocket needs response_format 'pcm' (the "
                              "timings ride the audio.chunk frames, whose times count PCM samples)",
                              param="response_format")
    except ValidationError as exc:
        await session.send_error(f"invalid session.config: {exc.errors()[0]['msg']}", 400)
        return
    except SpeechError as exc:
        await session.send_error(exc.message, exc.status, exc.param)
        return
    session.config, session.fields = config, fields
    session.splitter = TextSplitter(config.split_granularity)
    await session.socket.send_json({"type": "session.configured", "model": config.model,
                                    "split_granularity": config.split_granularity})


async def _text(session: Session, msg: dict) -> None:
    text = msg.get("text")
    if not isinstance(text, str):
        await session.send_error("input.text needs a string `text`", 400, "text")
        return
    if len(session.splitter.buffer) + len(text) > MAX_INPUT_CHARS:
        await session.send_error(f"more than {MAX_INPUT_CHARS} characters without a sentence end; "
                                 "send input.done or shorter sentences", 400, "text")
        return
    session.open = True
    for sentence in session.splitter.feed(text):
        _queue(session, sentence)


def _queue(session: Session, sentence: str) -> None:
    session.queue.put_nowait((session.utterance, session.sentences, sentence))
    session.sentences += 1


def _flush(session: Session) -> None:
    for sentence in session.splitter.flush():
        _queue(session, sentence)
    session.queue.put_nowait(("done", session.utterance, session.sentences))
    session.utterance += 1
    session.sentences = 0
    session.open = False


async def _speak(session: Session) -> None:
    """The session's one speaker: sentences in order, then session.done per utterance."""
    while True:
        item = await session.queue.get()
        if item is None:
            return
        if item[0] == "done":
            _, utterance, total = item
            await session.socket.send_json({"type": "session.done", "utterance_index": utterance,
                                            "total_sentences": total})
            continue
        await _sentence(session, *item)


async def _timed_chunk(session: Session, utterance: int, index: int, chunk_id: int, sentence_ms: float,
                       pcm: bytes, words: list[dict], sample_rate: int) -> None:
    """One audio.chunk frame of a word_timestamps session (vLLM-Omni's fields): the PCM as
    base64 and the words placed with it (ms in their sentence, which began at `sentence_ms`
    of the utterance), in ms of the utterance's audio (its sentences one after another, as
    the client plays them)."""
    start = session.utterance_ms.get(utterance, 0.0)
    end = start + len(pcm) / 2 / sample_rate * 1000
    session.utterance_ms[utterance] = end
    await session.socket.send_json({
        "type": "audio.chunk", "utterance_index": utterance, "sentence_index": index,
        "chunk_id": chunk_id, "chunk_start_ms": round(start), "chunk_end_ms": round(end), "sample_rate": sample_rate,
        "channels": 1, "audio_b64": base64.b64encode(pcm).decode(),
        "timestamps": [{"word": w["word"], "start_ms": round(sentence_ms + w["start_ms"]),
                        "end_ms": round(sentence_ms + w["end_ms"])} for w in words] or None})


async def _sentence(session: Session, utterance: int, index: int, text: str) -> None:
    socket, service = session.socket, session.service
    done = {"type": "audio.done", "utterance_index": utterance, "sentence_index": index,
            "total_bytes": 0, "error": False}
    try:
        prepared = await service.prepare(SpeechRequest.model_validate({**session.fields, "input": text}))
    except (SpeechError, ValidationError) as exc:
        error = exc if isinstance(exc, SpeechError) else SpeechError(400, str(exc))
        await session.send_error(error.message, error.status, error.param)
        await socket.send_json({**done, "error": True})
        return
    synthesis = service.synthesis(prepared)
    started = False
    sentence_ms = session.utterance_ms.get(utterance, 0.0)    # sentences are spoken in turn
    timed_chunks = 0
    try:
        async with aclosing(synthesis):
            async for chunk in synthesis:
                if not started:
                    encoder = AudioEncoder(prepared.response_format, chunk.sample_rate, True,
                                           prepared.sample_rate, prepared.speed)
                    await socket.send_json({"type": "audio.start", "utterance_index": utterance,
                                            "sentence_index": index, "sentence_text": text,
                                            "format": prepared.response_format,
                                            "sample_rate": encoder.sample_rate,
                                            "word_timestamps": prepared.word_timestamps})
                    started = True
                data = encoder.encode(chunk.audio)
                if prepared.word_timestamps:
                    words = prepared.delivered_words(chunk)
                    if chunk.final:
                        data += encoder.finish()
                    if data or words:
                        await _timed_chunk(session, utterance, index, timed_chunks, sentence_ms, data, words,
                                           encoder.sample_rate)
                        timed_chunks += 1
                        done["total_bytes"] += len(data)
                elif data:
                    await socket.send_bytes(data)
                    done["total_bytes"] += len(data)
            tail = encoder.finish() if started and not prepared.word_timestamps else b""
            if tail:
                await socket.send_bytes(tail)
                done["total_bytes"] += len(tail)
    except (asyncio.CancelledError, WebSocketDisconnect):
        raise
    except Exception as exc:  # noqa: BLE001 - told in-band; the session goes on
        error = speech_error(exc, prepared.request_id)
        await session.send_error(error.message, error.status, error.param)
        done["error"] = True
    await socket.send_json(done)
