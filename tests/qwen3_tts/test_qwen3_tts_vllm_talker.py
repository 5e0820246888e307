"""The Qwen3-TTS talker on vLLM (tritontts.families.qwen3_tts.vllm_model with tritontts.engine.vllm_frames)
against our PyTorch talker (itself equal to the reference, test_qwen3_tts_talker.py) on the
same tiny random checkpoint, fp32, greedy at both levels: every frame of several requests
generated together (continuous batching, staggered lengths) equals the one-request loop."""
from __future__ import annotations

import gc

import pytest
import torch

from tritontts.families.qwen3_tts.checkpoint import open_checkpoint
from tritontts.families.qwen3_tts.prompt import TextTokenizer, custom_voice_prompt
from tritontts.families.qwen3_tts.random_checkpoint import write_random_checkpoint
from tritontts.families.qwen3_tts.talker import CONTROL_TAIL, REPETITION_PENALTY, load_talker
from tritontts.testing.engine import close_engine, frames_engine, run_releasing_one

REQUESTS = [("Hello there, how are you today?", "vivian"), ("One more.", "ryan"),
            ("A third request with somewhat longer text than the others.", "eric")]
MAX_FRAMES = 10


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tritontts.families.qwen3_tts.vllm_model import prepare_vllm_talker, register

    root = write_random_checkpoint(tmp_path_factory.mktemp("qwen3-tts"), kind="custom_voice")
    checkpoint = open_checkpoint(root)
    register()
    llm = frames_engine(prepare_vllm_talker(checkpoint, tmp_path_factory.mktemp("cache")), 256 * 2**20)
    yield checkpoint, llm
    close_engine(llm)
    del llm
    gc.collect()


def prompts(checkpoint):
    talker = load_talker(checkpoint)
    tokenizer = TextTokenizer(checkpoint)
    return talker, [custom_voice_prompt(talker, tokenizer.assistant_ids(text), speaker)
                    for text, speaker in REQUESTS]


def vllm_frames(checkpoint, llm, built, max_frames: int, tag: str):
    from vllm import SamplingParams, TokensPrompt

    from tritontts.engine.vllm_frames import FRAMES_ARG, FrameStream, register, release

    t = checkpoint.config.talker
    allowed = [i for i in range(t.vocab_size - CONTROL_TAIL)] + [t.codec_eos_token_id]
    inputs, params, keys = [], [], []
    pad_embed = None
    for k, prompt in enumerate(built):
        key = f"{tag}-{k}"
        if pad_embed is None:
            talker = load_talker(checkpoint)
            pad_embed = talker.tts_embeds()[2].detach()
        register(key, FrameStream(prompt.embeds.detach(), prompt.trailing_text.detach(), pad_embed,
                                  torch.Generator().manual_seed(k), {"do_sample": False}))
        # Placeholder ids the model never embeds (it takes the registered embeddings); the
        # codec pad id is outside what codebook 0 may sample, so the penalty never meets it.
        inputs.append(TokensPrompt(prompt_token_ids=[t.codec_pad_id] * prompt.embeds.shape[0]))
        params.append(SamplingParams(temperature=0.0, repetition_penalty=REPETITION_PENALTY,
                                     max_tokens=max_frames + 1, min_tokens=2,
                                     stop_token_ids=[t.codec_eos_token_id], allowed_token_ids=allowed,
                                     detokenize=False, extra_args={FRAMES_ARG: key}))
        keys.append(key)
    outputs = llm.generate(inputs, params, use_tqdm=False)
    frames = [torch.stack(release(key).frames) for key in keys]
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return frames, tokens


def test_vllm_talker_frames_equal_the_pytorch_talker_for_batched_requests(engine):
    checkpoint, llm = engine
    talker, built = prompts(checkpoint)
    expected = [talker.generate_greedy(p.embeds, p.trailing_text, MAX_FRAMES) for p in built]
    frames, tokens = vllm_frames(checkpoint, llm, built, MAX_FRAMES, "batch")
    for k, (want, got, ids) in enumerate(zip(expected, frames, tokens)):
        print(f"request {k}: {got.shape[0]} frames from vLLM, {want.shape[0]} expected; codebook 0 "
              f"{ids[:got.shape[0]]}")
        assert got.shape == want.shape and torch.equal(got, want), (k, got, want)
        assert ids[:got.shape[0]] == want[:, 0].tolist()


def test_control_a_different_speaker_changes_the_frames(engine):
    checkpoint, llm = engine
    talker, built = prompts(checkpoint)
    tokenizer = TextTokenizer(checkpoint)
    other = custom_voice_prompt(talker, tokenizer.assistant_ids(REQUESTS[0][0]), "ryan")
    frames, _ = vllm_frames(checkpoint, llm, [built[0], other], MAX_FRAMES, "control")
    assert not torch.equal(frames[0][:2], frames[1][:2])


def test_a_stream_released_while_its_row_is_still_scheduled_does_not_fail_the_others(engine):
    """A client that leaves: its stage releases the FrameStream as soon as it sends the abort,
    and the engine may run another step with that row. The step must go on for the other
    rows (a KeyError there failed every request in the step: the contract suite's rare 500
    for the request after a disconnect)."""
    from vllm import SamplingParams, TokensPrompt

    from tritontts.engine.vllm_frames import FRAMES_ARG, FrameStream, register, release

    checkpoint, llm = engine
    talker, built = prompts(checkpoint)
    (alone,), _ = vllm_frames(checkpoint, llm, built[2:], MAX_FRAMES, "alone")
    t = checkpoint.config.talker
    allowed = [i for i in range(t.vocab_size - CONTROL_TAIL)] + [t.codec_eos_token_id]
    pad_embed = talker.tts_embeds()[2].detach()
    core = llm.llm_engine
    for key, prompt in (("gone", built[0]), ("stays", built[2])):
        register(key, FrameStream(prompt.embeds.detach(), prompt.trailing_text.detach(), pad_embed,
                                  torch.Generator().manual_seed(0), {"do_sample": False}))
        core.add_request(key, TokensPrompt(prompt_token_ids=[t.codec_pad_id] * prompt.embeds.shape[0]),
                         SamplingParams(temperature=0.0, repetition_penalty=REPETITION_PENALTY,
                                        max_tokens=MAX_FRAMES + 1, min_tokens=2,
                                        stop_token_ids=[t.codec_eos_token_id], allowed_token_ids=allowed,
                                        detokenize=False, extra_args={FRAMES_ARG: key}))
    run_releasing_one(core, "gone", "stays", release)
    assert torch.equal(torch.stack(release("stays").frames), alone)
