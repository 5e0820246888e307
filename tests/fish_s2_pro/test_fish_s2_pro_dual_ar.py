"""Fish Speech S2 Pro's dual-AR talker (ours, tritontts.families.fish_s2_pro.dual_ar) against
mizuoto-fishspeech 0.2.3 (an op-by-op port of upstream; a test-only reference) on the same
tiny random weights, fp32: the slow AR's logits and the fast AR's input over a prompt with
semantic positions (codebook embeddings, the sqrt(11) scaling), and whole seeded generations
(upstream's sampling order, repetition-aware resampling, the fast AR's codes) frame for
frame; another seed as the negative control."""
from __future__ import annotations

import pytest
import torch

from tritontts.families.fish_s2_pro.checkpoint import parse_config_dict
from tritontts.families.fish_s2_pro.dual_ar import FishDualAR, FishSampling, FrameSampler

SEMANTIC_BEGIN, CODEBOOK, IM_END = 200, 64, 5
LAYER = {"dim": 64, "n_head": 4, "n_local_heads": 2, "head_dim": 16, "intermediate_size": 128,
         "rope_base": 1000000.0, "norm_eps": 1e-6}
CONFIG = {
    "model_type": "fish_qwen3_omni", "semantic_start_token_id": SEMANTIC_BEGIN,
    "semantic_end_token_id": SEMANTIC_BEGIN + CODEBOOK - 1, "eos_token_id": IM_END, "pad_token_id": 6,
    "audio_pad_token_id": 7,
    "text_config": {**LAYER, "model_type": "fish_qwen3", "n_layer": 2, "vocab_size": 300,
                    "attention_qk_norm": True, "tie_word_embeddings": True, "max_seq_len": 512},
    "audio_decoder_config": {**LAYER, "model_type": "fish_qwen3_audio_decoder", "n_layer": 2,
                             "vocab_size": CODEBOOK, "num_codebooks": 10, "attention_qk_norm": False,
                             "max_seq_len": 11, "text_dim": 64, "tie_word_embeddings": False},
}


def reference(state: dict[str, torch.Tensor]):
    from mizuoto_fishspeech.model import DualARTransformer, ModelArgs, remap_keys

    args = ModelArgs.from_config(CONFIG)
    model = DualARTransformer(args)
    model.load_state_dict(remap_keys(state), strict=True)
    return model.float().eval()


@pytest.fixture(scope="module")
def pair():
    from tritontts.families.fish_s2_pro.random_checkpoint import random_state

    config = parse_config_dict(CONFIG)
    ours = FishDualAR(config)
    state = random_state(config, torch.Generator().manual_seed(0), torch.float32)
    ours.load_state_dict(state, strict=True)
    return config, ours.eval(), reference(state)


def prompt(config) -> torch.Tensor:
    """[1 + K, T]: text tokens, then 6 semantic positions carrying codes (a cloned voice's)."""
    gen = torch.Generator().manual_seed(3)
    text = torch.randint(10, SEMANTIC_BEGIN, (9,), generator=gen)
    codes = torch.randint(0, CODEBOOK, (config.num_codebooks, 6), generator=gen)
    tokens = torch.cat([text, codes[0] + SEMANTIC_BEGIN, torch.tensor([11, 12])])
    values = torch.zeros(1 + config.num_codebooks, tokens.shape[0], dtype=torch.long)
    values[0] = tokens
    values[1:, 9:15] = codes
    return values


