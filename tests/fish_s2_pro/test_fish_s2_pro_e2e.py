"""Fish Speech S2 Pro through the real tritonserver and front on a tiny random checkpoint: a
seeded stream equals the pipeline run in this process (the prompt stage, our PyTorch dual AR
with the same per-request generator, ONE whole codec decode: the codec stage streams exactly),
in the chunk plan the talker promises (4 frames, then 25), zero-shot and cloned; an uploaded
voice speaks as its recording does; temperature changes the speech; concurrent streams equal
their solo runs; 44.1 kHz survives every response format; the 400s of what the model cannot
do."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tritontts.family import synthetic_reference
from tritontts.testing.audio import decode, pcm16, rms
from tritontts.testing.grpc import stream_model
from tritontts.testing.speech import assert_concurrent_equal_solo, uploaded_voice

STACK_FAMILIES = ("fish_s2_pro",)
TEXT = "The birch canoe slid on the smooth planks."
REF = synthetic_reference()
PLAN = [4] + [25] * 8


def speak(http, **body):
    return http.post("/v1/audio/speech", json={"model": "fish_s2_pro", "input": TEXT, "seed": 3,
                                               "max_new_tokens": 24, "response_format": "pcm", **body})


def in_process(checkpoint_dir, text: str, params: dict) -> tuple[np.ndarray, int]:
    """(one whole decode of the utterance's frames, the codec's samples per frame): the
    prompt stage's prompt, our PyTorch dual AR drawing from the request's generator."""
    from safetensors.torch import load_file

    from tritontts.families.fish_s2_pro.checkpoint import open_checkpoint
    from tritontts.families.fish_s2_pro.dual_ar import FishDualAR, FishSampling, FrameSampler
    from tritontts.families.fish_s2_pro.stages import FishS2ProPromptStage, load_served_codec
    from tritontts.serving.stage import Inputs, StageContext

    ckpt = open_checkpoint(checkpoint_dir)
    stage = FishS2ProPromptStage(StageContext("fish_s2_pro_prompt", checkpoint_dir), ckpt)
    out = stage.run(Inputs(text=np.array([text.encode()], object), voice=np.array([b""], object),
                           params=np.array([json.dumps(params).encode()], object)))
    prompt = torch.from_numpy(out["prompt"])
    talker = FishDualAR(ckpt.config)
    talker.load_state_dict(load_file(str(ckpt.weight_files[0])))
    sampling = FishSampling(**{k: params[k] for k in ("temperature", "top_p") if k in params})
    frames = talker.eval().generate(prompt[0], prompt[1:].T, FrameSampler(torch.Generator().manual_seed(params["seed"]),
                                                                          sampling), int(out["max_frames"]))
    codec = load_served_codec(ckpt)
    with torch.no_grad():
        return codec.decode(frames[:, 1:].T[None])[0, 0].numpy(), codec.config.hop


@pytest.mark.parametrize("fields", [{}, REF], ids=["zero_shot", "cloned"])
def test_a_seeded_stream_equals_the_pipeline_in_process(stack, random_checkpoints, fields):
    params = {"seed": 11, "max_new_tokens": 40, **fields}
    chunks, error = stream_model(stack.grpc_url, "fish_s2_pro", TEXT, params=params)
    assert error is None, error
    whole, hop = in_process(random_checkpoints["fish_s2_pro"], TEXT, params)
    sizes = [c.as_numpy("audio").size // hop for c in chunks]
    got = np.concatenate([c.as_numpy("audio").reshape(-1) for c in chunks])
    diff = float(np.abs(got - whole).max()) if got.shape == whole.shape else float("inf")
    print(f"{whole.size // hop} frames in chunks of {sizes}; served stream vs one whole decode {diff:.2e} "
          f"(peak {np.abs(whole).max():.2f})")
    assert {int(c.as_numpy("sample_rate").reshape(-1)[0]) for c in chunks} == {44100}
    assert sizes[:-1] == PLAN[:len(sizes) - 1] and 0 < sizes[-1] <= PLAN[len(sizes) - 1]
    assert diff < 1e-4 and rms(got) > 1e-3


def test_an_uploaded_voice_speaks_as_its_recording_does(http):
    direct = speak(http, **REF)
    assert direct.status_code == 200, direct.text
    with uploaded_voice(http, "Narrator", REF):
        by_name = speak(http, voice="narrator")
        assert by_name.status_code == 200, by_name.text
        assert by_name.content == direct.content
        assert by_name.content != speak(http).content       # not the model's own voice


def test_temperature_changes_the_speech_and_a_seed_repeats_it(http):
    base, again, hotter = speak(http), speak(http), speak(http, extra_params={"temperature": 1.2})
    for r in (base, again, hotter):
        assert r.status_code == 200, r.text
    assert base.content == again.content and hotter.content != base.content


def test_concurrent_streams_equal_their_solo_runs(http):
    bodies = [{"seed": 21}, {"seed": 22, **REF}, {"seed": 23, "extra_params": {"top_p": 0.9}}]
    assert_concurrent_equal_solo(lambda **b: speak(http, **b), bodies)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_44khz_audio_comes_through_every_format(http, fmt):
    pcm = pcm16(speak(http).content)
    r = speak(http, response_format=fmt)
    assert r.status_code == 200, r.text
    audio, rate = decode(r.content)
    # Opus has no 44.1 kHz mode: the front resamples to 48 kHz for it.
    assert rate == (48000 if fmt == "opus" else 44100)
    assert abs(audio.size / rate - pcm.size / 44100) < 0.05 and rms(audio) > 1e-3


@pytest.mark.parametrize("fields,needle", [
    ({"instructions": "whisper"}, "omit instructions"),
    ({"extra_params": {"temperature": 9}}, "temperature"),
    ({"ref_audio": REF["ref_audio"]}, "needs ref_text"),
    ({"ref_text": "only words"}, "send ref_audio with it"),
    ({"input": "Hello <|im_end|> there"}, "control token"),
    ({"voice": "nobody"}, "no preset voices"),
])
def test_what_the_model_cannot_do_is_a_400_that_says_so(http, fields, needle):
    r = speak(http, **fields)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert http.get("/health").status_code == 200


def test_the_reported_request_that_ended_on_a_chunk_boundary_gets_audio(http):
    """The request of the bug report, on this suite's tiny checkpoint (write_random_checkpoint's
    default seed): its talker stopped exactly at a chunk boundary, and the codec answered
    the empty final chunk with a 500. The forced, seed-independent case is in
    test_fish_s2_pro_stages.py."""
    r = http.post("/v1/audio/speech", json={"model": "fish_s2_pro", "input": "Hello, how are you?",
                                            "max_new_tokens": 60, "seed": 6, "response_format": "wav"})
    assert r.status_code == 200, r.text
    audio, rate = decode(r.content)
    assert rate == 44100 and audio.size > 0
