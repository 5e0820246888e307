"""Gepard's audio heads and prompt layout (tritontts.families.gepard.heads / .prompt) against vLLM-Omni
0.30's Gepard modules on the same random weights, fp32: the frame drawn from a hidden state
with a seeded generator (32 Gumbel-max codes at the sidecar's temperature, the stop verdict),
the next step's input embedding, and the prompt ids for short (repeated) and long texts."""
from __future__ import annotations

import pytest
import torch

from tritontts.families.gepard.heads import GepardHeads, heads_state
from tritontts.families.gepard.prompt import GepardPromptBuilder, prompt_ids
from tritontts.families.gepard.upstream import GEPARD_STAND_INS, gepard_upstream_talker
from tritontts.upstream import vllm_omni_module


@pytest.fixture(scope="module")
def heads_and_reference(checkpoint):
    from safetensors.torch import load_file

    heads = GepardHeads(checkpoint.config)
    heads.load_state_dict(heads_state(load_file(str(checkpoint.weight_files[0]))), strict=True)
    _, omni = gepard_upstream_talker(checkpoint)
    return heads.eval(), omni


def test_drawn_frames_and_stop_equal_vllm_omni_for_the_same_seeds_and_another_seed_differs(checkpoint,
                                                                                        heads_and_reference):
    heads, omni = heads_and_reference
    hidden = 3.0 * torch.randn(6, checkpoint.config.backbone.hidden_size, generator=torch.Generator().manual_seed(0))
    seeds = [11, 12, 13, 14, 15, 16]
    with torch.no_grad():
        codes, stop = heads.draw(hidden, [torch.Generator().manual_seed(s) for s in seeds])
        head0, rest, want_stop = omni._sample_frame(hidden, [torch.Generator().manual_seed(s) for s in seeds])
        other, _ = heads.draw(hidden, [torch.Generator().manual_seed(s + 100) for s in seeds])
    want = torch.cat([head0[:, None], rest], dim=1)
    print(f"codes equal: {torch.equal(codes, want)}; stops {stop.tolist()}; another seed changes "
          f"{int((other != codes).sum())} of {codes.numel()} codes")
    assert torch.equal(codes, want) and torch.equal(stop, want_stop)
    assert not torch.equal(other, codes)
    # Every code within its head's levels.
    assert bool((codes < torch.tensor(checkpoint.config.head_levels)).all())


def test_frame_embedding_matches_vllm_omni_within_1e6_and_a_perturbed_table_does_not(checkpoint, heads_and_reference):
    heads, omni = heads_and_reference
    levels = torch.tensor(checkpoint.config.head_levels)
    codes = (torch.rand(5, len(levels), generator=torch.Generator().manual_seed(1)) * levels).long()
    with torch.no_grad():
        ours, want = heads.embed(codes), omni._audio_frame_embed(codes[:, 0], codes[:, 1:])
        diff = (ours - want).abs().max().item()
        heads.audio_embeddings[7].weight.add_(0.1)
        perturbed = (heads.embed(codes) - want).abs().max().item()
        heads.audio_embeddings[7].weight.sub_(0.1)
    print(f"frame embedding max-abs-diff {diff:.2e} (perturbed table: {perturbed:.2e})")
    assert diff <= 1e-6 < perturbed


@pytest.mark.parametrize("text", ["Hi.", "Hello there, how are you?",
                                  "A much longer sentence that needs no repetition at all to be heard clearly."])
def test_prompt_ids_equal_vllm_omni_layout_for_short_and_long_texts(checkpoint, text):
    import json

    sidecar = json.loads(checkpoint.path("gepard_config.json").read_text())
    with vllm_omni_module("vllm_omni.model_executor.models.gepard.configuration_gepard") as m:
        reference_config = m.GepardConfig(**sidecar)
    with vllm_omni_module("vllm_omni.model_executor.models.gepard.prompt", GEPARD_STAND_INS) as m:
        build_reference = m.build_gepard_prompt_ids
    ours = GepardPromptBuilder(checkpoint.root, checkpoint.config)
    text_ids = ours.text_ids(text)
    want = build_reference(text_ids, config=reference_config)
    print(f"{len(text_ids)} text tokens -> {len(want)} prompt ids")
    assert ours(text) == want
    assert prompt_ids(text_ids, checkpoint.config).count(checkpoint.config.start_of_speech) == 1
