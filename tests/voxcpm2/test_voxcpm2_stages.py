"""The VoxCPM2 stages without Triton: the prompt stage's sequence for each clone_mode (and
from a stored voice, equal to the recording's), its 400s; the talker stage's chunk plan,
driven by a stand-in engine that publishes patches as the model does; and the AudioVAE
stage decoding those chunks (two streams batched together) back to exactly the whole
utterance, with no left context as the negative control."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from tritontts.family import synthetic_reference
from tritontts.protocol import IS_FINAL, InvalidRequest
from tritontts.serving.stage import Inputs, StageContext
from tritontts.families.voxcpm2.prompt import AUDIO_START, REF_AUDIO_END, REF_AUDIO_START

REF = synthetic_reference()


@pytest.fixture(scope="module")
def prompt_stage(checkpoint):
    from tritontts.families.voxcpm2.stages import VoxCPM2PromptStage

    return VoxCPM2PromptStage(StageContext("voxcpm2_prompt", checkpoint.root), checkpoint)


@pytest.fixture(scope="module")
def vae_stage(checkpoint):
    from tritontts.families.voxcpm2.stages import VoxCPM2AudioVAEStage

    return VoxCPM2AudioVAEStage(StageContext("voxcpm2_audio_vae", checkpoint.root), checkpoint)


def request(text="Hello there.", voice="", **params) -> Inputs:
    return Inputs(text=np.array([text.encode()], object), voice=np.array([voice.encode()], object),
                  params=np.array([json.dumps(params).encode()], object))


def test_zero_shot_sequence_is_text_then_audio_start(prompt_stage):
    out = prompt_stage.run(request(seed=1))
    assert out["ids"][-1] == AUDIO_START and not out["audio_mask"].any() and out["context_patches"] == 0
    assert out["feats"].shape[1:] == (4, 8) and not out["feats"].any()


@pytest.mark.parametrize("fields,mode", [({"ref_audio": REF["ref_audio"]}, "reference"),
                                         (REF, "both"),
                                         ({**REF, "clone_mode": "continuation"}, "continuation"),
                                         ({**REF, "clone_mode": "reference"}, "reference")])
def test_clone_modes_lay_out_the_reference_as_upstream(prompt_stage, fields, mode):
    out = prompt_stage.run(request(**fields))
    ids, audio = out["ids"], out["audio_mask"]
    patches = 3 * 16000 // (4 * 640) + 1                     # 3 s reference, padded to a patch
    assert (ids[0] == REF_AUDIO_START) == (mode in ("reference", "both"))
    assert audio.sum() == patches * (2 if mode == "both" else 1)
    assert audio[-1] == (mode in ("continuation", "both"))
    assert out["context_patches"] == (3 if mode != "reference" else 0)
    if mode != "continuation":
        assert ids[patches + 1] == REF_AUDIO_END


def test_a_stored_voice_gives_the_same_sequence_as_its_recording(prompt_stage):
    stored = prompt_stage.encode_voice(request(**REF))
    import base64

    features = base64.b64encode(stored).decode()
    for mode in ("reference", "continuation", "both"):
        direct = prompt_stage.run(request(seed=1, clone_mode=mode, **REF))
        from_voice = prompt_stage.run(request(seed=1, clone_mode=mode, voice_features=features))
        for name in ("ids", "audio_mask", "feats", "context_patches"):
            assert np.array_equal(direct[name], from_voice[name]), (mode, name)


@pytest.mark.parametrize("fields,needle", [
    ({"clone_mode": "continuation", "ref_audio": REF["ref_audio"]}, "needs ref_text"),
    ({"clone_mode": "both"}, "send ref_audio"),
    ({"clone_mode": "sideways", **REF}, "clone_mode must be one of"),
    ({"ref_text": "words"}, "send ref_audio with it"),
    ({"cfg_value": 9.0}, "cfg_value"),
    ({"inference_timesteps": 0}, "inference_timesteps"),
    ({"instructions": "whisper"}, "no style instructions"),
])
def test_bad_fields_are_400s_saying_what_to_fix(prompt_stage, fields, needle):
    with pytest.raises(InvalidRequest, match=needle):
        prompt_stage.run(request(**fields))


def test_unknown_voice_is_a_400(prompt_stage):
    with pytest.raises(InvalidRequest, match="no preset voices"):
        prompt_stage.run(request(voice="alice"))


class StandInEngine:
    """Publishes one patch per engine output on the request's stream, like the model."""

    def __init__(self, patches):
        self.patches = patches

    async def generate(self, prompt_ids, params, key, cancelled):
        from tritontts.engine.vllm_frames import lookup

        stream = lookup(key)
        for i, patch in enumerate(self.patches[:params.max_tokens]):
            stream.patches.append(patch)
            yield [0] * i + [1 if i == len(self.patches) - 1 else 0]


