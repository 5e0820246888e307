"""GLM-TTS flow (tritontts.families.glm_tts.flow) against vLLM-Omni 0.30's GLM-TTS DiT and its Euler
sampler (`GLMTTSDiTForGeneration._do_sample`), on the same random weights, fp32.

vLLM-Omni hard-codes the released sizes in its wrapper (a 100000 x 512 token table among
them), so the tiny reference DiT is built directly from `GLMTTSDiT`, and its sampler is
called as a plain function on a namespace holding that DiT. Its noise is a fresh
torch.randn per call; the test hands it ours (frame_noise), the one difference by design.
"""
from __future__ import annotations

import importlib
import types

import pytest
import torch

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.glm_tts.flow import (
    FlowCache, GLMTTSDiT, GLMTTSFlow, block_attention_mask, build_flow, flow_state_dict,
    frame_noise)
from tritontts.families.glm_tts.upstream import glm_tts_dit_stand_ins
from tritontts.upstream import vllm_omni_module

TINY = dict(dim=128, depth=2, heads=2, ff_mult=2, vocab=300, token_dim=32, conv_layers=2,
            cond_dim=80, speaker_adaln=True)
THEIR_TINY = dict(trans_dim=128, depth=2, heads=2, dim_head=64, ff_mult=2, dropout=0.0, mel_dim=80,
                  text_vocab_size=300, text_emb_dim=32, conv_layers=2, condition_dim=80,
                  spkr_emb_adaln=True, spkr_dim=192)
STAND_INS = glm_tts_dit_stand_ins()


@pytest.fixture(scope="module")
def reference():
    with vllm_omni_module("vllm_omni.model_executor.models.glm_tts.glm_tts_dit_wrapper",
                          STAND_INS) as wrapper:
        dit_module = importlib.import_module("vllm_omni.model_executor.models.glm_tts.glm_tts_dit")
        yield types.SimpleNamespace(wrapper=wrapper, dit=dit_module)


@pytest.fixture(scope="module")
def pair(reference):
    """Their tiny DiT with random weights, and ours loaded from its state dict."""
    torch.manual_seed(0)
    theirs = reference.dit.GLMTTSDiT(**THEIR_TINY).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(std=0.2)
    ours = GLMTTSDiT(**TINY).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return theirs, ours


def _inputs(frames: int, tokens: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, frames, 80, generator=gen), torch.randn(1, frames, 80, generator=gen),
            torch.randint(0, 300, (1, tokens), generator=gen), torch.randn(1, 192, generator=gen))


@pytest.mark.parametrize("pattern", [None, [2, 1, 2]], ids=["full", "block_causal"])
def test_dit_velocity_matches_vllm_omni(pair, pattern):
    theirs, ours = pair
    x, cond, tokens, speaker = _inputs(60, 30)
    t = torch.tensor([0.37])
    mask = block_attention_mask(pattern, 60) if pattern else torch.ones(1, 1, 60, 60, dtype=torch.bool)
    with torch.no_grad():
        expected = theirs(middle_point=x, condition=cond, text=tokens, time_step=t,
                          padding_mask=torch.ones(1, 60, dtype=torch.bool), spkr_emb=speaker,
                          attn_mask=mask if pattern is None else None,
                          is_causal=pattern is not None, block_pattern=pattern)
        got = ours.velocity(x, cond, ours.text_emb_layer(tokens, 60), t, speaker, mask)
    assert (got - expected).abs().max().item() <= 1e-4
    # Negative control: the other attention mask changes the result.
    other = torch.ones(1, 1, 60, 60, dtype=torch.bool) if pattern else block_attention_mask([2, 1, 2], 60)
    with torch.no_grad():
        wrong = ours.velocity(x, cond, ours.text_emb_layer(tokens, 60), t, speaker, other)
    assert (wrong - expected).abs().max().item() > 1e-2


def test_block_mask_matches_vllm_omni_and_opens_the_next_block_near_a_block_end(reference, pair):
    theirs, _ = pair
    pattern = [3, 2, 4]
    ours = block_attention_mask(pattern, 150)
    expected = theirs._create_block_causal_mask(pattern, 150, torch.device("cpu"), torch.float32)
    assert torch.equal(ours, expected)
    first = int(3 / 12.5 * 22050 / 256)           # 20 frames: the prompt block
    assert ours[0, 0, 0, :first].all() and not ours[0, 0, 0, first:].any()
    # The last frame of the first block looks half the block (10 frames) ahead.
    assert ours[0, 0, first - 1, :first + 9].all() and not ours[0, 0, first - 1, first + 10:].any()


def _their_sampler(reference, dit, cfg_rate=0.7):
    return types.SimpleNamespace(dit=dit, inference_cfg_rate=cfg_rate, t_scheduler="cosine",
                                 speech_token_cfg=False, spkr_emb_adaln=True,
                                 _try_cudagraph_sample=lambda **_: None)


