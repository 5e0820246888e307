"""Gepard's talker on vLLM (tritontts.families.gepard.vllm_model: vLLM's Qwen3.5 layers with our fp32
gated-delta core, the heads drawing each frame in compute_logits) against the references on
the same tiny checkpoint, fp32: transformers' Qwen3_5ForCausalLM (its own cache and torch
Gated-DeltaNet) with vLLM-Omni 0.30's Gepard heads (tritontts.families.gepard.upstream)."""
from __future__ import annotations

import gc

import pytest
import torch

from tritontts.families.gepard.checkpoint import open_checkpoint
from tritontts.families.gepard.prompt import GepardPromptBuilder
from tritontts.families.gepard.random_checkpoint import write_random_checkpoint
from tritontts.testing.engine import close_engine, frames_engine
from tritontts.families.gepard.upstream import gepard_upstream_frames, gepard_upstream_talker

MAX_FRAMES = 16
TEXTS = ("Hello there, how are you today?", "One more.",
         "A third request with longer text, to differ in length from the others.")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tritontts.families.gepard.vllm_model import (
        GepardTalkerForVllm, prepare_vllm_talker, register)

    from safetensors.torch import load_file, save_file

    root = write_random_checkpoint(tmp_path_factory.mktemp("gepard") / "tiny", seed=2)
    # A stop head nearer its threshold: some requests end by it within the test's frames.
    weights = load_file(str(root / "model.safetensors"))
    weights["stop_head.bias"] = torch.full((1,), -0.3)
    save_file(weights, str(root / "model.safetensors"), metadata={"format": "pt"})
    checkpoint = open_checkpoint(root)
    register()
    # Record the hidden states every frame is drawn from (row -> the stream's prompt length).
    seen: list[tuple[int, int, torch.Tensor]] = []
    original = GepardTalkerForVllm.make_frames

    def recording(self, hidden, streams):
        for row, stream in enumerate(streams):
            seen.append((id(stream), len(stream.frames), hidden[row].clone()))
        return original(self, hidden, streams)

    GepardTalkerForVllm.make_frames = recording
    llm = frames_engine(prepare_vllm_talker(checkpoint, tmp_path_factory.mktemp("cache")), 64 * 2**20)
    yield checkpoint, llm, seen
    GepardTalkerForVllm.make_frames = original
    close_engine(llm)
    del llm
    gc.collect()


def run_vllm(checkpoint, llm, prompts, seeds, max_frames=MAX_FRAMES):
    from vllm import SamplingParams, TokensPrompt

    from tritontts.families.gepard.vllm_model import STOP, GepardStream
    from tritontts.engine.vllm_frames import FRAMES_ARG, register, release

    streams, params = [], []
    for k, (ids, seed) in enumerate(zip(prompts, seeds)):
        stream = GepardStream(torch.tensor(ids), torch.Generator().manual_seed(seed))
        register(f"gepard-{k}", stream)
        streams.append(stream)
        params.append(SamplingParams(temperature=0.0, max_tokens=max_frames + 1,
                                     stop_token_ids=[checkpoint.config.end_of_speech], detokenize=False,
                                     extra_args={FRAMES_ARG: f"gepard-{k}"}))
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    frames = []
    for k, stream in enumerate(streams):
        release(f"gepard-{k}")
        audio = [f for f in stream.frames if not int(f[STOP])][:max_frames]
        frames.append(torch.stack(audio)[:, :STOP])
    return frames, streams, outputs


def test_vllm_frames_equal_the_reference_loop_for_batched_requests_stopped_either_way_and_another_seed_differs(engine):
    checkpoint, llm, _ = engine
    build = GepardPromptBuilder(checkpoint.root, checkpoint.config)
    prompts, seeds = [build(t) for t in TEXTS], [1, 2, 3]
    got, _, outputs = run_vllm(checkpoint, llm, prompts, seeds)
    backbone, omni = gepard_upstream_talker(checkpoint)
    for k, (ids, seed) in enumerate(zip(prompts, seeds)):
        want = gepard_upstream_frames(backbone, omni, checkpoint.config, ids, seed, MAX_FRAMES)
        print(f"request {k}: {got[k].shape[0]} frames from vLLM, {want.shape[0]} from the reference; "
              f"tokens {list(outputs[k].outputs[0].token_ids)}")
        assert got[k].shape == want.shape and torch.equal(got[k], want)
    # Both ends happen: a request stopped by its stop head, another by its frame budget.
    assert {g.shape[0] < MAX_FRAMES for g in got} == {True, False}
    other = gepard_upstream_frames(backbone, omni, checkpoint.config, prompts[0], 99, MAX_FRAMES)
    n = min(other.shape[0], got[0].shape[0])
    assert not torch.equal(other[:n], got[0][:n])


