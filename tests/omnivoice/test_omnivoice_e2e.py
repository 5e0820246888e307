"""OmniVoice through the real tritonserver and front on a tiny random checkpoint: segment-
by-segment streaming (each segment one chunk, equal to the stages run offline), the
automatic voice, voice design, language, speed, cloning from ref_audio and from an uploaded
voice, num_steps / guidance_scale, the generator batching concurrent requests, and the
400s of bad requests."""
from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile as sf
import torch

from tritontts.family import synthetic_reference
from tritontts.testing.audio import pcm16, rms
from tritontts.testing.grpc import stream_model

STACK_FAMILIES = ("omnivoice",)

FRAME = 960            # samples per 25 Hz frame at 24 kHz
PADDING = 2 * 2400     # 0.1 s of silence each side of a segment
TWO_SEGMENTS = ("The birch canoe slid on the smooth planks of the old wooden dock. "
                "Glue the sheet to the dark blue background before the paint dries.")
STEPS = 8
REF = synthetic_reference()


def speak(http, text=TWO_SEGMENTS, **body):
    return http.post("/v1/audio/speech", json={"model": "omnivoice", "input": text, "seed": 3,
                                               "num_steps": STEPS, "response_format": "pcm", **body})


def offline(checkpoint_dir, text, params, seed):
    """The three stages' Triton-free code run in this process, segment by segment."""
    from tritontts.families.omnivoice.checkpoint import open_checkpoint
    from tritontts.families.omnivoice.request import parse_omnivoice_params
    from tritontts.families.omnivoice.stages import OmniVoicePromptStage, shape_output
    from tritontts.families.omnivoice.generator import (
        UnmaskJob, UnmaskSettings, load_generator, unmask)
    from tritontts.nn.higgs_codec import load_codec_decoder
    from tritontts.serving.stage import StageContext

    ckpt = open_checkpoint(checkpoint_dir)
    prompt = OmniVoicePromptStage(StageContext("omnivoice_prompt", checkpoint_dir), ckpt)
    model, decoder = load_generator(ckpt), load_codec_decoder(ckpt.codec_dir)
    chunks, first = [], None
    for item in prompt.plan(text, parse_omnivoice_params(params), seed):
        ids = torch.from_numpy(item["ids"].T.astype(np.int64)).contiguous()
        if item["from_first"]:
            ids[:, item["audio_start"]:item["audio_start"] + first.shape[1]] = first
        codes = unmask(model, [UnmaskJob(ids, item["audio_start"], item["frames"], item["seed"],
                                         UnmaskSettings(num_steps=item["num_steps"],
                                                        guidance_scale=item["guidance_scale"]))])[0]
        first = codes if first is None else first
        with torch.no_grad():
            audio = decoder(codes[None])[0].numpy()
        chunks.append(shape_output(audio, item["ref_rms"], item["speed"]))
    return chunks


def test_each_segment_streams_as_one_chunk_equal_to_the_stages_run_offline(stack, random_checkpoints):
    params = {"num_steps": STEPS, "seed": 11, "language": "en"}
    chunks, error = stream_model(stack.grpc_url, "omnivoice", TWO_SEGMENTS, params=params)
    assert error is None, error
    assert [int(c.as_numpy("chunk_index").reshape(-1)[0]) for c in chunks] == [0, 1]
    assert [bool(c.as_numpy("is_final").reshape(-1)[0]) for c in chunks] == [False, True]
    expected = offline(random_checkpoints["omnivoice"], TWO_SEGMENTS, params, 11)
    for chunk, want in zip(chunks, expected):
        got = chunk.as_numpy("audio").reshape(-1)
        assert int(chunk.as_numpy("sample_rate").reshape(-1)[0]) == 24000
        assert (got.size - PADDING) % FRAME == 0 and rms(got) > 1e-3
        assert got.shape == want.shape
        assert float(np.abs(got - want).max()) <= 1e-4 * max(float(np.abs(want).max()), 1e-6)


