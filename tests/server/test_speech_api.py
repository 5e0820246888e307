"""POST /v1/audio/speech through the real front and tritonserver (piper family)."""
from __future__ import annotations

import json
import base64
import time

import httpx
import numpy as np
import pytest

from tritontts.testing.audio import decode, pcm16, rms

SENTENCE = "The quick brown fox jumps over the lazy dog."
THREE = "The sun rose over the hills. Birds began to sing in the trees. It was a quiet morning."
RATES = {"wav": 22050, "flac": 22050, "mp3": 22050, "aac": 22050, "opus": 48000}

STACK_FAMILIES = ("piper",)


def speak(http, **body):
    body.setdefault("input", SENTENCE)
    return http.post("/v1/audio/speech", json=body)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
@pytest.mark.parametrize("stream", [False, True])
def test_every_format_decodes(http, fmt, stream):
    r = speak(http, response_format=fmt, **({"stream_format": "audio"} if stream else {}))
    assert r.status_code == 200, r.text
    audio, rate = decode(r.content)
    assert rate == RATES[fmt]
    # ~9 words: between 1.5 and 6 seconds of speech, and not silence.
    assert 1.5 < audio.size / rate < 6.0, audio.size / rate
    assert rms(audio) > 0.02


def test_pcm_is_raw_16bit_at_voice_rate(http):
    r = speak(http, response_format="pcm", seed=1)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
    wav = speak(http, response_format="wav", seed=1)
    audio, rate = decode(wav.content)
    assert rate == 22050
    np.testing.assert_allclose(pcm16(r.content), audio, atol=1 / 32768)


def test_default_request_is_wav(http):
    r = http.post("/v1/audio/speech", json={"input": "Hello there.", "voice": "default"})
    assert r.status_code == 200 and r.content[:4] == b"RIFF" and r.content[8:12] == b"WAVE"
    size = int.from_bytes(r.content[40:44], "little")
    assert size == len(r.content) - 44, "non-streamed WAV carries its real length"


def test_streamed_wav_has_unknown_length_header(http):
    with http.stream("POST", "/v1/audio/speech",
                     json={"input": THREE, "stream_format": "audio", "response_format": "wav"}) as r:
        data = b"".join(r.iter_bytes())
    assert data[:4] == b"RIFF" and data[40:44] == b"\xff\xff\xff\xff"
    audio = pcm16(data[44:])
    assert audio.size / 22050 > 3 and rms(audio) > 0.02


def test_streaming_equals_non_streaming_for_a_seed(http):
    body = {"input": THREE, "seed": 1234, "response_format": "pcm"}
    whole = speak(http, **body).content
    with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio"}) as r:
        streamed = b"".join(r.iter_bytes())
    assert len(whole) > 22050 * 2 * 3
    assert streamed == whole


def test_seed_and_zero_noise_are_deterministic(http):
    a = speak(http, response_format="pcm", seed=7).content
    b = speak(http, response_format="pcm", seed=7).content
    c = speak(http, response_format="pcm", seed=8).content
    assert a == b and a != c
    quiet = {"response_format": "pcm", "noise_scale": 0.0, "noise_w_scale": 0.0}
    assert speak(http, **quiet).content == speak(http, **quiet).content


def test_speed_shortens_audio(http):
    normal = pcm16(speak(http, response_format="pcm", seed=3).content)
    fast = pcm16(speak(http, response_format="pcm", seed=3, speed=2.0).content)
    assert 0.35 < fast.size / normal.size < 0.65


def test_named_voice_and_model_alias(http):
    r = speak(http, voice="joe", model="tts-1")
    assert r.status_code == 200
    assert decode(r.content)[1] == 22050


def test_sse_stream_events(http):
    events = []
    with http.stream("POST", "/v1/audio/speech",
                     json={"input": THREE, "stream_format": "sse", "response_format": "pcm"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 3 and events[-1]["type"] == "speech.audio.done"
    audio = pcm16(b"".join(base64.b64decode(e["audio"]) for e in deltas))
    assert abs(audio.size / 22050 - events[-1]["usage"]["audio_seconds"]) < 0.01
    assert rms(audio) > 0.02


def test_first_audio_arrives_before_the_whole_input_is_synthesized(http):
    text = " ".join(["This sentence is one of many in a long paragraph."] * 10)
    start = time.perf_counter()
    arrivals = []
    with http.stream("POST", "/v1/audio/speech",
                     json={"input": text, "stream_format": "audio", "response_format": "pcm"}) as r:
        for _ in r.iter_bytes():
            arrivals.append(time.perf_counter() - start)
    assert len(arrivals) >= 2
    # One sentence of ten is ready long before all ten are (a ratio in one run, not a timing).
    assert arrivals[0] < 0.5 * arrivals[-1], arrivals


@pytest.mark.parametrize("body,status,needle", [
    ({"input": ""}, 400, "input is empty"),
    ({"input": "   "}, 400, "input is empty"),
    ({"input": "...!?"}, 400, "nothing to speak"),
    ({"input": "... !!! ???"}, 400, "nothing to speak"),
    ({"input": "x" * 5000}, 400, "limit is 4096"),
    ({"input": "Hi.", "model": "nope"}, 404, "does not exist"),
    ({"input": "Hi.", "voice": "bob"}, 400, "valid voices: default, joe"),
    ({"input": "Hi.", "response_format": "ogg"}, 400, "response_format"),
    ({"input": "Hi.", "speed": 9}, 400, "speed"),
    ({"input": "Hi.", "seed": -1}, 400, "seed"),
    ({"input": "Hi.", "noise_scale": "loud"}, 400, "noise_scale"),
    ({"input": "Hi.", "temperature": 1.0}, 400, "unknown parameter"),
    ({"voice": "default"}, 400, "input"),
])
def test_bad_requests_get_clear_4xx(http, body, status, needle):
    r = http.post("/v1/audio/speech", json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def test_malformed_json_is_400(http):
    r = http.post("/v1/audio/speech", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_models_health_metrics(http):
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["piper"]
    assert http.get("/health").status_code == 200
    speak(http)
    text = http.get("/metrics").text
    assert 'tts_requests_total{model="piper",status="200"}' in text
    assert "tts_time_to_first_audio_seconds_bucket" in text
    seconds = [float(l.split()[-1]) for l in text.splitlines()
               if l.startswith('tts_audio_seconds_total{model="piper"}')]
    assert seconds and seconds[0] > 1.0


def test_client_disconnect_mid_stream_leaves_server_healthy(http, stack):
    text = " ".join(["A sentence that keeps the stream busy for a while."] * 12)
    with httpx.Client(base_url=stack.url, timeout=60) as c:
        with c.stream("POST", "/v1/audio/speech", json={"input": text, "stream_format": "audio"}) as r:
            next(r.iter_bytes())  # take the first chunk, then hang up
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = http.get("/metrics").text
        if "tts_requests_in_flight 0.0" in metrics:
            break
        time.sleep(0.2)
    assert "tts_requests_in_flight 0.0" in metrics
    assert speak(http).status_code == 200
