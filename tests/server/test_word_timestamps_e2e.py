"""Word timestamps end to end on the pooled Piper server (real voice; the pooled servers run
with --word-aligner, tritontts.testing.stack.tiny_engine_args): every response mode carries
the input's words with times in the delivered audio, gRPC clients get them as the ensemble's
`words` output, and what the aligner cannot do is a 400 that says why."""
from __future__ import annotations

import base64
import json

import numpy as np
from websockets.sync.client import connect

from tritontts.alignment.words import split_words
from tritontts.testing.audio import pcm16, rms
from tritontts.testing.grpc import stream_model

STACK_FAMILIES = ("piper",)
TEXT = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
RATE = 22050


def ordered_inside(words: list[dict], duration_ms: float) -> bool:
    return (all(0 <= a["start_ms"] <= a["end_ms"] <= b["start_ms"] + 1 for a, b in zip(words, words[1:]))
            and words[-1]["end_ms"] <= duration_ms + 1)


def test_whole_response_header_holds_each_word_in_order_inside_the_audio(http):
    r = http.post("/v1/audio/speech", json={"model": "piper", "input": TEXT, "response_format": "pcm",
                                            "seed": 1, "word_timestamps": True})
    assert r.status_code == 200, r.text
    words = json.loads(r.headers["X-Word-Timestamps"])
    assert [w["word"] for w in words] == split_words(TEXT)
    audio = pcm16(r.content)
    assert ordered_inside(words, audio.size / RATE * 1000)
    # Each word's span is where the voice speaks: louder than the pause between sentences.
    for w in words:
        span = audio[int(w["start_ms"] * RATE / 1000):int(w["end_ms"] * RATE / 1000)]
        assert span.size and rms(span) > 0.01, w
    plain = http.post("/v1/audio/speech", json={"model": "piper", "input": TEXT, "response_format": "pcm",
                                                "seed": 1})
    assert "X-Word-Timestamps" not in plain.headers and plain.content == r.content


def test_times_are_in_the_delivered_audio_after_resampling(http):
    def words_at(rate):
        r = http.post("/v1/audio/speech", json={"model": "piper", "input": TEXT, "response_format": "wav",
                                                "seed": 1, "sample_rate": rate, "word_timestamps": True})
        assert r.status_code == 200, r.text
        return json.loads(r.headers["X-Word-Timestamps"])

    native, resampled = words_at(RATE), words_at(16000)
    assert [w["start_ms"] for w in native] == [w["start_ms"] for w in resampled]


def test_sse_deltas_carry_the_words_as_they_are_placed(http):
    text = " ".join([TEXT] * 4)         # about 20 s: placed while the stream goes on
    with http.stream("POST", "/v1/audio/speech", json={"model": "piper", "input": text, "stream": True,
                                                       "response_format": "pcm", "seed": 2,
                                                       "word_timestamps": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert events[-1]["type"] == "speech.audio.done"
    words = [w for e in events for w in e.get("timestamps") or []]
    assert [w["word"] for w in words] == split_words(text)
    audio = pcm16(b"".join(base64.b64decode(e["audio"]) for e in deltas))
    assert ordered_inside(words, audio.size / RATE * 1000)
    carrying = [i for i, e in enumerate(deltas) if e.get("timestamps")]
    assert len(carrying) >= 2 and carrying[0] < len(deltas) - 1     # not all at the end


def test_websocket_chunks_carry_words_in_the_utterances_timeline(stack):
    with connect(stack.url.replace("http", "ws") + "/v1/audio/speech/stream", max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "piper", "response_format": "pcm",
                            "seed": 3, "word_timestamps": True, "split_granularity": "sentence"}))
        assert json.loads(ws.recv(timeout=60))["type"] == "session.configured"
        ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
        frames = []
        while not frames or frames[-1]["type"] != "session.done":
            message = ws.recv(timeout=120)
            assert isinstance(message, str), "word_timestamps sessions send JSON audio.chunk frames"
            frames.append(json.loads(message))
    chunks = [f for f in frames if f["type"] == "audio.chunk"]
    starts = [f for f in frames if f["type"] == "audio.start"]
    assert len(starts) == 2 and all(s["word_timestamps"] for s in starts)
    words = [w for c in chunks for w in c["timestamps"] or []]
    assert [w["word"] for w in words] == split_words(TEXT)
    audio = pcm16(b"".join(base64.b64decode(c["audio_b64"]) for c in chunks))
    assert ordered_inside(words, audio.size / RATE * 1000)
    first_sentence = [c for c in chunks if c["sentence_index"] == 0]
    second_words = [w for c in chunks if c["sentence_index"] == 1 for w in c["timestamps"] or []]
    assert second_words[0]["start_ms"] >= first_sentence[-1]["chunk_end_ms"]    # after sentence 1
    assert [c["chunk_start_ms"] for c in chunks[1:]] == [c["chunk_end_ms"] for c in chunks[:-1]]


def test_batch_items_that_ask_get_their_words(http):
    r = http.post("/v1/audio/speech/batch", json={"model": "piper", "items": [
        {"input": "One item with words.", "word_timestamps": True}, {"input": "One without."}]})
    assert r.status_code == 200, r.text
    asked, plain = r.json()["results"]
    assert [w["word"] for w in asked["word_timestamps"]] == ["One", "item", "with", "words"]
    assert plain["status"] == "success" and plain["word_timestamps"] is None


def test_grpc_clients_get_words_as_the_ensembles_output(stack):
    chunks, error = stream_model(stack.grpc_url, "piper", TEXT, params={"seed": 1, "word_timestamps": True})
    assert error is None
    words = [w for c in chunks for w in json.loads(c.as_numpy("words").reshape(-1)[0])]
    assert [w["word"] for w in words] == split_words(TEXT)
    chunks, error = stream_model(stack.grpc_url, "piper", TEXT, params={"seed": 1})
    assert error is None and all(json.loads(c.as_numpy("words").reshape(-1)[0]) == [] for c in chunks)
    audio = np.concatenate([c.as_numpy("audio").reshape(-1) for c in chunks])
    assert rms(audio) > 0.02


def test_a_language_the_aligner_cannot_place_is_a_400_naming_its_languages(http, stack):
    r = http.post("/v1/audio/speech", json={"model": "piper", "input": TEXT, "word_timestamps": True,
                                            "language": "German"})
    # Piper takes no language at all: whichever check comes first, it is a 400 naming a field.
    assert r.status_code == 400 and r.json()["error"]["param"] in ("word_timestamps", "language")
    _, error = stream_model(stack.grpc_url, "piper", TEXT, params={"word_timestamps": "yes"})
    assert error is not None and "word_timestamps must be true or false" in str(error)
    assert http.get("/health").status_code == 200


def test_websocket_word_timestamps_need_pcm(stack):
    with connect(stack.url.replace("http", "ws") + "/v1/audio/speech/stream") as ws:
        ws.send(json.dumps({"type": "session.config", "model": "piper", "response_format": "wav",
                            "word_timestamps": True}))
        reply = json.loads(ws.recv(timeout=60))
    assert reply["type"] == "error" and reply["param"] == "response_format" and "pcm" in reply["message"]
