"""The higgs-audio v2 talker on vLLM (tritontts.families.higgs_audio_v2.vllm_model: DualFFN layers,
summed codebook embeddings, the 8 codebooks sampled inside each step under the delay
pattern) against transformers' own HiggsAudioV2ForConditionalGeneration.generate on the same
tiny random checkpoint, fp32: every step of several requests generated together
(continuous batching, a cloning prompt among them) is equal, greedy and sampled with the
same seed (repetition-aware resampling on); a stream that samples the end stops as the
reference stops, and its frames are the reference decoder's. Negative controls: another
seed, and the reference with its audio MLP perturbed."""
from __future__ import annotations

import gc
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tritontts.families.higgs_audio_v2.checkpoint import AUDIO_HEAD, WEIGHTS_FILE, open_checkpoint
from tritontts.families.higgs_audio_v2.prompt import TextTokenizer, build_prompt, reference_steps
from tritontts.families.higgs_audio_v2.talker import (
    AudioCodeSampler, AudioSampling, audio_frames, frame_codes)
from tritontts.testing.engine import close_engine, frames_engine, run_releasing_one

TEXTS = ["Hello there, how are you today?", "One more.", "The birch canoe slid on the smooth planks."]
REF_TEXT = "This is the reference voice."
GREEDY = AudioSampling(do_sample=False, ras_win_len=None)
SAMPLED = AudioSampling()          # the serving defaults: T 1.0, top-k 50, top-p 0.95, RAS 7/2
STEPS = 30


@pytest.fixture(scope="module")
def reference(checkpoint):
    from transformers import HiggsAudioV2ForConditionalGeneration

    return HiggsAudioV2ForConditionalGeneration.from_pretrained(str(checkpoint.root)).eval()


@pytest.fixture(scope="module")
def ref_steps(checkpoint):
    codes = np.random.default_rng(0).integers(0, 1024, (12, 8))
    return reference_steps(codes, 1024, 1025)


def prompts(checkpoint, ref_steps):
    """(ids, reference steps or None) for each request; the second one clones."""
    tok = TextTokenizer(checkpoint)
    out = []
    for k, text in enumerate(TEXTS):
        if k == 1:
            out.append((build_prompt(tok, text, 8, REF_TEXT, ref_steps.shape[0]), ref_steps))
        else:
            out.append((build_prompt(tok, text, 8), None))
    return out


def reference_generate(model, ids, ref, sampling: AudioSampling, seed: int, steps: int) -> torch.Tensor:
    """transformers' generate: the generated steps [n, 8]."""
    model.generation_config.ras_win_len = sampling.ras_win_len
    model.generation_config.ras_win_max_num_repeat = sampling.ras_win_max_num_repeat
    ids = torch.tensor([ids])
    extra = {}
    if ref is not None:
        extra = dict(audio_input_ids=torch.from_numpy(ref)[None].long(),
                     audio_input_ids_mask=torch.ones(1, ref.shape[0], dtype=torch.bool))
    knobs = (dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
             if sampling.do_sample else dict(do_sample=False))
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
                             **knobs, **extra)
    return out[0][0 if ref is None else ref.shape[0]:]


def make_engine(checkpoint, cache):
    from tritontts.families.higgs_audio_v2.vllm_model import prepare_vllm_talker, register

    register()
    return frames_engine(prepare_vllm_talker(checkpoint, cache), 128 * 2**20)


@pytest.fixture(scope="module")
def engine(checkpoint, tmp_path_factory):
    llm = make_engine(checkpoint, tmp_path_factory.mktemp("talker-cache"))
    yield llm
    close_engine(llm)
    del llm
    gc.collect()


