"""The speech API end to end on the real server (piper with its real voice, cosyvoice3 on its
tiny random checkpoint): the bad-request table with the server healthy after each case, a
voice uploaded once and spoken by name across a restart of the front, the WebSocket fed word by word,
a batch of mixed items, and the OpenAI SDK in every format."""
from __future__ import annotations

import base64
import functools
import json
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
import soxr
from openai import OpenAI
from websockets.sync.client import connect

from tritontts.families import FAMILIES
from tritontts.testing.audio import decode, pcm16, rms
from tritontts.testing.bad_requests import SERVED, TABLE, check_http, check_ws
from tritontts.testing.stack import Front

REFERENCE = {"ref_text": "This is the reference voice."}


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """A folder the server may read file:// references from, served over HTTP on loopback
    too (which the server is told it may fetch from)."""
    folder = tmp_path_factory.mktemp("media")
    (folder / "reference.wav").write_bytes(reference_wav())
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


# The pooled server of both families; the module's front is its own (restarted below, with
# a voices folder that outlives it and the media it may fetch), on that server's tritonserver.
STACK_FAMILIES = SERVED


@pytest.fixture(scope="module")
def server(stack, tmp_path_factory, media):
    """A front of its own on the pooled stack's tritonserver, keeping voices in one folder
    across its restarts (uploaded voices are the front's state; Triton holds none)."""
    voices = tmp_path_factory.mktemp("voices")
    front = Front(stack, SERVED, tmp_path_factory.mktemp("speech-api") / "front.log",
                  ("--voices-dir", str(voices), "--allow-media-host", "127.0.0.1",
                   "--allowed-local-media-path", str(media[0]))).start()
    yield front
    assert front.stop() == 0, front.log.read_text()[-4000:]


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as client:
        yield client


def reference_wav() -> bytes:
    return base64.b64decode(FAMILIES["cosyvoice3"].example_params()["ref_audio"])


@pytest.mark.parametrize("case", TABLE, ids=[c.id for c in TABLE])
def test_bad_request_gets_its_status_and_message_and_the_server_stays_healthy(server, http, case):
    if case.endpoint == "ws":
        with connect(server.url.replace("http", "ws") + "/v1/audio/speech/stream",
                     max_size=None, open_timeout=30) as ws:
            check_ws(case, ws.send, lambda: json.loads(ws.recv(timeout=120)))
    else:
        check_http(case, http)
    assert http.get("/health").status_code == 200


def speak(http, **body):
    r = http.post("/v1/audio/speech", json={"model": "cosyvoice3", "input": "Hello there, friend.",
                                            "response_format": "pcm", "seed": 5, **body})
    assert r.status_code == 200, r.text
    return r.content


def test_uploaded_voice_speaks_exactly_like_its_reference_and_survives_a_front_restart(server, http):
    r = http.post("/v1/audio/voices", data={"name": "Narrator", "consent": "rec-42", **REFERENCE},
                  files={"audio_sample": ("narrator.wav", reference_wav(), "audio/wav")})
    assert r.status_code == 200, r.text
    assert r.json()["voice"]["families"] == ["cosyvoice3"]
    inline = speak(http, ref_audio=base64.b64encode(reference_wav()).decode(), **REFERENCE)
    by_name = speak(http, voice="narrator")
    assert by_name == inline and rms(pcm16(by_name)) > 0
    server.restart()
    http = httpx.Client(base_url=server.url, timeout=300)
    listed = http.get("/v1/audio/voices").json()
    assert [v["name"] for v in listed["uploaded_voices"]] == ["Narrator"]
    assert {"name": "Narrator", "model": "cosyvoice3", "family": "cosyvoice3", "kind": "uploaded"}.items() \
        <= next(d for d in listed["data"] if d["name"] == "Narrator").items()
    assert speak(http, voice={"id": "NARRATOR"}) == inline
    assert http.delete("/v1/audio/voices/Narrator").status_code == 200
    gone = http.post("/v1/audio/speech", json={"model": "cosyvoice3", "input": "Hi.", "voice": "Narrator"})
    assert gone.status_code == 400


def test_ref_audio_by_http_url_and_by_file_url_speaks_as_inline_base64(http, media):
    folder, base = media
    inline = speak(http, ref_audio=base64.b64encode(reference_wav()).decode(), **REFERENCE)
    assert speak(http, ref_audio=f"{base}/reference.wav", **REFERENCE) == inline
    assert speak(http, ref_audio=(folder / "reference.wav").as_uri(), **REFERENCE) == inline
    outside = http.post("/v1/audio/speech", json={"model": "cosyvoice3", "input": "Hi.", **REFERENCE,
                                                  "ref_audio": f"file://{folder}/../x.wav"})
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "ref_audio"


