"""AuK's stages in this process (no Triton): the schedule a request gets (AuK-Flash's distilled
grid, locked; the base recipe and its knobs), what the prompt stage makes of a clip, and the
DiT stage running a Triton batch of requests with different schedules and lengths."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf

from tritontts.families.auk.checkpoint import FLASH_T_GRID, open_checkpoint
from tritontts.families.auk.random_checkpoint import write_random_checkpoint
from tritontts.families.auk.request import parse_auk_params
from tritontts.serving.stage import Inputs, StageContext
from tritontts.protocol import InvalidRequest


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("auk")
    return {variant: open_checkpoint(write_random_checkpoint(base / variant, seed=6, variant=variant))
            for variant in ("base", "flash")}


def prompt_stage(checkpoint):
    from tritontts.families.auk.stages import AuKPromptStage

    return AuKPromptStage(StageContext("auk_prompt", checkpoint.root), checkpoint)


def test_flash_runs_its_distilled_grid_and_refuses_sampling_knobs_naming_them(checkpoints):
    stage = prompt_stage(checkpoints["flash"])
    plan = stage.plan("", parse_auk_params({"instructions": "Rain.", "duration_seconds": 1.0}), 3)
    assert tuple(plan["t_grid"].tolist()) == pytest.approx(FLASH_T_GRID, abs=0) and plan["cfg"] == 0.0
    for knob in ({"num_inference_steps": 8}, {"guidance_scale": 2.0}, {"sway": -0.5}, {"t_grid": [0, 1]}):
        with pytest.raises(InvalidRequest, match=f"{next(iter(knob))}: AuK-Flash runs its distilled 4-step grid"):
            stage.plan("Hi.", parse_auk_params(knob), 3)


def test_base_runs_its_recipe_and_a_request_may_change_it(checkpoints):
    from tritontts.families.auk.dit import time_grid

    stage = prompt_stage(checkpoints["base"])
    plan = stage.plan("Hi.", parse_auk_params({}), 3)
    assert np.array_equal(plan["t_grid"], time_grid(32, -1.0).numpy()) and plan["cfg"] == 2.0
    plan = stage.plan("Hi.", parse_auk_params({"t_grid": [0, 0.3, 1], "guidance_scale": 0}), 3)
    assert plan["t_grid"].tolist() == pytest.approx([0, 0.3, 1]) and plan["cfg"] == 0.0
    plan = stage.plan("Hi.", parse_auk_params({"num_inference_steps": 5, "sway": 0.0}), 3)
    assert plan["t_grid"].tolist() == pytest.approx(np.linspace(0, 1, 6).tolist())


def test_a_clip_becomes_its_audio_places_and_its_latents_and_sets_an_edits_length(checkpoints):
    from tritontts.audio import resample
    from tritontts.families.auk.audio_tower import audio_token_count

    stage = prompt_stage(checkpoints["base"])
    t = np.arange(int(1.37 * 24000)) / 24000
    audio = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, audio, 24000, format="WAV", subtype="FLOAT")
    params = parse_auk_params({"instructions": "Make it sound like a radio.",
                               "ref_audio": base64.b64encode(buf.getvalue()).decode()})
    plan = stage.plan("", params, 3)
    tokens = audio_token_count(resample(audio, 24000, 16000).size)
    audio_id = stage.build.special["<|AUDIO|>"]
    start = int(plan["audio_start"])
    assert plan["audio_tokens"] == tokens and plan["audio_embeds"].shape == (tokens, 64)
    assert plan["ids"][start:start + tokens].tolist() == [audio_id] * tokens
    assert plan["ref_frames"] == audio.size // 480 == plan["frames"] == plan["ref_latents"].shape[0]
    # An edit keeps the clip's length; without a clip there is no audio place at all.
    plain = stage.plan("Hello.", parse_auk_params({}), 3)
    assert plain["audio_tokens"] == 0 and audio_id not in plain["ids"].tolist() and plain["ref_frames"] == 0


def test_the_dit_stage_runs_a_batch_of_mixed_schedules_each_as_alone(checkpoints):
    from tritontts.families.auk.stages import AuKDiTStage

    ckpt = checkpoints["base"]
    stage = AuKDiTStage(StageContext("auk_dit", ckpt.root), ckpt)
    rng = np.random.default_rng(0)

    def request(tokens, frames, grid, cfg, seed):
        return Inputs({"condition": rng.standard_normal((tokens, 64)).astype(np.float32),
                       "ref_latents": np.zeros((1, 64), np.float32), "ref_frames": np.array([0], np.int32),
                       "frames": np.array([frames], np.int32), "t_grid": np.array(grid, np.float32),
                       "cfg": np.array([cfg], np.float32), "seed": np.array([seed], np.int64)})

    batch = [request(20, 30, [0, 0.5, 1], 2.0, 1), request(33, 17, [0, 0.2, 0.6, 1], 2.0, 2),
             request(12, 25, [0, 0.5, 1], 2.0, 3), request(20, 30, [0, 0.5, 1], 0.0, 4)]
    together = stage.run_batch(batch)
    alone = [stage.run(inputs) for inputs in batch]
    diffs = [float(np.abs(t["latents"] - a["latents"]).max()) for t, a in zip(together, alone)]
    print(f"batched vs alone, per request: {diffs}")
    assert [t["latents"].shape for t in together] == [(30, 64), (17, 64), (25, 64), (30, 64)]
    assert max(diffs) < 1e-5
    assert float(np.abs(together[0]["latents"] - together[3]["latents"]).max()) > 1e-3   # cfg mattered


def test_a_dit_batch_whose_clients_all_left_stops_between_steps(checkpoints):
    from tritontts.families.auk.stages import AuKDiTStage

    ckpt = checkpoints["base"]
    stage = AuKDiTStage(StageContext("auk_dit", ckpt.root), ckpt)
    inputs = Inputs({"condition": np.ones((5, 64), np.float32), "ref_latents": np.zeros((1, 64), np.float32),
                     "ref_frames": np.array([0], np.int32), "frames": np.array([10], np.int32),
                     "t_grid": np.linspace(0, 1, 65, dtype=np.float32), "cfg": np.array([2.0], np.float32),
                     "seed": np.array([1], np.int64)})
    asked = []
    inputs.cancelled = lambda: asked.append(1) or len(asked) > 2      # gone after two steps
    (result,) = stage.run_batch([inputs])
    assert isinstance(result, InterruptedError) and len(asked) == 3
