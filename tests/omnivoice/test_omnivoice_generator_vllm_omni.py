"""OmniVoice's generator against vLLM-Omni 0.30's `omnivoice_generator` on the same random
weights (fp32): one packed forward's logits (max-abs-diff), and the codes of the whole
unmasking loop with the same per-request seeds (equal), for the automatic voice, cloning
and a batch of two requests of different lengths; each with a negative control.

vLLM-Omni does not run on CPU as shipped; what stands in for it here, and nothing else:
- `vllm_omni.diffusion.attention.layer.Attention` (the diffusion attention backend, which
  needs vLLM-Omni's GPU platform) is `_FP32Attention`: plain fp32 SDPA over the block mask
  the reference builds itself (`_attention_metadata_from_cu_seqs`). Its backend reports no
  packed-varlen kernel, so the reference takes its own mask path (`_needs_sdpa_mask`) and
  calls `attention_op.sdpa_fallback.forward`.
- `OmniVoiceAttention.forward` is `_attention_forward_fp32`: the reference's lines (its
  qkv_proj, fused_qkv_norm_rope, o_proj, the same dispatch) less the one `.to(torch.bfloat16)`
  on q/k/v, which would round fp32 activations to 8 mantissa bits.
- `_TRITON_AVAILABLE` is set False: Triton imports here but has no CPU backend, and the flag
  is the module's own switch to its PyTorch RMSNorm / SwiGLU / add+norm. fused_qkv_norm_rope
  takes its own eager path on CPU tensors (fused_cuda_supported needs CUDA).
- `vllm_omni.diffusion.data.OmniDiffusionConfig` is an empty placeholder (read only by the
  CUDA-graph capture plan; the config sets enable_cuda_graph and enable_tf32 False).
Embeddings, norms, fused q/k norm + RoPE, MLP, block mask, schedule, CFG, the unmasking loop
and the Gumbel noise are theirs; the packed input follows their pipeline_omnivoice.

Measured on this checkpoint: logits max-abs-diff 0.0 (bit-equal; with the shipped bf16 cast
it is 7.7e-3 against a peak of 1.8, hence the substitution).

Their Gumbel noise is -log(-log(clamp(u, 1e-8))), ours (the omnivoice package's)
-log(-log(u + 1e-10) + 1e-10). On the same float32 draws they differ only where the 1e-10
can survive rounding (u below ~2e-3 or above ~0.998): in 0.1% of 1e7 draws, by at most 8.4e-4,
too little to reorder any topk measured. Codes equal exactly: 0 of 29,760 differed over 160
requests (these three cases under 40 seed sets), so the assertion is strict equality.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tritontts.families.omnivoice.generator import UnmaskJob, UnmaskSettings, load_generator, unmask
from tritontts.families.omnivoice.prompt import TextTokenizer, build_sequence
from tritontts.upstream import vllm_omni_module

TOLERANCE = 1e-4
TEXT = "The birch canoe slid on the smooth planks."
OTHER_TEXT = "Glue the sheet to the dark blue background."
STEPS = 8


class _NoPackedVarlen:
    """Backend capabilities: no varlen kernel, so the reference builds its SDPA block mask."""

    @staticmethod
    def supports_multi_doc_packed_varlen() -> bool:
        return False


class _FP32SDPA:
    def __init__(self, scale: float, causal: bool):
        self.scale, self.causal = scale, causal

    def forward(self, q, k, v, attn_metadata):
        """[B, S, N, D] in and out, as the Omni backends take them."""
        mask = attn_metadata.attn_mask
        assert mask is not None, "packed sequences need the reference's block mask"
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask, is_causal=self.causal, scale=self.scale)
        return out.transpose(1, 2)


class _FP32Attention(nn.Module):
    """Stands in for vllm_omni.diffusion.attention.layer.Attention (the attention op only)."""

    attn_backend = _NoPackedVarlen

    def __init__(self, *, num_heads, head_size, causal, softmax_scale, **_):
        super().__init__()
        self.sdpa_fallback = _FP32SDPA(softmax_scale, causal)

    def forward(self, q, k, v, attn_metadata):
        return self.sdpa_fallback.forward(q, k, v, attn_metadata)


def _attention_forward_fp32(module):
    """OmniVoiceAttention.forward of `module`, less its q/k/v cast to bfloat16."""
    fused_qkv_norm_rope = module.fused_qkv_norm_rope

    def forward(self, hidden_states, rope_table, attn_metadata):
        seq_len, _ = hidden_states.shape
        qkv = self.qkv_proj(hidden_states).view(1, seq_len, self.num_qkv_heads, self.head_dim)
        q, k, v = fused_qkv_norm_rope(qkv, self.q_norm.weight, self.k_norm.weight, rope_table,
                                      self.q_norm.eps, self.num_heads, self.num_kv_heads)
        q, k, v = (tensor.permute(0, 2, 1, 3).contiguous() for tensor in (q, k, v))
        if self.use_packed_varlen:
            out = self.attention_op(q, k, v, attn_metadata)
        else:
            out = self.attention_op.sdpa_fallback.forward(q, k, v, attn_metadata)
        out = out.squeeze(0).to(hidden_states.dtype).reshape(seq_len, self.num_heads * self.head_dim)
        return self.o_proj(out)

    return forward


@pytest.fixture(scope="module")
def ours(checkpoint):
    return load_generator(checkpoint)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return TextTokenizer(checkpoint.root)


@pytest.fixture(scope="module")
def reference(checkpoint):
    """vLLM-Omni's OmniVoiceGenerator (eager, fp32) loaded by its own load_weights."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    stand_ins = {
        "vllm_omni.diffusion.attention.layer": {"Attention": _FP32Attention},
        "vllm_omni.diffusion.data": {"OmniDiffusionConfig": type("OmniDiffusionConfig", (), {})},
    }
    # Its config module registers "omnivoice" with AutoConfig; the registry is put back after.
    registered = dict(CONFIG_MAPPING._extra_content)
    try:
        with vllm_omni_module("vllm_omni.model_executor.models.omnivoice.omnivoice_generator",
                              stand_ins=stand_ins) as module:
            module._TRITON_AVAILABLE = False
            module.OmniVoiceAttention.forward = _attention_forward_fp32(module)
            config = module.OmniVoiceConfig(**json.loads((checkpoint.root / "config.json").read_text()),
                                            enable_cuda_graph=False, enable_tf32=False)
            model = module.OmniVoiceGenerator(config, module.OmniDiffusionConfig())
            model.load_weights(str(checkpoint.root), torch.device("cpu"))
            assert model._cuda_graph_fwd is None and model._needs_sdpa_mask
            yield module, model.eval()
    finally:
        CONFIG_MAPPING._extra_content.clear()
        CONFIG_MAPPING._extra_content.update(registered)