def test_websocket_fed_word_by_word_speaks_before_input_done(server, whisper):
    words = "Hello there. The birch canoe slid on the smooth planks.".split(" ")
    with connect(server.url.replace("http", "ws") + "/v1/audio/speech/stream", max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "piper", "response_format": "pcm",
                            "seed": 3, "split_granularity": "sentence"}))
        assert json.loads(ws.recv(timeout=60))["type"] == "session.configured"
        sent = 0
        for word in words[:2]:
            ws.send(json.dumps({"type": "input.text", "text": word + " "}))
            sent += 1
        start = json.loads(ws.recv(timeout=60))
        first = ws.recv(timeout=60)
        # The first sentence is audio while the rest of the text has not been written yet.
        assert start["type"] == "audio.start" and start["sentence_text"] == "Hello there."
        assert isinstance(first, bytes) and len(first) > 0 and sent == 2
        for word in words[2:]:
            ws.send(json.dumps({"type": "input.text", "text": word + " "}))
        ws.send(json.dumps({"type": "input.done"}))
        audio, events = [first], []
        while not events or events[-1]["type"] != "session.done":
            message = ws.recv(timeout=120)
            if isinstance(message, bytes):
                audio.append(message)
            else:
                events.append(json.loads(message))
        assert [e["type"] for e in events] == ["audio.done", "audio.start", "audio.done", "session.done"]
        assert events[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}
        ws.send(json.dumps({"type": "session.close"}))
    speech = pcm16(b"".join(audio))
    assert 2.0 < speech.size / 22050 < 8.0 and rms(speech) > 0.02
    segments, _ = whisper.transcribe(soxr.resample(speech, 22050, 16000).astype(np.float32),
                                     language="en", beam_size=1)
    heard = re.sub(r"[^a-z ]", "", " ".join(s.text for s in segments).lower())
    assert "hello there" in heard and "smooth planks" in heard, heard


def test_batch_of_mixed_items_reports_each_and_decodes_the_good_ones(http):
    items = [{"input": "One, good."}, {"input": "Two, as mp3.", "response_format": "mp3"},
             {"input": "Three, at sixteen kilohertz.", "sample_rate": 16000},
             {"input": "Four, as flac.", "response_format": "flac"}, {"input": "Five."},
             {"input": ""}, {"input": "Seven.", "voice": "nobody"}, {"input": "Eight.", "speed": 9}]
    r = http.post("/v1/audio/speech/batch", json={"model": "piper", "voice": "default", "items": items})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["total"], body["succeeded"], body["failed"]) == (8, 5, 3)
    assert [x["status_code"] for x in body["results"]] == [200] * 5 + [400] * 3
    assert "valid voices" in body["results"][6]["error"]
    assert "speed" in body["results"][7]["error"]
    for result, rate in zip(body["results"][:5], (22050, 22050, 16000, 22050, 22050)):
        audio, got = decode(base64.b64decode(result["audio_data"]))
        assert got == rate and audio.size / got > 0.4 and rms(audio) > 0.02, result["index"]


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "aac", "flac", "pcm"])
def test_openai_sdk_speaks_every_format(server, fmt):
    sdk = OpenAI(base_url=server.url + "/v1", api_key="unused")
    response = sdk.audio.speech.create(model="tts-1", voice="default", input="Every format works.",
                                       response_format=fmt, extra_body={"sample_rate": 24000})
    if fmt == "pcm":
        audio, rate = pcm16(response.content), 24000
    else:
        audio, rate = decode(response.content)
    expected = 48000 if fmt == "opus" else 24000
    assert rate == expected and 0.8 < audio.size / rate < 4.0 and rms(audio) > 0.02


def test_openai_sdk_streams_sse_as_vllm_omni_clients_expect(http):
    with http.stream("POST", "/v1/audio/speech", json={"model": "piper", "input": "One. Two.",
                                                       "response_format": "pcm", "stream": True}) as r:
        body = b"".join(r.iter_bytes())
    blocks = [b for b in body.split(b"\n\n") if b]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert [b.split(b"\n")[0] for b in blocks] == [b"event: speech.audio.delta"] * 2 + [b"event: speech.audio.done"]
    audio = b"".join(base64.b64decode(json.loads(b.split(b"\n")[1][6:])["audio"]) for b in blocks[:-1])
    assert rms(pcm16(audio)) > 0.02