def teacher_forced_hidden(backbone, omni, c, ids, stream, positions: int) -> torch.Tensor:
    """transformers' last hidden states over the prompt and the stream's frames, at the
    positions its first `positions` frames were drawn from."""
    from tritontts.families.gepard.vllm_model import STOP

    t = torch.tensor(ids)
    embeds = backbone.model.embed_tokens(t)
    slot = (t >= c.speaker_base) & (t < c.speaker_base + c.speaker_slots)
    embeds[slot] = omni.null_prefix[t[slot] - c.speaker_base]
    codes = torch.stack([f[:STOP] for f in stream.frames])[:positions - 1]
    steps = omni._audio_frame_embed(codes[:, 0], codes[:, 1:])
    with torch.no_grad():
        return backbone.model(inputs_embeds=torch.cat([embeds, steps])[None]).last_hidden_state[0][len(ids) - 1:]


def test_vllm_backbone_hidden_states_match_transformers_within_1e4_and_a_perturbed_weight_does_not(engine):
    """Teacher-forced: transformers' backbone over the prompt and the frames vLLM made gives,
    at every position a frame was drawn from, the hidden state vLLM drew it from."""
    checkpoint, llm, seen = engine
    c = checkpoint.config
    ids = GepardPromptBuilder(checkpoint.root, c)(TEXTS[2])
    seen.clear()
    frames, streams, _ = run_vllm(checkpoint, llm, [ids], [5], max_frames=10)
    ours = torch.stack([h for key, _, h in seen if key == id(streams[0])])
    backbone, omni = gepard_upstream_talker(checkpoint)

    diff = (teacher_forced_hidden(backbone, omni, c, ids, streams[0], ours.shape[0]) - ours).abs().max().item()
    with torch.no_grad():
        backbone.model.layers[0].linear_attn.A_log.add_(0.5)
    perturbed = (teacher_forced_hidden(backbone, omni, c, ids, streams[0], ours.shape[0]) - ours).abs().max().item()
    print(f"{ours.shape[0]} positions: max-abs-diff {diff:.2e} (a perturbed GDN decay: {perturbed:.2e})")
    assert diff <= 1e-4 < perturbed


def test_a_prompt_prefilled_in_chunks_gives_the_frames_of_one_prefill(tmp_path_factory):
    """vLLM splits a long prompt over steps (max_num_batched_tokens): the Gated-DeltaNet's
    conv history and recurrent state carry from chunk to chunk through the hybrid cache."""
    from tritontts.families.gepard.vllm_model import prepare_vllm_talker, register

    checkpoint = open_checkpoint(write_random_checkpoint(tmp_path_factory.mktemp("gepard") / "chunked", seed=6))
    register()
    ids = GepardPromptBuilder(checkpoint.root, checkpoint.config)(TEXTS[2] + " " + TEXTS[0])
    llm = frames_engine(prepare_vllm_talker(checkpoint, tmp_path_factory.mktemp("cache")), 64 * 2**20,
                        max_num_batched_tokens=16, max_num_seqs=2)
    try:
        got, _, _ = run_vllm(checkpoint, llm, [ids], [4], max_frames=8)
    finally:
        close_engine(llm)
        del llm
        gc.collect()
    backbone, omni = gepard_upstream_talker(checkpoint)
    want = gepard_upstream_frames(backbone, omni, checkpoint.config, ids, 4, 8)
    print(f"{len(ids)}-id prompt in chunks of 16: {got[0].shape[0]} frames, equal: {torch.equal(got[0], want)}")
    assert len(ids) > 3 * 16 and torch.equal(got[0], want)


def test_a_bfloat16_engine_runs_vllms_own_gated_delta_kernels_within_bf16_rounding(tmp_path_factory):
    """In bfloat16 the Gated-DeltaNet layers run vLLM's CPU kernels (AMX / AVX-512), not our
    fp32 core: the hidden states stay within bf16 rounding of transformers' fp32 ones."""
    from tritontts.families.gepard.vllm_model import (
        GepardTalkerForVllm, prepare_vllm_talker, register)

    checkpoint = open_checkpoint(write_random_checkpoint(tmp_path_factory.mktemp("gepard") / "bf16", seed=7))
    c = checkpoint.config
    register()
    seen: list[torch.Tensor] = []
    original = GepardTalkerForVllm.make_frames

    def recording(self, hidden, streams):
        seen.append(hidden[0].float().clone())
        return original(self, hidden, streams)

    ids = GepardPromptBuilder(checkpoint.root, c)(TEXTS[0])
    GepardTalkerForVllm.make_frames = recording
    llm = frames_engine(prepare_vllm_talker(checkpoint, tmp_path_factory.mktemp("cache")), 64 * 2**20,
                        dtype="bfloat16")
    try:
        _, streams, _ = run_vllm(checkpoint, llm, [ids], [3], max_frames=6)
    finally:
        GepardTalkerForVllm.make_frames = original
        close_engine(llm)
        del llm
        gc.collect()
    backbone, omni = gepard_upstream_talker(checkpoint)
    ours = torch.stack(seen)
    want = teacher_forced_hidden(backbone, omni, c, ids, streams[0], ours.shape[0])
    relative = ((want - ours).abs().max() / want.abs().max()).item()
    print(f"bf16 engine vs fp32 transformers: {relative:.1%} of the largest hidden value")
    assert 0 < relative < 0.05
