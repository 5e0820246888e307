"""Qwen3-TTS Base (voice cloning) through the real tritonserver and front, on a tiny random
Base checkpoint: in-context cloning from ref_audio + ref_text, x-vector-only cloning, a
precomputed speaker_embedding, the reference cache, and the 400s of cloning requests."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf

from tritontts.testing.audio import pcm16, rms

STACK_FAMILIES = ("qwen3_tts",)
STACK_CHECKPOINT_OPTIONS = {"qwen3_tts": {"kind": "base"}}

TEXT = "Hello there, this is a cloned voice."
FRAME = 1920


def wav_b64(audio: np.ndarray, rate: int = 24000) -> str:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def reference(seconds: float = 3.0, rate: int = 24000, pitch: float = 150.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * pitch * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32)


REF = {"ref_audio": wav_b64(reference()), "ref_text": "This is the reference voice."}


def speak(http, **body):
    return http.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": TEXT, "seed": 3,
                                               "max_new_tokens": 16, "response_format": "pcm", **body})


def test_in_context_cloning_returns_exactly_the_generated_frames(http):
    r = speak(http, **REF)
    assert r.status_code == 200, r.text
    audio = pcm16(r.content)
    # The reference's codes are decoder context only: none of its audio is returned.
    assert audio.size == 16 * FRAME and rms(audio) > 1e-3


def test_x_vector_only_and_a_different_reference_change_the_audio(http):
    icl = speak(http, **REF).content
    xvec = speak(http, ref_audio=REF["ref_audio"], x_vector_only_mode=True)
    other = speak(http, ref_audio=wav_b64(reference(pitch=300.0)), ref_text=REF["ref_text"])
    assert xvec.status_code == other.status_code == 200
    assert xvec.content != icl and other.content != icl


def test_precomputed_speaker_embedding_is_served(http):
    r = speak(http, speaker_embedding=[0.01] * 128)
    assert r.status_code == 200, r.text
    assert pcm16(r.content).size == 16 * FRAME


@pytest.mark.parametrize("fields,needle", [
    ({}, "Base clones a voice: give ref_audio"),
    ({"ref_audio": REF["ref_audio"]}, "needs ref_text"),
    ({**REF, "speaker_embedding": [0.1] * 128}, "mutually exclusive"),
    ({"speaker_embedding": [0.1] * 7}, "has 7 values; this checkpoint takes 128"),
    ({"speaker_embedding": [0.1] * 127 + ["x"]}, "speaker_embedding"),
    ({"ref_audio": wav_b64(reference(0.3)), "ref_text": "x"}, "between 1 and 30 s"),
    ({"ref_audio": base64.b64encode(b"not audio").decode(), "ref_text": "x"}, "could not be decoded"),
    ({"ref_audio": "%%%", "ref_text": "x"}, "base64"),
    ({**REF, "voice": "vivian"}, "has no preset speakers"),
    ({**REF, "instructions": "happy"}, "instructions are not used"),
], ids=["no_reference", "no_ref_text", "both_references", "embedding_size", "embedding_type",
        "too_short", "not_audio", "not_base64", "preset_voice", "instructions"])
def test_bad_cloning_requests_get_400(http, fields, needle):
    body = {"model": "qwen3_tts", "input": TEXT, "max_new_tokens": 4, **fields}
    r = http.post("/v1/audio/speech", json={"task_type": "Base", **body})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert http.get("/health").status_code == 200