def _sequence(checkpoint, tokenizer, text, frames, clone=False):
    """Our prompt: auto voice, or cloning with random reference codes."""
    cfg = checkpoint.config
    ref_codes = ref_text = None
    if clone:
        ref_codes = np.random.default_rng(3).integers(0, 1024, (8, 30)).astype(np.int64)
        ref_text = "This is the reference voice."
    return build_sequence(tokenizer, cfg.num_audio_codebook, cfg.audio_mask_id, text,
                          "en" if clone else None, None, ref_text, ref_codes, frames=frames)


def _jobs(checkpoint, tokenizer, requests):
    """requests: (text, frames, clone, seed) -> our UnmaskJobs."""
    jobs = []
    for text, frames, clone, seed in requests:
        seq = _sequence(checkpoint, tokenizer, text, frames, clone)
        jobs.append(UnmaskJob(torch.from_numpy(seq.ids), seq.audio_start, frames, seed,
                              UnmaskSettings(num_steps=STEPS)))
    return jobs


def _reference_inputs(jobs):
    """Their packing (pipeline_omnivoice: _prepare_request_input, _collate_request_inputs):
    rows request-major [cond0, uncond0, cond1, ...], ids [total, 8], uncond = the target
    frames alone, all audio."""
    ids, audio, cond_lens, target_lens = [], [], [], []
    for job in jobs:
        cond = job.ids.T
        n = cond.shape[0]
        ids += [cond, cond[n - job.frames:]]
        audio += [torch.arange(n) >= job.audio_start, torch.ones(job.frames, dtype=torch.bool)]
        cond_lens.append(n)
        target_lens.append(job.frames)
    return torch.cat(ids).contiguous(), torch.cat(audio), cond_lens, target_lens


