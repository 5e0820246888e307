"""Qwen3-TTS CustomVoice through the real tritonserver and front, on a tiny random
checkpoint: preset speakers (any case), the chunk schedule (1 frame, doubling up to 25),
tasks the checkpoint cannot do, seeded streaming equal to the whole file."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tritontts.testing.audio import decode, pcm16, rms
from tritontts.testing.grpc import stream_model
from tritontts.testing.stack import REPO

STACK_FAMILIES = ("qwen3_tts",)

TEXT = "Hello there, how are you today?"
FRAME = 1920          # samples per 12.5 Hz frame at 24 kHz
SETTINGS = REPO / "model_repository/qwen3_tts_talker/1/model.json"


def speak(http, **body):
    return http.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": TEXT,
                                               "max_new_tokens": 20, "seed": 1, **body})


def test_wav_is_24khz_with_one_frame_per_1920_samples(http):
    r = speak(http, response_format="wav")
    assert r.status_code == 200, r.text
    audio, rate = decode(r.content)
    assert rate == 24000 and audio.size == 20 * FRAME and rms(audio) > 1e-3


def test_speakers_are_case_insensitive_and_change_the_voice(http):
    lower, upper = speak(http, voice="vivian", response_format="pcm"), speak(http, voice="VIVIAN", response_format="pcm")
    other = speak(http, voice="ryan", response_format="pcm")
    assert lower.status_code == upper.status_code == other.status_code == 200
    assert lower.content == upper.content
    assert lower.content != other.content


def test_unknown_speaker_is_400_listing_the_speakers(http):
    r = speak(http, voice="nobody")
    assert r.status_code == 400
    assert "unknown voice 'nobody'" in r.json()["error"]["message"]
    assert "vivian" in r.json()["error"]["message"].lower()


@pytest.mark.parametrize("fields,needle", [
    ({"task_type": "VoiceDesign", "instructions": "A calm voice."}, "needs a voice_design checkpoint"),
    ({"ref_audio": "AAAA", "ref_text": "x"}, "needs a base checkpoint"),
    ({"language": "Klingon"}, "language 'Klingon' is not one of"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
], ids=["voice_design_task", "base_task", "unknown_language", "zero_frames"])
def test_requests_the_checkpoint_cannot_serve_are_400_naming_what_is_needed(http, fields, needle):
    r = speak(http, **fields)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_chunks_grow_from_one_frame_doubling_up_to_25(stack):
    settings = json.loads(SETTINGS.read_text())["chunks"]
    assert (settings["first_frames"], settings["growth"], settings["frames"]) == (1, 2, 25)
    chunks, error = stream_model(stack.grpc_url, "qwen3_tts", TEXT,
                                 params={"max_new_tokens": 60, "seed": 2}, timeout=300)
    assert error is None
    sizes = [c.as_numpy("audio").size // FRAME for c in chunks]
    assert sizes == [1, 2, 4, 8, 16, 25, 4], sizes


def test_initial_codec_chunk_frames_sets_the_first_chunk(stack):
    chunks, error = stream_model(stack.grpc_url, "qwen3_tts", TEXT,
                                 params={"max_new_tokens": 12, "seed": 2,
                                         "initial_codec_chunk_frames": 5}, timeout=300)
    assert error is None
    assert [c.as_numpy("audio").size for c in chunks] == [5 * FRAME, 7 * FRAME]


def test_streamed_pcm_equals_the_whole_file_for_a_seed(http):
    whole = pcm16(speak(http, response_format="pcm", max_new_tokens=40, seed=9).content)
    with http.stream("POST", "/v1/audio/speech", json={
            "model": "qwen3_tts", "input": TEXT, "max_new_tokens": 40, "seed": 9,
            "response_format": "pcm", "stream_format": "audio"}) as r:
        assert r.status_code == 200
        pieces = list(r.iter_bytes())
    streamed = pcm16(b"".join(pieces))
    assert len(pieces) >= 2 and streamed.size == whole.size == 40 * FRAME
    assert float(np.abs(streamed - whole).max()) == 0.0


def test_sampling_overrides_in_extra_params_reach_both_samplers(http):
    """Greedy talker (temperature 0) and code predictor (subtalker_top_k 1): the seed no
    longer matters. Control: with the checkpoint's sampling, two seeds differ."""
    greedy = {"temperature": 0, "subtalker_top_k": 1}
    a = speak(http, seed=1, response_format="pcm", extra_params=greedy)
    b = speak(http, seed=2, response_format="pcm", extra_params=greedy)
    assert a.status_code == b.status_code == 200, a.text
    assert a.content == b.content
    assert speak(http, seed=1, response_format="pcm").content != speak(http, seed=2, response_format="pcm").content
    bad = speak(http, extra_params={"top_p": 0})
    assert bad.status_code == 400 and "top_p must be above 0" in bad.json()["error"]["message"]