def test_streamed_and_whole_responses_are_the_same_audio(http):
    whole = speak(http)
    r = http.post("/v1/audio/speech", json={"model": "omnivoice", "input": TWO_SEGMENTS, "seed": 3,
                                            "num_steps": STEPS, "response_format": "pcm", "stream_format": "audio"})
    assert whole.status_code == r.status_code == 200, r.text
    assert whole.content == r.content


def test_the_same_seed_repeats_and_another_seed_changes_the_audio(http):
    a, b, c = speak(http).content, speak(http).content, speak(http, seed=4).content
    assert a == b and a != c


def test_language_instructions_steps_and_guidance_each_change_the_audio(http):
    base = speak(http, language="en").content
    for fields in ({"language": "German"}, {"instructions": "male, elderly, whisper"},
                   {"num_steps": 12}, {"guidance_scale": 0.0}):
        r = speak(http, language="en", **fields) if "language" not in fields else speak(http, **fields)
        assert r.status_code == 200, r.text
        assert r.content != base, fields


def test_speed_divides_the_estimated_duration_and_the_pads(http):
    text = "Glue the sheet to the dark blue background before the paint dries."
    normal, fast = pcm16(speak(http, text).content), pcm16(speak(http, text, speed=2.0).content)
    frames_normal = (normal.size - PADDING) // FRAME
    frames_fast = (fast.size - PADDING // 2) // FRAME  # the pads follow speed too
    assert abs(frames_fast - frames_normal / 2) <= 1, (frames_normal, frames_fast)


def test_cloning_from_ref_audio_and_from_the_uploaded_voice_give_the_same_audio(http):
    direct = speak(http, **REF)
    assert direct.status_code == 200, direct.text
    auto = speak(http).content
    assert direct.content != auto and rms(pcm16(direct.content)) > 1e-3
    r = http.post("/v1/audio/voices", data={"name": "Reader", "consent": "test", "ref_text": REF["ref_text"]},
                  files={"audio_sample": ("ref.wav", base64.b64decode(REF["ref_audio"]), "audio/wav")})
    assert r.status_code == 200, r.text
    try:
        by_name = speak(http, voice="reader")
        assert by_name.status_code == 200, by_name.text
        assert by_name.content == direct.content
    finally:
        http.delete("/v1/audio/voices/Reader")


def test_concurrent_requests_share_generator_batches(stack, http):
    """Triton's dynamic batcher hands the generator several segments at once: fewer
    executions than inferences across 4 concurrent two-segment requests."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(stack.grpc_url)

    def counts():
        stats = client.get_inference_statistics("omnivoice_generator", as_json=True)["model_stats"][0]
        return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))

    before = counts()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda seed: speak(http, seed=seed), range(20, 24)))
    assert all(r.status_code == 200 for r in results)
    after = counts()
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == 8 and executions < inferences, (inferences, executions)


def _wav(seconds: float, amplitude: float = 0.3) -> str:
    t = np.arange(int(seconds * 24000)) / 24000
    buf = io.BytesIO()
    sf.write(buf, (amplitude * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 24000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("fields,needle", [
    ({"language": "klingon"}, "language"),
    ({"instructions": "purple"}, "instructions"),
    ({"instructions": "male, female"}, "instructions"),
    ({"num_steps": 200}, "num_steps"),
    ({"guidance_scale": 99}, "guidance_scale"),
    ({"ref_audio": REF["ref_audio"]}, "ref_text"),
    ({"ref_audio": _wav(0.3), "ref_text": "Hi."}, "between 1 and 30 s"),
    ({"ref_audio": _wav(2.0, 0.0), "ref_text": "Hi."}, "silent"),
    ({"voice": "vivian"}, "no preset speakers"),
    ({"speed": 9}, "speed"),
], ids=["language", "instructions", "instruction_conflict", "num_steps", "guidance", "no_ref_text",
        "short_reference", "silent_reference", "preset_voice", "speed"])
def test_bad_requests_get_400_naming_the_field(http, fields, needle):
    r = speak(http, "Hello there.", **fields)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert http.get("/health").status_code == 200