def _our_inputs(jobs):
    """The same sequences as our logits takes them, in one row: ids [1, C, N], sequence, positions."""
    ids, audio, cond_lens, target_lens = _reference_inputs(jobs)
    lengths = [n for pair in zip(cond_lens, target_lens) for n in pair]
    sequence = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    positions = torch.cat([torch.arange(n) for n in lengths])
    return ids.T.contiguous()[None], audio[None], sequence[None], positions[None]


def _reference_codes(reference, jobs, seeds):
    module, model = reference
    ids, audio, cond_lens, target_lens = _reference_inputs(jobs)
    s = jobs[0].settings
    tokens = model(ids, audio, cond_lens, target_lens, seed=list(seeds), num_step=s.num_steps,
                   guidance_scale=s.guidance_scale, t_shift=s.t_shift,
                   layer_penalty_factor=s.layer_penalty, position_temperature=s.position_temperature,
                   class_temperature=s.class_temperature)[0]
    return [codes.numpy() for codes in tokens.split(target_lens, dim=1)]


def test_packed_logits_match_vllm_omni_step_forward_within_1e_4(checkpoint, tokenizer, ours, reference):
    """Two requests (cloning and auto, each with its unconditional sequence) in one packed row."""
    module, model = reference
    jobs = _jobs(checkpoint, tokenizer, [(TEXT, 18, True, 0), (OTHER_TEXT, 27, False, 0)])
    ids, audio, cond_lens, target_lens = _reference_inputs(jobs)
    with torch.inference_mode():
        cu_seqs = module._build_cu_seqs(cond_lens, target_lens, ids.device)
        rope = model._rope_table_for(ids.shape[0], ids.device, model.model_dtype)
        expected = model._step_forward(ids, audio, cu_seqs, rope)
        got = ours.logits(*_our_inputs(jobs))[0]
        assert got.shape == expected.shape
        diff = float((got - expected).abs().max())
        assert diff <= TOLERANCE, diff
        # Negative control: one changed weight moves the logits past the bound.
        weight = ours.llm.layers[0].mlp.down_proj.weight
        original = weight.clone()
        weight.add_(0.05)
        try:
            perturbed = ours.logits(*_our_inputs(jobs))[0]
        finally:
            weight.copy_(original)
        assert float((perturbed - expected).abs().max()) > TOLERANCE


CODE_CASES = {
    "auto": [(TEXT, 24, False, 1234)],
    "clone": [(TEXT, 24, True, 1234)],
    "batch_of_two_lengths": [(TEXT, 18, True, 7), (OTHER_TEXT, 27, False, 8)],
}


@pytest.mark.parametrize("name", sorted(CODE_CASES))
def test_unmasked_codes_equal_vllm_omni_with_the_same_per_request_seeds(checkpoint, tokenizer, ours,
                                                                          reference, name):
    jobs = _jobs(checkpoint, tokenizer, CODE_CASES[name])
    got = [codes.numpy() for codes in unmask(ours, jobs)]
    seeds = [job.seed for job in jobs]
    expected = _reference_codes(reference, jobs, seeds)
    for job, ours_codes, their_codes in zip(jobs, got, expected):
        assert ours_codes.shape == (8, job.frames)
        assert (ours_codes != checkpoint.config.audio_mask_id).all()
        assert np.array_equal(ours_codes, their_codes), \
            f"{int((ours_codes != their_codes).sum())} of {ours_codes.size} codes differ"
    # Negative control: other seeds' noise gives other codes for every request.
    other = _reference_codes(reference, jobs, [seed + 1 for seed in seeds])
    assert all(not np.array_equal(a, b) for a, b in zip(got, other))
