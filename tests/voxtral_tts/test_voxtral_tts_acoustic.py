"""Voxtral TTS's acoustic transformer (ours) against vLLM-Omni 0.30's
FlowMatchingAudioTransformer on the same random weights and the same noise: the velocity
(continuous) and whole frames of codes (semantic argmax, 7 CFG Euler steps, quantization,
END handling); another cfg as the negative control."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tritontts.weights.checkpoint import ConfigFields
from tritontts.upstream import vllm_omni_module
from tritontts.families.voxtral_tts.acoustic import END_AUDIO, AcousticConfig, AcousticTransformer

ARGS = {"semantic_codebook_size": 300, "acoustic_codebook_size": 21, "n_acoustic_codebook": 36,
        "acoustic_transformer_args": {"input_dim": 64, "dim": 64, "n_layers": 3, "head_dim": 16,
                                      "hidden_dim": 128, "n_heads": 4, "n_kv_heads": 2,
                                      "use_biases": False, "norm_eps": 1e-5, "n_decoding_steps": 7}}


@pytest.fixture(scope="module")
def pair():
    import copy

    config = AcousticConfig.from_dict(ARGS, ConfigFields(ARGS, Path("params.json"), "audio_model_args."))
    ours = AcousticTransformer(config)
    gen = torch.Generator().manual_seed(0)
    state = {}
    for name, t in ours.state_dict().items():
        noise = torch.randn(t.shape, generator=gen)
        state[name] = 1.0 + 0.1 * noise if name.endswith("norm.weight") else noise * t.shape[-1] ** -0.5
    ours.load_state_dict(state)
    with vllm_omni_module("vllm_omni.model_executor.models.voxtral_tts.voxtral_tts_audio_generation") as m:
        ref = m.FlowMatchingAudioTransformer(copy.deepcopy(ARGS))
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"time_embedding.inv_freq"}, (missing, unexpected)
    return config, ours.eval(), ref.eval()


def test_velocity_matches_vllm_omni(pair):
    config, ours, ref = pair
    gen = torch.Generator().manual_seed(1)
    x, time, cond = (torch.randn(5, n, generator=gen) for n in (36, 64, 64))
    with torch.no_grad():
        diff = (ours.velocity(x, time, cond) - ref._predict_velocity(x, cond, time)).abs().max().item()
    print(f"velocity max-abs-diff {diff:.2e}")
    assert diff < 1e-5


def test_frames_match_vllm_omni_with_the_same_noise(pair):
    config, ours, ref = pair
    hidden = torch.randn(6, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        # Row 0 made to end: its END logit dominates.
        ours.semantic_codebook_output.weight[END_AUDIO] = hidden[0] * 50 / hidden[0].norm() ** 2
        ref.semantic_codebook_output.weight.copy_(ours.semantic_codebook_output.weight)
        cfg = torch.tensor([1.2, 1.2, 1.5, 1.0, 1.2, 2.0])
        torch.manual_seed(7)
        want = ref(hidden, cfg)
        torch.manual_seed(7)
        got = ours.frame(hidden, torch.randn(6, 36), cfg)
        torch.manual_seed(7)
        other = ours.frame(hidden, torch.randn(6, 36), cfg + 0.5)
    print("semantic", got[:, 0].tolist(), "first acoustic", got[:, 1:5].tolist())
    assert torch.equal(got, want)
    assert got[0, 0] == END_AUDIO and (got[0, 1:] == 2).all()
    assert ((got[1:, 1:] >= 2) & (got[1:, 1:] <= 22)).all()
    assert not torch.equal(other[1:], got[1:])      # negative control: another cfg
