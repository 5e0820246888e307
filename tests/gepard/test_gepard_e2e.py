"""Gepard-1.0 through the real tritonserver and front on a tiny random checkpoint: a seeded
stream equals the pipeline run in this process (the references' talker loop: transformers'
Qwen3.5 with vLLM-Omni's heads; one whole NanoCodec decode) in the chunk plan the talker
promises (10 frames, then 86); the default voice is listed and speaks WAV; concurrent
streams equal their solo runs; what the model cannot do is a 400 that says so."""
from __future__ import annotations

import numpy as np
import pytest

from tritontts.family import synthetic_reference
from tritontts.testing.audio import pcm16, rms
from tritontts.testing.grpc import stream_model
from tritontts.testing.speech import assert_concurrent_equal_solo

STACK_FAMILIES = ("gepard",)
TEXT = "The birch canoe slid on the smooth planks."
HOP = 1024


def in_process_audio(root, text: str, seed: int, frames: int) -> np.ndarray:
    from tritontts.families.gepard.checkpoint import open_checkpoint
    from tritontts.families.gepard.codec import NanoCodecDecoder
    from tritontts.families.gepard.prompt import GepardPromptBuilder
    from tritontts.families.gepard.upstream import gepard_upstream_frames, gepard_upstream_talker

    ckpt = open_checkpoint(root)
    backbone, omni = gepard_upstream_talker(ckpt)
    ids = GepardPromptBuilder(ckpt.root, ckpt.config)(text)
    codes = gepard_upstream_frames(backbone, omni, ckpt.config, ids, seed, frames)
    return NanoCodecDecoder.from_nemo(ckpt.codec_file).decode_codes(codes.T[None])[0].numpy()


def test_a_seeded_stream_equals_the_pipeline_in_process_in_chunks_of_10_then_86(stack, random_checkpoints):
    chunks, error = stream_model(stack.grpc_url, "gepard", TEXT, params={"seed": 11, "max_new_tokens": 100})
    assert error is None, error
    want = in_process_audio(random_checkpoints["gepard"], TEXT, 11, 100)
    sizes = [c.as_numpy("audio").size // HOP for c in chunks]
    got = np.concatenate([c.as_numpy("audio").reshape(-1) for c in chunks])
    diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
    print(f"{want.size // HOP} frames in chunks of {sizes}; max-abs-diff {diff:.2e}")
    plan = [10] + [86] * len(sizes)
    assert sizes[:-1] == plan[:len(sizes) - 1] and 0 < sizes[-1] <= plan[len(sizes) - 1]
    assert sum(sizes) == want.size // HOP
    assert {int(c.as_numpy("sample_rate").reshape(-1)[0]) for c in chunks} == {22050}
    assert diff < 1e-4 and rms(got) > 1e-3


def test_the_default_voice_is_listed_and_speaks_22050_hz_wav_of_the_asked_frames(http):
    assert "default" in str(http.get("/v1/audio/voices").json())
    r = http.post("/v1/audio/speech", json={"model": "gepard", "input": TEXT, "voice": "default", "seed": 3,
                                            "max_new_tokens": 15, "response_format": "wav"})
    assert r.status_code == 200, r.text
    import io
    import wave

    with wave.open(io.BytesIO(r.content)) as w:
        assert w.getframerate() == 22050 and w.getnchannels() == 1
        frames = w.getnframes()
        audio = pcm16(w.readframes(frames))
    assert 0 < frames <= 15 * HOP and frames % HOP == 0 and rms(audio) > 1e-3


def test_concurrent_streams_equal_their_solo_runs(http):
    """Three seeded requests batched in the engine (rows of one step) each give what they
    give alone: every row draws from its own generator."""
    def speak(**body):
        return http.post("/v1/audio/speech", json={"model": "gepard", "input": TEXT, "max_new_tokens": 30,
                                                   "response_format": "pcm", **body})

    assert_concurrent_equal_solo(speak, [{"seed": 21}, {"seed": 22}, {"seed": 23, "input": "Another text."}])


@pytest.mark.parametrize("fields,needle", [
    (synthetic_reference(), "default voice only"),
    ({"instructions": "whisper"}, "no style instructions"),
    ({"voice": "nobody"}, "unknown voice"),
    ({"extra_params": {"temperature": 0.7}}, "fixed by its checkpoint"),
    ({"max_new_tokens": 5000}, "max_new_tokens"),
])
def test_what_the_model_cannot_do_is_a_400_that_says_so(http, fields, needle):
    r = http.post("/v1/audio/speech", json={"model": "gepard", "input": TEXT, "max_new_tokens": 10, **fields})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert http.get("/health").status_code == 200
