"""AuK through the real tritonserver and front on a tiny random checkpoint: seeded streams equal
the pipeline run by the references in this process (transformers' Qwen2.5-Omni thinker fused,
vLLM-Omni 0.30's sampler, DiT and VAE), for an instruction alone, for speech, and for an edit
of a clip; the chunks follow the VAE's plan (10 frames, then doubling up to 200) and join exactly; the output
length is duration_seconds or the clip's; concurrent requests (batched in the DiT) equal their
solo runs; bad requests are a 400 that says what to fix."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf

from tritontts.testing.audio import rms
from tritontts.testing.grpc import stream_model
from tritontts.testing.speech import assert_concurrent_equal_solo

STACK_FAMILIES = ("auk",)
HOP, RATE = 480, 24000
STEPS = 4


def clip_wav(seconds: float = 1.3) -> tuple[np.ndarray, str]:
    t = np.arange(int(seconds * RATE)) / RATE
    audio = (0.3 * np.sin(2 * np.pi * 150 * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, audio, RATE, format="WAV", subtype="FLOAT")
    return audio, base64.b64encode(buf.getvalue()).decode()


def served(stack, text: str, params: dict):
    chunks, error = stream_model(stack.grpc_url, "auk", text, params=params)
    assert error is None, error
    sizes = [c.as_numpy("audio").size for c in chunks]
    assert {int(c.as_numpy("sample_rate").reshape(-1)[0]) for c in chunks} == {RATE}
    assert [int(c.as_numpy("chunk_index").reshape(-1)[0]) for c in chunks] == list(range(len(chunks)))
    return np.concatenate([c.as_numpy("audio").reshape(-1) for c in chunks]), sizes


def check_plan(sizes: list[int], frames: int) -> None:
    """10 frames first (the first audio soon), then each chunk twice the last, up to 200."""
    plan, left, size = [], frames, 10
    while left > 0:
        plan.append(min(size, left) * HOP)
        left, size = left - size, min(200, 2 * size)
    assert sizes == plan


@pytest.mark.parametrize("text, params, instruction", [
    ("", {"instructions": "A dog barks twice, then a door closes.", "duration_seconds": 1.5},
     "A dog barks twice, then a door closes."),
    ("Hello there.", {"instructions": "A calm, low voice.", "input_mode": "speech", "duration_seconds": 1.3, "sway": -0.5,
                      "guidance_scale": 3.0},
     'Generate speech based on the following description: "A calm, low voice.". '
     'The content to speak is: "Hello there.".'),
    ("Good night.", {"input_mode": "speech", "duration_seconds": 1.1, "t_grid": [0, 0.3, 0.7, 1], "guidance_scale": 0},
     'Generate speech based on the following description: "A clear, natural voice.". '
     'The content to speak is: "Good night.".'),
])
def test_a_seeded_stream_equals_the_reference_pipeline_and_follows_the_chunk_plan(stack, random_checkpoints,
                                                                                   text, params, instruction):
    from tritontts.families.auk.upstream import auk_upstream_audio

    params = {"seed": 5, **({} if "t_grid" in params else {"num_inference_steps": STEPS}), **params}
    got, sizes = served(stack, text, params)
    frames = round(params["duration_seconds"] * 50)
    want = auk_upstream_audio(random_checkpoints["auk"], instruction, frames, 5, nfe=STEPS,
                               cfg=params.get("guidance_scale", 2.0), sway=params.get("sway", -1.0),
                               t_grid=params.get("t_grid"))
    diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
    print(f"{frames} frames in chunks of {[s // HOP for s in sizes]}; max-abs-diff {diff:.2e} "
          f"(peak {float(np.abs(want).max()):.3f})")
    check_plan(sizes, frames)
    assert float(np.abs(want).max()) > 1e-2 and diff < 1e-4 and rms(got) > 1e-3


def test_an_edit_of_a_clip_keeps_its_length_and_equals_the_reference_with_a_posterior_draw(stack,
                                                                                         random_checkpoints):
    from tritontts.families.auk.upstream import auk_upstream_audio

    audio, encoded = clip_wav(1.3)
    params = {"instructions": "Add rain to the recording.", "ref_audio": encoded, "seed": 9,
              "num_inference_steps": STEPS, "vae_sample": True}
    got, sizes = served(stack, "", params)
    frames = audio.size // HOP
    want = auk_upstream_audio(random_checkpoints["auk"], "Add rain to the recording.", frames, 9, nfe=STEPS,
                               clip24k=audio, vae_sample=True)
    diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
    print(f"edit of a {audio.size / RATE:.2f} s clip: {frames} frames; max-abs-diff {diff:.2e} "
          f"(peak {float(np.abs(want).max()):.3f})")
    check_plan(sizes, frames)
    assert float(np.abs(want).max()) > 1e-2 and diff < 1e-4
    # The mean (no posterior draw) is another reference: the draw mattered.
    mean = auk_upstream_audio(random_checkpoints["auk"], "Add rain to the recording.", frames, 9, nfe=STEPS,
                               clip24k=audio, vae_sample=False)
    print(f"posterior draw vs mean: {float(np.abs(got - mean).max()):.2e}")
    assert float(np.abs(got - mean).max()) > 1e-3


def test_the_openai_sdk_shape_with_empty_input_and_whole_instructions_gives_wav_of_the_asked_length(http):
    r = http.post("/v1/audio/speech", json={"model": "auk", "input": "", "voice": "default",
                                            "instructions": "Thunder rolls in the distance.",
                                            "response_format": "wav", "seed": 1, "extra_params": {
                                                "duration_seconds": 0.8, "num_inference_steps": 2}})
    assert r.status_code == 200, r.text
    audio, rate = sf.read(io.BytesIO(r.content), dtype="float32")
    assert rate == RATE and audio.size == 40 * HOP and rms(audio) > 1e-4


def test_input_alone_is_the_whole_instruction_as_in_vllm_omni(http):
    """vLLM-Omni reads an AuK request's input as the complete instruction: the same audio as
    that instruction sent in instructions (not speech reading it aloud)."""
    def speak(**body):
        r = http.post("/v1/audio/speech", json={"model": "auk", "response_format": "pcm", "seed": 4, **body,
                                                "extra_params": {"num_inference_steps": 2, "duration_seconds": 0.6}})
        assert r.status_code == 200, r.text
        return r.content

    as_input = speak(input="A dog barks twice.")
    assert as_input == speak(input="", instructions="A dog barks twice.")
    spoken = http.post("/v1/audio/speech", json={"model": "auk", "response_format": "pcm", "seed": 4,
                                                 "input": "A dog barks twice.", "extra_params": {
                                                     "num_inference_steps": 2, "duration_seconds": 0.6,
                                                     "input_mode": "speech"}})
    assert spoken.status_code == 200 and spoken.content != as_input


def test_concurrent_requests_equal_their_solo_runs(http):
    """Requests gathered into one DiT batch (rows of other lengths padded, masked) each give what
    they give alone."""
    def speak(**body):
        return http.post("/v1/audio/speech", json={
            "model": "auk", "input": "", "response_format": "pcm", "seed": body.pop("seed"),
            "extra_params": {"num_inference_steps": 3, "duration_seconds": body.pop("duration")},
            "instructions": body.pop("instructions", "Birds sing at dawn."), **body})

    assert_concurrent_equal_solo(speak, [{"seed": 21, "duration": 0.6}, {"seed": 22, "duration": 1.1},
                                         {"seed": 23, "duration": 0.9, "instructions": "A long, slow bell."}])


@pytest.mark.parametrize("body, needle", [
    ({"input": ""}, "input is empty"),
    ({"input": "Rain falls.", "instructions": "Thunder."}, "not both"),
    ({"input": "Hi.", "extra_params": {"t_grid": [0, 0.7, 0.3, 1]}}, "increase strictly"),
    ({"input": "Hi.", "extra_params": {"vae_sample": True}}, "send ref_audio"),
    ({"input": "Hi.", "extra_params": {"duration_seconds": 45}}, "duration_seconds must be between"),
    ({"input": "Hi.", "ref_text": "hello"}, "ref_text"),
    ({"input": "Hi.", "voice": "nobody"}, "unknown voice"),
    ({"input": "Hi.", "instructions": "Add rain.", "ref_audio": clip_wav(0.5)[1], "input_mode": "speech"},
     "leave input empty"),
])
def test_bad_requests_are_a_400_that_says_what_to_fix(http, body, needle):
    r = http.post("/v1/audio/speech", json={"model": "auk", "voice": "default", **body})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert http.get("/health").status_code == 200
