"""The word_aligner stage in-process (tritontts.serving.word_aligner): a request that did not
ask costs no alignment; a stream that asked gets each word once, in order, keyed by its
stream_id, and its state is dropped at its last chunk."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tritontts.alignment.words import split_words
from tritontts.benchmark.word_alignment import piper_known_words
from tritontts.deploy.repository import STAGE_REPOSITORY
from tritontts.serving.stage import Inputs, StageContext
from tritontts.serving.word_aligner import WordAlignerStage


@pytest.fixture(scope="module")
def stage():
    return WordAlignerStage(StageContext("word_aligner", STAGE_REPOSITORY / "word_aligner",
                                         parameters={"threads": "1", "align_every_seconds": "4"}))


def chunk(audio, rate, stream_id, index, final, asked):
    return Inputs(audio=np.asarray(audio, np.float32), sample_rate=np.array([rate], np.int32),
                  stream_id=np.array([stream_id]), chunk_index=np.array([index], np.int32),
                  is_final=np.array([final]), words_request=np.array([asked.encode()], object))


def test_a_request_that_did_not_ask_passes_with_no_words(stage, monkeypatch):
    monkeypatch.setattr(stage.aligner, "align_window", lambda *a: pytest.fail("aligned"))
    out = stage.run(chunk(np.ones(24000), 24000, 5, 0, True, ""))
    assert out == {"words": "[]"} and stage.streams.get(5) is None


def test_two_interleaved_streams_each_get_their_own_words(stage):
    known = piper_known_words(seed=1)
    text_b = "Two short words."
    audio_b = known.audio[:known.sample_rate * 2]
    step = known.sample_rate // 2
    asked_a, asked_b = json.dumps({"text": known.text}), json.dumps({"text": text_b})
    placed = {1: [], 2: []}
    chunks_a = range(0, known.audio.size, step)
    for n, i in enumerate(chunks_a):
        final = i + step >= known.audio.size
        placed[1] += json.loads(stage.run(chunk(known.audio[i:i + step], known.sample_rate, 1, n, final,
                                                asked_a))["words"])
        if n < 4:       # stream 2's chunks between stream 1's
            part = audio_b[n * step:(n + 1) * step]
            placed[2] += json.loads(stage.run(chunk(part, known.sample_rate, 2, n, n == 3, asked_b))["words"])
    assert [w["word"] for w in placed[1]] == split_words(known.text)
    assert [w["word"] for w in placed[2]] == split_words(text_b)
    assert stage.streams.get(1) is None and stage.streams.get(2) is None
