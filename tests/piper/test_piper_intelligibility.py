"""Intelligibility of the served default voice, judged by Whisper tiny.en."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import jiwer
import numpy as np
import soxr

from tritontts.testing.audio import HARVARD, decode

STACK_FAMILIES = ("piper",)


def normalize(text: str) -> str:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("it's", "it is")).strip()


def test_whisper_understands_the_default_voice(http, whisper):
    def served(sentence):
        r = http.post("/v1/audio/speech", json={"input": sentence, "voice": "default",
                                                 "response_format": "wav", "seed": 11})
        assert r.status_code == 200, r.text
        return decode(r.content)

    with ThreadPoolExecutor(4) as pool:
        audios = list(pool.map(served, HARVARD))
    hypotheses = []
    for audio, rate in audios:
        audio16k = soxr.resample(audio, rate, 16000).astype(np.float32)
        segments, _ = whisper.transcribe(audio16k, language="en", beam_size=1)
        hypotheses.append(" ".join(s.text for s in segments))
    wer = jiwer.wer([normalize(t) for t in HARVARD], [normalize(h) for h in hypotheses])
    print("\n".join(f"{r!r} -> {h!r}" for r, h in zip(HARVARD, hypotheses)))
    print(f"word error rate: {wer:.3f}")
    assert wer <= 0.2