def _their_mel(reference, theirs, tokens, prompt_mel, embedding, noise, pattern=None,
               cache=None, cache_len=None, monkeypatch=None):
    """vLLM-Omni's _forward_full preamble and _do_sample, with our noise."""
    frames = int(tokens.shape[1] / 25 * 50)
    mel_cond = torch.zeros(1, frames, 80)
    mel_cond[:, :prompt_mel.shape[1]] = prompt_mel
    speaker = torch.nn.functional.normalize(embedding, dim=1)
    calls = []

    def our_noise(shape, **_):
        calls.append(tuple(shape))
        return noise[:, :frames].clone()

    monkeypatch.setattr(torch, "randn", our_noise)
    try:
        mel, step_cache = reference.wrapper.GLMTTSDiTForGeneration._do_sample(
            _their_sampler(reference, theirs), speech_tokens=tokens, mel_cond=mel_cond,
            condition=mel_cond, padding_mask=torch.ones(1, frames, dtype=torch.bool),
            spkr_embedding=speaker, n_timesteps=10, last_step_cache=cache, block_pattern=pattern,
            cache_len=cache_len, text_lens=torch.tensor([tokens.shape[1]]))
    finally:
        monkeypatch.undo()
    assert calls == [(1, frames, 80)]
    return mel, step_cache


def _request(seed: int, n_tokens: int):
    """An 8-token prompt with its 16 mel frames, n_tokens new tokens, a speaker vector."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 300, (1, 8), generator=gen),
            torch.randint(0, 300, (1, n_tokens), generator=gen),
            torch.randn(1, 16, 80, generator=gen), torch.randn(1, 192, generator=gen))


def _flow(ours: GLMTTSDiT) -> GLMTTSFlow:
    return GLMTTSFlow(ours).eval()


def test_whole_utterance_mel_matches_vllm_omni_sampler(reference, pair, monkeypatch):
    theirs, ours = pair
    prompt, tokens, prompt_mel, embedding = _request(3, 20)
    noise = frame_noise(5, 56)
    expected, _ = _their_mel(reference, theirs, torch.cat([prompt, tokens], 1), prompt_mel,
                             embedding, noise, monkeypatch=monkeypatch)
    got, _ = _flow(ours).inference(tokens, prompt, prompt_mel, embedding, noise)
    assert got.shape == (1, 40, 80)
    assert (got - expected[:, 16:]).abs().max().item() <= 1e-4
    other, _ = _flow(ours).inference(tokens, prompt, prompt_mel, embedding, frame_noise(6, 56))
    assert (other - expected[:, 16:]).abs().max().item() > 1e-2    # negative control: noise


def test_streamed_chunks_with_carried_trajectory_match_vllm_omni(reference, pair, monkeypatch):
    """Two chunks: block-causal attention, and the second run reusing the first run's ODE
    states for the frames it had settled (vLLM-Omni's last_step_cache / override_len)."""
    theirs, ours = pair
    prompt, tokens, prompt_mel, embedding = _request(4, 30)
    noise = frame_noise(9, 76)
    pattern = [8, 2, 4]
    flow = _flow(ours)
    keep = 16 + 20 - 2 * 1 + 1           # prompt + first chunk's frames - look-ahead + 1
    their_first, their_cache = _their_mel(reference, theirs, torch.cat([prompt, tokens[:, :10]], 1),
                                          prompt_mel, embedding, noise, pattern, None, keep, monkeypatch)
    our_first, our_cache = flow.inference(tokens[:, :10], prompt, prompt_mel, embedding, noise,
                                          pattern, None, keep)
    assert (our_first - their_first[:, 16:]).abs().max().item() <= 1e-4
    their_cache["override_len"] = keep
    their_second, _ = _their_mel(reference, theirs, torch.cat([prompt, tokens], 1), prompt_mel,
                                 embedding, noise, pattern, their_cache, None, monkeypatch)
    our_second, _ = flow.inference(tokens, prompt, prompt_mel, embedding, noise, pattern, our_cache)
    assert (our_second - their_second[:, 16:]).abs().max().item() <= 1e-4
    # Negative control: without the carried trajectory the second run differs.
    fresh, _ = flow.inference(tokens, prompt, prompt_mel, embedding, frame_noise(10, 76), pattern)
    assert (fresh - their_second[:, 16:]).abs().max().item() > 1e-2
    assert isinstance(our_cache, FlowCache) and len(our_cache.steps) == 10


def test_frame_noise_is_a_function_of_seed_and_frame():
    long, short = frame_noise(3, 600), frame_noise(3, 70)
    assert torch.equal(long[:, :70], short)
    assert not torch.equal(frame_noise(4, 70), short)


def test_flow_state_dict_loads_in_both_upstream_forms_and_names_bad_keys(pair, tmp_path):
    _, ours = pair
    state = {f"estimator.{k}": v for k, v in ours.state_dict().items()}
    config = {"spkr_emb_adaLN": True, "remove_spkr_concat_condition": True, "mel_dim": 80,
              "input_frame_rate": 25, "mel_framerate": 50, "speech_token_cfg": False}
    for form in (state, {"model": state}):
        flow = build_flow(config, flow_state_dict(form, "flow.pt"))
        assert flow.estimator.dim == 128 and len(flow.estimator.transformer_blocks) == 2
        assert torch.equal(flow.estimator.proj_out.weight, ours.proj_out.weight)
    broken = dict(state)
    del broken["estimator.norm_out.linear.weight"]
    with pytest.raises(CheckpointError, match="norm_out.linear.weight"):
        build_flow(config, broken)
    with pytest.raises(CheckpointError, match="estimator"):
        flow_state_dict({"weight": torch.zeros(1)}, "flow.pt")
