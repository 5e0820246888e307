"""The batch endpoint, the WebSocket and the request fields the front itself honors
(sample_rate, model names), against a scripted Triton."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import time

import av

import numpy as np
import soundfile as sf
from fake_triton import FakeTritonClient, run_async, serving, tone_chunks
from fastapi import FastAPI, WebSocket
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from frontend.app import create_app
from frontend.serving import SpeechService, served_models
from frontend.websocket import TextSplitter, serve_session


def test_batch_runs_each_item_with_the_batch_defaults_and_reports_each_outcome():
    fake = FakeTritonClient(tone_chunks(2, 2205), sample_rate=22050)
    with TestClient(create_app("fake:0", ["piper"], client=fake)) as client:
        r = client.post("/v1/audio/speech/batch", json={
            "model": "piper", "voice": "joe", "response_format": "wav", "seed": 3,
            "items": [{"input": "One."}, {"input": "Two.", "response_format": "pcm"},
                      {"input": ""}, {"input": "Four.", "language": "English"},
                      {"input": "Five.", "sample_rate": 16000}, {"voice": "joe"},
                      {"input": "Seven.", "speed": 9}]})
    body = r.json()
    assert r.status_code == 200 and (body["total"], body["succeeded"], body["failed"]) == (7, 3, 4)
    status = [(x["index"], x["status"], x["status_code"]) for x in body["results"]]
    assert status == [(0, "success", 200), (1, "success", 200), (2, "error", 400),
                      (3, "error", 400), (4, "success", 200), (5, "error", 400), (6, "error", 400)]
    assert body["results"][5]["error"] == "input: Field required"
    assert "speed: Input should be less than or equal to 4" in body["results"][6]["error"]
    assert "input is empty" in body["results"][2]["error"]
    assert "language is not supported by piper" in body["results"][3]["error"]
    audio, rate = sf.read(io.BytesIO(base64.b64decode(body["results"][0]["audio_data"])))
    assert rate == 22050 and audio.size == 4410
    assert body["results"][1]["media_type"] == "audio/pcm"
    assert len(base64.b64decode(body["results"][1]["audio_data"])) == 4410 * 2
    audio, rate = sf.read(io.BytesIO(base64.b64decode(body["results"][4]["audio_data"])))
    assert rate == 16000 and abs(audio.size - 3200) <= 1
    assert all(call["params"] == {"seed": 3} for call in fake.calls)


@run_async
async def test_batch_when_no_admission_slot_is_free_is_429():
    gate = asyncio.Event()
    fake = FakeTritonClient(gates={0: gate})
    async with serving(fake, max_in_flight=1) as front:
        held = asyncio.create_task(front.speech())
        await fake.waiting.wait()
        r = await front.http.post("/v1/audio/speech/batch", json={"items": [{"input": "Hi."}]})
        gate.set()
        await held
    assert r.status_code == 429 and r.headers["retry-after"] == "1"


@run_async
async def test_sample_rate_resamples_the_audio_to_the_asked_rate():
    async with serving(FakeTritonClient(tone_chunks(3, 2400), sample_rate=24000), ["cosyvoice3"]) as front:
        r = await front.speech(model="cosyvoice3", sample_rate=16000, ref_audio="UklGRg==",
                               ref_text="x")
    audio, rate = sf.read(io.BytesIO(r.content))
    assert r.status_code == 200 and rate == 16000 and abs(audio.size - 4800) <= 1


@run_async
async def test_released_checkpoint_names_and_an_omitted_model_reach_the_served_model():
    async with serving(FakeTritonClient(), ["cosyvoice3"]) as front:
        named = await front.speech(model="FunAudioLLM/Fun-CosyVoice3-0.5B-2512", ref_audio="UklGRg==",
                                   ref_text="x")
        omitted = await front.speech(ref_audio="UklGRg==", ref_text="x")
    assert named.status_code == omitted.status_code == 200
    assert [c["model"] for c in front.fake.calls] == ["cosyvoice3", "cosyvoice3"]


def test_text_splitter_yields_sentences_as_they_complete_not_abbreviations():
    splitter = TextSplitter("sentence")
    got = [splitter.feed(w) for w in ["Dr. ", "Smith ", "arrived. ", "He ", "said ", "hi! ", "And"]]
    assert got == [[], [], ["Dr. Smith arrived."], [], [], ["He said hi!"], []]
    assert splitter.flush() == ["And"]
    assert TextSplitter("clause").feed("First, then second; ") == ["First,", "then second;"]
    assert TextSplitter("none").feed("One. Two. ") == []


def test_websocket_by_default_speaks_the_text_buffered_until_input_done_as_one_request():
    """vLLM-Omni's default: nothing is synthesized before input.done; then the whole
    utterance is one request (one audio.start ... audio.done)."""
    fake = FakeTritonClient(tone_chunks(2, 441), sample_rate=22050)
    with TestClient(create_app("fake:0", ["piper"], client=fake)) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_text(json.dumps({"type": "session.config", "response_format": "pcm"}))
            configured = ws.receive_json()
            assert configured["type"] == "session.configured" and configured["split_granularity"] == "none"
            for piece in ["Hello ", "there. ", "How ", "are you?"]:
                ws.send_text(json.dumps({"type": "input.text", "text": piece}))
            ws.send_text(json.dumps({"type": "input.done"}))
            start = ws.receive_json()
            assert (start["type"], start["sentence_text"]) == ("audio.start", "Hello there. How are you?")
            messages = []
            while not messages or messages[-1] != "session.done":
                m = ws.receive()
                messages.append(json.loads(m["text"])["type"] if m.get("text") else "audio")
            assert messages == ["audio", "audio", "audio.done", "session.done"]
            ws.send_text(json.dumps({"type": "session.close"}))
    assert [c["text"] for c in fake.calls] == ["Hello there. How are you?"]


def test_websocket_split_by_sentence_speaks_the_first_sentence_before_input_done_and_stays_open():
    fake = FakeTritonClient(tone_chunks(2, 441), sample_rate=22050)
    with TestClient(create_app("fake:0", ["piper"], client=fake)) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_text(json.dumps({"type": "session.config", "response_format": "pcm",
                                     "split_granularity": "sentence"}))
            assert ws.receive_json()["type"] == "session.configured"
            for word in ["Hello ", "there. ", "How "]:
                ws.send_text(json.dumps({"type": "input.text", "text": word}))
            start = ws.receive_json()
            assert (start["type"], start["sentence_text"], start["sample_rate"]) == (
                "audio.start", "Hello there.", 22050)
            first_audio = ws.receive_bytes()        # before input.done was sent
            assert len(first_audio) == 441 * 2
            ws.send_text(json.dumps({"type": "input.text", "text": "are you?"}))
            ws.send_text(json.dumps({"type": "input.done"}))
            messages = []
            while not messages or messages[-1] != "session.done":
                m = ws.receive()
                messages.append(json.loads(m["text"])["type"] if m.get("text") else "audio")
            assert messages == ["audio", "audio.done", "audio.start", "audio", "audio", "audio.done",
                                "session.done"]
            ws.send_text(json.dumps({"type": "input.text", "text": "Again."}))
            ws.send_text(json.dumps({"type": "input.done"}))
            assert ws.receive_json()["utterance_index"] == 1
            ws.send_text(json.dumps({"type": "session.close"}))
    assert [c["text"] for c in fake.calls] == ["Hello there.", "How are you?", "Again."]


def test_websocket_client_gone_mid_sentence_cancels_its_triton_stream():
    gate = asyncio.Event()
    fake = FakeTritonClient(tone_chunks(3), gates={1: gate})
    with TestClient(create_app("fake:0", ["piper"], client=fake)) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_text(json.dumps({"type": "session.config", "split_granularity": "sentence"}))
            ws.receive_json()
            ws.send_text(json.dumps({"type": "input.text", "text": "Hello there. "}))
            assert ws.receive_json()["type"] == "audio.start"
            ws.receive_bytes()
        for _ in range(100):
            if fake.open_streams == 0:
                break
            time.sleep(0.02)
        assert fake.cancelled == 1 and fake.open_streams == 0
        assert client.app.state.service.admission.in_flight == 0


def test_openai_formats_decode_at_the_asked_rate():
    chunks = [np.sin(np.arange(2400) / 7).astype(np.float32) * 0.3 for _ in range(4)]
    with TestClient(create_app("fake:0", ["piper"], client=FakeTritonClient(chunks, 24000))) as client:
        for fmt in ("wav", "flac", "mp3", "opus", "aac"):
            r = client.post("/v1/audio/speech", json={"input": "Hi.", "response_format": fmt,
                                                      "sample_rate": 48000})
            with av.open(io.BytesIO(r.content)) as container:
                stream = container.streams.audio[0]
                samples = sum(f.samples for f in container.decode(stream))
            assert r.status_code == 200 and stream.rate == 48000, fmt
            assert abs(samples / 48000 - 0.4) < 0.1, (fmt, samples)


def test_websocket_without_config_in_time_or_idle_too_long_is_told_and_closed():
    app = FastAPI()

    @app.websocket("/ws")
    async def session(socket: WebSocket):
        service = SpeechService(FakeTritonClient(), served_models(["piper"]))
        await serve_session(socket, service, config_timeout=0.2, idle_timeout=0.3)

    with TestClient(app) as client:
        with client.websocket_connect("/ws") as ws:
            error = ws.receive_json()
            assert (error["status"], error["message"]) == (408, "no session.config within 0.2 s; closing")
            try:
                ws.receive_text()
                raise AssertionError("still open")
            except WebSocketDisconnect as closed:
                assert closed.code == 1008
        with client.websocket_connect("/ws") as ws:
            ws.send_text(json.dumps({"type": "session.config"}))
            assert ws.receive_json()["type"] == "session.configured"
            assert ws.receive_json()["message"] == "no message within 0.3 s; closing"