def vllm_generate(llm, checkpoint, requests, sampling: AudioSampling, seeds, steps: int, tag: str):
    """Our talker on vLLM, all requests submitted together: (steps [n, 8], tokens) each."""
    from vllm import SamplingParams, TokensPrompt

    from tritontts.families.higgs_audio_v2.vllm_model import AudioStream
    from tritontts.engine.vllm_frames import FRAMES_ARG, register, release

    cfg = checkpoint.config
    inputs, params, keys = [], [], []
    for k, ((ids, ref), seed) in enumerate(zip(requests, seeds)):
        key = f"{tag}-{k}"
        ref_t = torch.from_numpy(ref).long() if ref is not None else torch.zeros((0, 8), dtype=torch.int64)
        register(key, AudioStream(torch.tensor(ids), ref_t, AudioCodeSampler(
            cfg, sampling, torch.Generator().manual_seed(seed), ref_t.clone())))
        inputs.append(TokensPrompt(prompt_token_ids=ids))
        params.append(SamplingParams(temperature=0.0, max_tokens=steps, stop_token_ids=[cfg.eos_token_id],
                                     detokenize=False, extra_args={FRAMES_ARG: key}))
        keys.append(key)
    outputs = llm.generate(inputs, params, use_tqdm=False)
    return [(torch.stack(release(key).steps), list(o.outputs[0].token_ids)) for key, o in zip(keys, outputs)]


def test_greedy_steps_equal_transformers_generate_for_batched_requests(engine, checkpoint, reference, ref_steps):
    requests = prompts(checkpoint, ref_steps)
    got = vllm_generate(engine, checkpoint, requests, GREEDY, [0, 1, 2], STEPS, "greedy")
    for k, ((ids, ref), (steps, tokens)) in enumerate(zip(requests, got)):
        want = reference_generate(reference, ids, ref, GREEDY, 0, STEPS)
        print(f"request {k}: {steps.shape[0]} steps from vLLM, {want.shape[0]} from transformers")
        assert steps.shape == want.shape and torch.equal(steps, want), k
        assert steps[0].tolist() == [1024] * 8                       # the all-bos first step
        assert tokens[0] == checkpoint.config.audio_token_id and len(tokens) == steps.shape[0]


def test_sampled_steps_with_repetition_resampling_equal_transformers_with_the_same_seed(
        engine, checkpoint, reference, ref_steps):
    requests = prompts(checkpoint, ref_steps)
    seeds = [100, 101, 102]
    got = vllm_generate(engine, checkpoint, requests, SAMPLED, seeds, STEPS, "sampled")
    for k, ((ids, ref), seed, (steps, _)) in enumerate(zip(requests, seeds, got)):
        want = reference_generate(reference, ids, ref, SAMPLED, seed, STEPS)
        differing = int((steps != want).any(dim=1).sum()) if steps.shape == want.shape else -1
        print(f"request {k}: {differing} of {want.shape[0]} steps differ")
        assert differing == 0, k
    # The sampled steps are not the greedy ones (sampling really happened).
    greedy = vllm_generate(engine, checkpoint, requests[:1], GREEDY, [0], STEPS, "greedy-ctl")[0][0]
    assert not torch.equal(got[0][0], greedy)


def test_control_another_seed_changes_the_sampled_steps(engine, checkpoint, ref_steps):
    requests = prompts(checkpoint, ref_steps)[:1] * 2
    (a, _), (b, _) = vllm_generate(engine, checkpoint, requests, SAMPLED, [5, 6], STEPS, "seeds")
    assert not torch.equal(a, b)


def test_control_the_reference_with_a_perturbed_audio_mlp_no_longer_matches(engine, checkpoint, reference, ref_steps):
    requests = prompts(checkpoint, ref_steps)[:1]
    (steps, _), = vllm_generate(engine, checkpoint, requests, GREEDY, [0], STEPS, "perturbed")
    weight = reference.model.layers[0].audio_mlp.down_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.5)
        want = reference_generate(reference, *requests[0], GREEDY, 0, STEPS)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert not torch.equal(steps, want)


