"""VoxCPM2 through the real tritonserver and front on a tiny random checkpoint: a seeded
stream equals the pipeline run in this process (the prompt stage, our PyTorch talker with
the same per-request noise, one whole AudioVAE decode), in the chunk plan the talker
promises, zero-shot and cloned; an uploaded voice speaks as its recording does; cfg_value
and inference_timesteps change the speech and are checked; concurrent streams equal their
solo runs; 48 kHz survives every response format; the 400s of what the model cannot do."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tritontts.family import synthetic_reference
from tritontts.testing.audio import decode, rms
from tritontts.testing.grpc import stream_model
from tritontts.testing.speech import assert_concurrent_equal_solo, uploaded_voice

STACK_FAMILIES = ("voxcpm2",)
TEXT = "The birch canoe slid on the smooth planks."
REF = synthetic_reference()
SAMPLES_PER_PATCH = 4 * 1920


def speak(http, **body):
    return http.post("/v1/audio/speech", json={"model": "voxcpm2", "input": TEXT, "seed": 3,
                                               "max_new_tokens": 24, "response_format": "pcm", **body})


def in_process_audio(checkpoint_dir, text: str, params: dict) -> np.ndarray:
    """The pipeline in this process: the prompt stage's sequence, our PyTorch talker with the
    request's seed drawing each patch's noise (as the engine does), one whole VAE decode of
    the continuation context + the patches, the context's audio cut."""
    from tritontts.serving.stage import Inputs, StageContext
    from tritontts.families.voxcpm2.checkpoint import open_checkpoint
    from tritontts.families.voxcpm2.prompt import TalkerPrompt
    from tritontts.families.voxcpm2.stages import VoxCPM2PromptStage, load_vae
    from tritontts.families.voxcpm2.talker import load_talker

    ckpt = open_checkpoint(checkpoint_dir)
    c = ckpt.config
    stage = VoxCPM2PromptStage(StageContext("voxcpm2_prompt", checkpoint_dir), ckpt)
    out = stage.run(Inputs(text=np.array([text.encode()], object), voice=np.array([b""], object),
                           params=np.array([json.dumps(params).encode()], object)))
    audio_mask = torch.from_numpy(out["audio_mask"].astype(np.float32))
    feats = torch.from_numpy(out["feats"])
    context = feats[len(feats) - int(out["context_patches"]):]
    prompt = TalkerPrompt(torch.from_numpy(out["ids"]), audio_mask, feats, context)
    gen = torch.Generator().manual_seed(params["seed"])
    patches = load_talker(ckpt).generate(
        prompt, lambda: torch.randn(1, c.feat_dim, c.patch_size, generator=gen),
        steps=params.get("inference_timesteps", 10), cfg=params.get("cfg_value", 2.0),
        max_len=int(out["max_steps"]))
    latents = torch.cat([context, patches]).reshape(-1, c.feat_dim)
    audio = load_vae(ckpt).decode(latents.T[None])[0].numpy()
    return audio[context.shape[0] * SAMPLES_PER_PATCH:]


@pytest.mark.parametrize("fields", [{}, REF], ids=["zero_shot", "cloned"])
def test_a_seeded_stream_equals_the_pipeline_in_process(stack, random_checkpoints, fields):
    params = {"seed": 11, "max_new_tokens": 40, **fields}
    chunks, error = stream_model(stack.grpc_url, "voxcpm2", TEXT, params=params)
    assert error is None, error
    want = in_process_audio(random_checkpoints["voxcpm2"], TEXT, params)
    sizes = [c.as_numpy("audio").size // SAMPLES_PER_PATCH for c in chunks]
    got = np.concatenate([c.as_numpy("audio").reshape(-1) for c in chunks])
    diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
    print(f"{want.size // SAMPLES_PER_PATCH} patches in chunks of {sizes}; max-abs-diff {diff:.2e}")
    assert {int(c.as_numpy("sample_rate").reshape(-1)[0]) for c in chunks} == {48000}
    plan = [1, 2, 4, 8, 16, 16, 16]
    assert sizes[:-1] == plan[:len(sizes) - 1] and 0 < sizes[-1] <= plan[len(sizes) - 1]
    # Two implementations of the talker (vLLM's kernels vs PyTorch's, thread counts that
    # differ): latents agree to ~1e-5 and the decoder amplifies that about tenfold.
    assert diff < 1e-3 and rms(got) > 1e-3


def test_an_uploaded_voice_speaks_as_its_recording_does(http):
    direct = speak(http, **REF)
    assert direct.status_code == 200, direct.text
    with uploaded_voice(http, "Narrator", REF):
        by_name = speak(http, voice="narrator")
        assert by_name.status_code == 200, by_name.text
        assert by_name.content == direct.content
        reference_only = speak(http, voice="narrator", clone_mode="reference")
        assert reference_only.status_code == 200 and reference_only.content != direct.content


def test_cfg_and_steps_change_the_speech_and_are_deterministic(http):
    base = speak(http)
    again = speak(http)
    other_cfg = speak(http, extra_params={"cfg_value": 1.2})
    fewer_steps = speak(http, extra_params={"inference_timesteps": 4})
    for r in (base, again, other_cfg, fewer_steps):
        assert r.status_code == 200, r.text
    assert base.content == again.content
    assert other_cfg.content != base.content and fewer_steps.content != base.content


def test_concurrent_streams_equal_their_solo_runs(http):
    bodies = [{"seed": 21}, {"seed": 22, **REF}, {"seed": 23, "clone_mode": "reference", "ref_audio": REF["ref_audio"]}]
    assert_concurrent_equal_solo(lambda **b: speak(http, **b), bodies)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_48khz_audio_comes_through_every_format(http, fmt):
    r = speak(http, response_format=fmt)
    assert r.status_code == 200, r.text
    audio, rate = decode(r.content)
    assert rate == 48000 and audio.size / rate > 0.5 and rms(audio) > 1e-3


@pytest.mark.parametrize("fields,needle", [
    ({"instructions": "whisper"}, "no style instructions"),
    ({"extra_params": {"cfg_value": 50}}, "cfg_value"),
    ({"clone_mode": "continuation", "ref_audio": REF["ref_audio"]}, "needs ref_text"),
    ({"ref_text": "only words"}, "send ref_audio with it"),
])
def test_what_the_model_cannot_do_is_a_400_that_says_so(http, fields, needle):
    r = speak(http, **fields)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert http.get("/health").status_code == 200
