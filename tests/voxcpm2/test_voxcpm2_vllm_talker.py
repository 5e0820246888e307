"""The VoxCPM2 talker on vLLM (tritontts.families.voxcpm2.vllm_model: both LMs' layers on paged
attention, the local DiT inside each step) against our PyTorch talker (itself equal to
voxcpm 2.0.3, test_voxcpm2_talker.py) on the same tiny random checkpoint, fp32, the same
per-request noise: the patches of several requests generated together (continuous batching,
different modes, lengths, cfg and step counts) equal the one-request loop, stop included."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from tritontts.testing.engine import close_engine, frames_engine, run_releasing_one
from tritontts.families.voxcpm2.audio_vae import AudioVAEConfig, load_audio_vae
from tritontts.families.voxcpm2.checkpoint import open_checkpoint
from tritontts.families.voxcpm2.prompt import TextTokenizer, build_prompt, encode_patches
from tritontts.families.voxcpm2.random_checkpoint import write_random_checkpoint
from tritontts.families.voxcpm2.talker import load_talker

MAX_STEPS = 24
# (text, mode, seed, flow steps, cfg)
REQUESTS = [("Hello there, how are you today?", "zero_shot", 1, 10, 2.0),
            ("One more.", "reference", 2, 10, 2.0),
            ("A third request with somewhat longer text.", "continuation", 3, 6, 1.5)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tritontts.families.voxcpm2.vllm_model import prepare_vllm_talker, register

    root = write_random_checkpoint(tmp_path_factory.mktemp("voxcpm2") / "tiny", seed=1)
    checkpoint = open_checkpoint(root)
    register()
    llm = frames_engine(prepare_vllm_talker(checkpoint, tmp_path_factory.mktemp("cache")), 128 * 2**20)
    yield checkpoint, llm
    close_engine(llm)
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def built(engine):
    checkpoint, _ = engine
    c = checkpoint.config
    vae = load_audio_vae(checkpoint.path("audiovae.safetensors"), AudioVAEConfig.from_dict(c.audio_vae))
    tokenizer = TextTokenizer(checkpoint.root)
    t = np.arange(8000) / 16000
    audio = torch.from_numpy((0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32))
    prompts = []
    for text, mode, *_ in REQUESTS:
        reference = encode_patches(vae, audio, c.patch_size, at_start=False) if mode == "reference" else None
        continuation = encode_patches(vae, audio, c.patch_size, at_start=True) if mode == "continuation" else None
        prompts.append(build_prompt(tokenizer(text), c.patch_size, c.feat_dim,
                                    reference=reference, continuation=continuation))
    return load_talker(checkpoint), prompts


def _stream(prompt, seed, steps, cfg):
    from tritontts.families.voxcpm2.vllm_model import PatchStream

    return PatchStream(prompt, torch.Generator().manual_seed(seed), steps, cfg)


def vllm_patches(llm, prompts, settings, tag):
    from vllm import TokensPrompt

    from tritontts.engine.vllm_frames import register, release
    from tritontts.families.voxcpm2.vllm_model import GO_ON, sampling_params

    inputs, params, keys = [], [], []
    for k, (prompt, (seed, steps, cfg)) in enumerate(zip(prompts, settings)):
        key = f"{tag}-{k}"
        register(key, _stream(prompt, seed, steps, cfg))
        inputs.append(TokensPrompt(prompt_token_ids=[GO_ON] * prompt.length))
        params.append(sampling_params(key, MAX_STEPS, min_len=2))
        keys.append(key)
    outputs = llm.generate(inputs, params, use_tqdm=False)
    return [torch.stack(release(key).patches) for key in keys], [list(o.outputs[0].token_ids) for o in outputs]


def test_vllm_patches_equal_the_pytorch_talker_for_batched_requests(engine, built):
    _, llm = engine
    talker, prompts = built
    settings = [(seed, steps, cfg) for _, _, seed, steps, cfg in REQUESTS]
    expected = []
    for prompt, (seed, steps, cfg) in zip(prompts, settings):
        gen = torch.Generator().manual_seed(seed)
        c = talker.config
        expected.append(talker.generate(prompt, lambda: torch.randn(1, c.feat_dim, c.patch_size, generator=gen),
                                        steps=steps, cfg=cfg, max_len=MAX_STEPS))
    got, tokens = vllm_patches(llm, prompts, settings, "batch")
    for k, (want, have, ids) in enumerate(zip(expected, got, tokens)):
        diff = (have - want).abs().max().item() if have.shape == want.shape else float("inf")
        print(f"request {k} ({REQUESTS[k][1]}): {have.shape[0]} patches from vLLM, {want.shape[0]} "
              f"expected, max-abs-diff {diff:.2e}; stop decisions {ids}")
        assert have.shape == want.shape and diff < 1e-4
        assert len(ids) == have.shape[0] and all(i == 0 for i in ids[:-1])


def test_control_another_seed_changes_the_patches(engine, built):
    _, llm = engine
    _, prompts = built
    got, _ = vllm_patches(llm, [prompts[0], prompts[0]], [(1, 10, 2.0), (9, 10, 2.0)], "control")
    assert (got[0][:2] - got[1][:2]).abs().max() > 1e-2


def test_a_stream_released_while_its_row_is_still_scheduled_does_not_fail_the_others(engine, built):
    from vllm import TokensPrompt

    from tritontts.engine.vllm_frames import register, release
    from tritontts.families.voxcpm2.vllm_model import GO_ON, sampling_params

    _, llm = engine
    _, prompts = built
    (alone,), _ = vllm_patches(llm, prompts[2:], [(3, 6, 1.5)], "alone")
    core = llm.llm_engine
    for key, prompt, setting in (("gone", prompts[0], (1, 10, 2.0)), ("stays", prompts[2], (3, 6, 1.5))):
        register(key, _stream(prompt, *setting))
        core.add_request(key, TokensPrompt(prompt_token_ids=[GO_ON] * prompt.length),
                         sampling_params(key, MAX_STEPS, min_len=2))
    run_releasing_one(core, "gone", "stays", release)
    stays = torch.stack(release("stays").patches)
    # Equal up to rounding: batched with another row, the matrix products block differently.
    assert stays.shape == alone.shape and (stays - alone).abs().max() < 1e-4