def test_a_stream_released_while_its_row_is_still_scheduled_does_not_fail_the_others(engine, checkpoint, ref_steps):
    """A client that leaves: its stage releases the stream as soon as it sends the abort, and
    the engine may run another step with that row. The step must go on for the other rows
    (a KeyError there once failed every request in the step: a 500 for the next client)."""
    from vllm import SamplingParams, TokensPrompt

    from tritontts.families.higgs_audio_v2.vllm_model import AudioStream
    from tritontts.engine.vllm_frames import FRAMES_ARG, register, release

    cfg = checkpoint.config
    requests = prompts(checkpoint, ref_steps)
    (alone, _), = vllm_generate(engine, checkpoint, requests[2:], GREEDY, [0], 12, "alone")
    core = engine.llm_engine
    empty = torch.zeros((0, 8), dtype=torch.int64)
    for key, (ids, _) in (("gone", requests[0]), ("stays", requests[2])):
        register(key, AudioStream(torch.tensor(ids), empty, AudioCodeSampler(cfg, GREEDY, torch.Generator())))
        core.add_request(key, TokensPrompt(prompt_token_ids=ids), SamplingParams(
            temperature=0.0, max_tokens=12, stop_token_ids=[cfg.eos_token_id], detokenize=False,
            extra_args={FRAMES_ARG: key}))
    run_releasing_one(core, "gone", "stays", release)
    assert torch.equal(torch.stack(release("stays").steps), alone)


@pytest.fixture(scope="module")
def ending_checkpoint(checkpoint, reference, ref_steps, tmp_path_factory):
    """The checkpoint with codebook 0's stream-eos head row set to 1.5x the row that wins
    step 12 greedily: the eos then wins there (or earlier), so the stream ends."""
    ids, ref = prompts(checkpoint, ref_steps)[0]
    winner = int(reference_generate(reference, ids, ref, GREEDY, 0, 13)[12, 0])
    root = tmp_path_factory.mktemp("higgs-ending") / "ckpt"
    shutil.copytree(checkpoint.root, root)
    state = load_file(str(root / WEIGHTS_FILE))
    state[AUDIO_HEAD][1025] = 1.5 * state[AUDIO_HEAD][winner]
    save_file(state, str(root / WEIGHTS_FILE))
    return open_checkpoint(root)


def test_a_stream_that_samples_the_end_stops_as_transformers_does_and_decodes_its_frames(
        ending_checkpoint, tmp_path_factory):
    from transformers import HiggsAudioV2ForConditionalGeneration, HiggsAudioV2Processor

    cfg = ending_checkpoint.config
    requests = [(build_prompt(TextTokenizer(ending_checkpoint), TEXTS[0], 8), None)]
    llm = make_engine(ending_checkpoint, tmp_path_factory.mktemp("ending-cache"))
    try:
        (steps, tokens), = vllm_generate(llm, ending_checkpoint, requests, GREEDY, [0], 100, "end")
    finally:
        close_engine(llm)
        del llm
        gc.collect()
    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(str(ending_checkpoint.root)).eval()
    want = reference_generate(model, *requests[0], GREEDY, 0, 100)
    print(f"stopped after {steps.shape[0]} steps; tokens end {tokens[-10:]}")
    assert torch.equal(steps, want)
    assert steps.shape[0] < 100 and tokens[-1] == cfg.eos_token_id
    first_end = int((steps == 1025).any(dim=1).nonzero()[0])
    assert steps.shape[0] == first_end + 9          # every codebook ends, K steps after the first
    assert tokens[first_end:-1] == [cfg.audio_delay_token_id] * 8
    # The frames: the reference processor's own delay undoing and clipping.
    frames = audio_frames(steps, cfg, finished=True)
    expected = HiggsAudioV2Processor.revert_delay_pattern(None, steps[1:-1]).clip(0, 1023)
    assert frames == expected.shape[0] and torch.equal(frame_codes(steps, cfg, 0, frames), expected)

