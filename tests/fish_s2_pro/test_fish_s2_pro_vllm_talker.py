"""The Fish Speech S2 Pro talker on vLLM (tritontts.families.fish_s2_pro.vllm_model: vLLM's Qwen3 on the
split, reordered weights; the main-token draw and the fast AR in compute_logits) against our
PyTorch dual AR on the same tiny checkpoint, fp32: the frames of three requests generated
together (plain text and a cloned voice's prompt, other seeds and temperatures) equal each
request generated alone, frame for frame."""
from __future__ import annotations

import gc

import pytest
import torch

from tritontts.families.fish_s2_pro.checkpoint import open_checkpoint
from tritontts.families.fish_s2_pro.dual_ar import FishDualAR, FishSampling, FrameSampler
from tritontts.families.fish_s2_pro.prompt import FishPromptBuilder, Reference
from tritontts.families.fish_s2_pro.random_checkpoint import write_random_checkpoint
from tritontts.testing.engine import close_engine, frames_engine

MAX_FRAMES = 12


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tritontts.families.fish_s2_pro.vllm_model import prepare_vllm_talker, register

    checkpoint = open_checkpoint(write_random_checkpoint(tmp_path_factory.mktemp("fish") / "tiny", seed=4))
    register()
    llm = frames_engine(prepare_vllm_talker(checkpoint, tmp_path_factory.mktemp("cache")), 64 * 2**20)
    yield checkpoint, llm
    close_engine(llm)
    del llm
    gc.collect()


def requests(checkpoint):
    c = checkpoint.config
    build = FishPromptBuilder(checkpoint.root, c)
    codes = torch.randint(0, c.codebook_size, (c.num_codebooks, 5), generator=torch.Generator().manual_seed(9))
    return [(build("Hello there, how are you today?"), 1, FishSampling()),
            (build("One more.", Reference("Glue the sheet to the dark blue background.", codes)), 2,
             FishSampling(temperature=0.7, top_p=0.9)),
            (build("A third request with longer text, to differ in length."), 3, FishSampling(temperature=1.0))]


def test_vllm_frames_equal_the_pytorch_talker_for_batched_requests(engine):
    from safetensors.torch import load_file
    from vllm import SamplingParams, TokensPrompt

    from tritontts.families.fish_s2_pro.vllm_model import FishStream
    from tritontts.engine.vllm_frames import FRAMES_ARG, register, release

    checkpoint, llm = engine
    c = checkpoint.config
    talker = FishDualAR(c)
    talker.load_state_dict(load_file(str(checkpoint.weight_files[0])), strict=True)
    talker.eval()
    expected, inputs, params, keys = [], [], [], []
    for k, (prompt, seed, sampling) in enumerate(requests(checkpoint)):
        expected.append(talker.generate(prompt[0], prompt[1:].T,
                                        FrameSampler(torch.Generator().manual_seed(seed), sampling), MAX_FRAMES))
        key = f"req-{k}"
        register(key, FishStream(prompt, FrameSampler(torch.Generator().manual_seed(seed), sampling)))
        inputs.append(TokensPrompt(prompt_token_ids=prompt[0].tolist()))
        params.append(SamplingParams(temperature=0.0, max_tokens=MAX_FRAMES, stop_token_ids=[c.im_end_id],
                                     detokenize=False, extra_args={FRAMES_ARG: key}))
        keys.append(key)
    outputs = llm.generate(inputs, params, use_tqdm=False)
    for k, (want, output, key) in enumerate(zip(expected, outputs, keys)):
        frames = release(key).frames
        got = torch.stack([f for f in frames if int(f[0]) != c.im_end_id]) if frames else torch.zeros(0, 11)
        print(f"request {k}: {got.shape[0]} frames from vLLM, {want.shape[0]} expected; "
              f"main tokens {list(output.outputs[0].token_ids)}")
        assert got.shape == want.shape and torch.equal(got, want)
        assert list(output.outputs[0].token_ids)[:got.shape[0]] == got[:, 0].tolist()