def talker_chunks(checkpoint, outputs, patches, left_context_frames=None):
    from tritontts.families.voxcpm2.stages import VoxCPM2TalkerStage

    stage = object.__new__(VoxCPM2TalkerStage)        # no engine: the stand-in replaces it
    stage.checkpoint, stage.max_model_len = checkpoint, 4096
    stage.chunk_patches, stage.first_chunk_patches, stage.chunk_growth = 16, 1, 2
    stage.left_context_frames = 20 if left_context_frames is None else left_context_frames
    stage.patch_size, stage.feat_dim = 4, 8
    stage.generate = StandInEngine(patches).generate
    inputs = Inputs({name: np.asarray(value) for name, value in outputs.items()})
    inputs["max_steps"] = np.array([len(patches)], np.int32)

    async def collect():
        return [chunk async for chunk in stage.run(inputs)]

    return asyncio.run(collect())


@pytest.mark.parametrize("mode", ["zero_shot", "both"])
def test_streamed_chunks_decode_to_exactly_the_whole_utterance(checkpoint, prompt_stage, vae_stage, mode):
    fields = {} if mode == "zero_shot" else REF
    outputs = [prompt_stage.run(request(seed=k, **fields)) for k in range(2)]
    gen = torch.Generator().manual_seed(0)
    streams = [list(torch.randn(n, 4, 8, generator=gen)) for n in (37, 21)]
    chunks = [talker_chunks(checkpoint, o, p) for o, p in zip(outputs, streams)]
    sizes = [[c["latents"].shape[0] - c["left_context"] for c in cs] for cs in chunks]
    print("new frames per chunk:", sizes)
    assert sizes[0] == [4, 8, 16, 32, 64, 24] and sizes[1] == [4, 8, 16, 32, 24]
    assert [c[IS_FINAL] for c in chunks[0]] == [False] * 5 + [True]
    # Both streams' chunks through the VAE stage, interleaved and batched.
    batch = [Inputs(latents=c["latents"], left_context=np.array([c["left_context"]], np.int32))
             for pair in zip(*chunks) for c in pair] + \
            [Inputs(latents=c["latents"], left_context=np.array([c["left_context"]], np.int32))
             for c in chunks[0][len(chunks[1]):]]
    results = vae_stage.run_batch(batch)
    assert not any(isinstance(r, Exception) for r in results)
    audio = [np.concatenate([r["audio"] for r in results[k::2][:len(chunks[1])]] +
                            ([r["audio"] for r in results[2 * len(chunks[1]):]] if k == 0 else []))
             for k in range(2)]
    for k, (out, patches) in enumerate(zip(outputs, streams)):
        context = torch.from_numpy(out["feats"][len(out["feats"]) - int(out["context_patches"]):])
        latents = torch.cat([context, torch.stack(patches)]).reshape(-1, 8)
        whole = vae_stage.vae.decode(latents.T[None])[0].numpy()[context.shape[0] * 4 * 1920:]
        diff = float(np.abs(audio[k] - whole).max())
        print(f"stream {k}: {audio[k].size} samples, streamed vs whole max-abs-diff {diff:.2e}")
        # Exact in float64 (test_voxcpm2_audio_vae.py); fp32 rounding differs by window length.
        assert audio[k].shape == whole.shape and diff < 2e-4
    # Negative control: without left context the chunk edges differ.
    bare = talker_chunks(checkpoint, outputs[1], streams[1], left_context_frames=0)
    cut = np.concatenate([r["audio"] for r in vae_stage.run_batch(
        [Inputs(latents=c["latents"], left_context=np.array([c["left_context"]], np.int32)) for c in bare])])
    assert float(np.abs(cut - audio[1]).max()) > 1e-3


def test_vae_stage_refuses_latents_of_the_wrong_width(vae_stage):
    (result,) = vae_stage.run_batch([Inputs(latents=np.zeros((5, 3), np.float32),
                                            left_context=np.array([0], np.int32))])
    assert isinstance(result, InvalidRequest) and "latents must be" in str(result)


def test_the_final_chunk_of_a_stream_with_no_patch_decodes_to_no_audio(vae_stage):
    """No patch at all, or a stop on a chunk boundary: the talker sends one zero latent frame,
    all context (VoxCPM2TalkerStage.chunk), and the VAE answers it with no samples."""
    dim = vae_stage.vae.config.latent_dim
    (result,) = vae_stage.run_batch([Inputs(latents=np.zeros((1, dim), np.float32), left_context=np.array([1]))])
    assert not isinstance(result, Exception) and result["audio"].size == 0