def test_slow_ar_logits_and_fast_input_match_mizuoto(pair):
    from tritontts.nn.qwen3 import KVCache

    config, ours, ref = pair
    p = prompt(config)
    t = p.shape[1]
    with torch.no_grad():
        step = ref.forward_generate(p[None], torch.arange(t), t, ref.new_caches(), math_kernel=False)
        x = ours.embed(p[0][None], p[1:].T[None])
        hidden = ours.slow(x, torch.arange(t), KVCache(len(ours.slow.layers)))[:, -1:]
        logits = ours.main_logits(hidden)
    allowed = torch.isfinite(logits)
    diff = (logits[allowed] - step.logits[allowed]).abs().max().item()
    hdiff = (hidden - step.hidden_states).abs().max().item()
    print(f"slow AR logits max-abs-diff {diff:.2e}, fast AR input {hdiff:.2e}")
    assert diff < 1e-5 and hdiff < 1e-5
    # The restriction: the semantic tokens and <|im_end|> only.
    assert int(allowed.sum()) == CODEBOOK + 1 and bool(allowed[0, 0, IM_END])


def reference_frames(ref, p: torch.Tensor, seed: int, max_frames: int) -> torch.Tensor:
    from mizuoto_fishspeech.generate import Decoder, Sampling

    decoder = Decoder(ref, IM_END)
    decoder.start(Sampling(temperature=0.8, top_p=0.8, max_new_tokens=max_frames),
                  torch.Generator().manual_seed(seed), lambda: None)
    with torch.no_grad():
        y = decoder.generate(p)
    return y[:, p.shape[1]:].T          # [n, 1 + K], the <|im_end|> frame included


def test_seeded_generation_matches_mizuoto_frame_for_frame(pair):
    config, ours, ref = pair
    p = prompt(config)
    want = reference_frames(ref, p, seed=11, max_frames=24)
    got = ours.generate(p[0], p[1:].T, FrameSampler(torch.Generator().manual_seed(11), FishSampling()), 24)
    other = ours.generate(p[0], p[1:].T, FrameSampler(torch.Generator().manual_seed(12), FishSampling()), 24)
    ended = bool(want[-1, 0] == IM_END)
    print(f"{got.shape[0]} frames (reference {want.shape[0]}, ended by <|im_end|>: {ended}); "
          f"main tokens {got[:, 0].tolist()}")
    assert got.shape[0] >= 4
    assert torch.equal(got, want[:got.shape[0]])
    assert want.shape[0] == got.shape[0] + (1 if ended else 0)
    # Every code in range; code 0 is the main token's semantic index.
    assert torch.equal(got[:, 1], got[:, 0] - SEMANTIC_BEGIN)
    assert ((got[:, 2:] >= 0) & (got[:, 2:] < CODEBOOK)).all()
    assert not torch.equal(other[:min(len(other), len(got))], got[:min(len(other), len(got))])


def test_repetition_aware_resampling_takes_the_second_draw_on_a_repeat(pair):
    """A main token among the recent frames' is replaced by the second draw (temperature 1.0,
    top-p 0.9), drawn after it from the same generator; the first frames are not (upstream's
    window starts after the first frame)."""
    from tritontts.families.fish_s2_pro.dual_ar import draw, filtered_probs

    config, *_ = pair
    logits = torch.full((300,), float("-inf"))
    # <|semantic:0|> has 0.85: alone in the first draw's 0.8 nucleus, not in the second's 0.9.
    logits[SEMANTIC_BEGIN:SEMANTIC_BEGIN + 3] = torch.tensor([2.0, 0.27, 0.27])
    replaced = 0
    for seed in range(20):
        fresh = FrameSampler(torch.Generator().manual_seed(seed))
        assert fresh.main(logits, config) == SEMANTIC_BEGIN          # first frame: never replaced
        sampler = FrameSampler(torch.Generator().manual_seed(seed))
        sampler.recent.extend([SEMANTIC_BEGIN] * 3)
        sampler.frames = 5
        g = torch.Generator().manual_seed(seed)
        first = draw(filtered_probs(logits, torch.tensor(0.8), torch.tensor(0.8)), g)
        second = draw(filtered_probs(logits, torch.tensor(1.0), torch.tensor(0.9)), g)
        got = sampler.main(logits, config)
        assert first == SEMANTIC_BEGIN and got == second
        replaced += second != SEMANTIC_BEGIN
    print(f"replaced by another token in {replaced} of 20 seeds")
    assert replaced > 0
