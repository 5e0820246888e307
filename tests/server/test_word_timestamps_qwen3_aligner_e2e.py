"""Word timestamps from a server started with `--word-aligner` naming a Qwen3-ForcedAligner
checkpoint (random weights in the released layout): the word_aligner stage loads it, every
word of the input comes back in order inside the delivered audio, in the whole response,
SSE and gRPC, and the languages the front and the first stage accept are the checkpoint's
(a random aligner places words nowhere in particular: where they land is what
tests/alignment/test_qwen3_forced_aligner.py checks against the reference)."""
from __future__ import annotations

import base64
import json

import pytest

from tritontts.alignment.random_checkpoint import write_random_checkpoint
from tritontts.alignment.words import split_words
from tritontts.testing.audio import pcm16
from tritontts.testing.grpc import stream_model
from tritontts.testing.stack import Stack

TEXT = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
RATE = 22050


def ordered_inside(words: list[dict], duration_ms: float) -> bool:
    return (all(0 <= a["start_ms"] <= a["end_ms"] <= b["start_ms"] + 1 for a, b in zip(words, words[1:]))
            and words[-1]["end_ms"] <= duration_ms + 1)


@pytest.fixture(scope="module")
def qwen3_aligned(stacks, caches, tmp_path_factory):
    stacks.close()      # one server at a time
    aligner = write_random_checkpoint(tmp_path_factory.mktemp("qwen3-forced-aligner"))
    stack = Stack(tmp_path_factory.mktemp("qwen3-aligned"), ("piper",), {}, caches,
                  extra_args=("--word-aligner", str(aligner))).start()
    yield stack
    assert stack.stop() == 0, stack.tail()


def test_whole_response_and_sse_hold_every_word_in_order_inside_the_audio(qwen3_aligned):
    import httpx

    with httpx.Client(base_url=qwen3_aligned.url, timeout=120) as http:
        r = http.post("/v1/audio/speech", json={"model": "piper", "input": TEXT, "response_format": "pcm",
                                                "seed": 1, "word_timestamps": True})
        assert r.status_code == 200, r.text
        words = json.loads(r.headers["X-Word-Timestamps"])
        assert [w["word"] for w in words] == split_words(TEXT)
        assert ordered_inside(words, pcm16(r.content).size / RATE * 1000)
        with http.stream("POST", "/v1/audio/speech", json={"model": "piper", "input": TEXT, "stream": True,
                                                           "response_format": "pcm", "seed": 2,
                                                           "word_timestamps": True}) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    streamed = [w for e in events for w in e.get("timestamps") or []]
    assert [w["word"] for w in streamed] == split_words(TEXT)
    audio = pcm16(b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"))
    assert ordered_inside(streamed, audio.size / RATE * 1000)


def test_grpc_clients_get_every_word_as_the_ensembles_output(qwen3_aligned):
    chunks, error = stream_model(qwen3_aligned.grpc_url, "piper", TEXT, params={"seed": 1, "word_timestamps": True})
    assert error is None, error
    words = [w for c in chunks for w in json.loads(c.as_numpy("words").reshape(-1)[0])]
    assert [w["word"] for w in words] == split_words(TEXT)


def test_the_checkpoints_languages_are_accepted_and_others_are_a_400_naming_them(qwen3_aligned):
    import httpx

    def ask(language: str) -> httpx.Response:
        return httpx.post(qwen3_aligned.url + "/v1/audio/speech", timeout=60,
                          json={"model": "piper", "input": "Bonjour tout le monde.", "word_timestamps": True,
                                "language": language})

    refused = ask("Swedish")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "word_timestamps"
    assert "zh, en, yue, fr, de, it, ja, ko, pt, ru, es" in refused.json()["error"]["message"]
    # French passes the aligner's check; Piper itself takes no language field, and says so.
    french = ask("French")
    assert french.status_code == 400 and french.json()["error"]["param"] == "language", french.text
    _, error = stream_model(qwen3_aligned.grpc_url, "piper", TEXT,
                            params={"word_timestamps": True, "language": "Swedish"})
    assert error is not None and "zh, en, yue" in str(error)
    assert httpx.get(qwen3_aligned.url + "/health").status_code == 200
