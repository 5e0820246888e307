"""Our Qwen3-TTS code predictor (tritontts.families.qwen3_tts.talker: CodePredictor, predict_frame,
greedy) against vLLM-Omni 0.30's (Qwen3TTSTalkerCodePredictorForConditionalGenerationVLLM over
models/common/qwen3_code_predictor.py's CodePredictorWrapper, as its Qwen3-TTS talker builds and
loads it) on the same tiny random checkpoint, float32: from the same talker hidden states and
code 0, greedy codes 1..15 are equal and so are the logits of every step."""
from __future__ import annotations

import json

import pytest
import torch

from tritontts.weights.checkpoint import load_strict
from tritontts.families.qwen3_tts.checkpoint import CONFIG_FILE, open_checkpoint
from tritontts.families.qwen3_tts.random_checkpoint import write_random_checkpoint
from tritontts.families.qwen3_tts.talker import CodePredictor, greedy, predict_frame

PREDICTOR = "talker.code_predictor."
ROWS = 3
LOGITS_TOLERANCE = 1e-4


class _EagerCpuPlatform:
    """Stands in for vllm_omni.platforms.current_omni_platform (see the fixture)."""

    def is_npu(self) -> bool:
        return False

    is_xpu = is_cuda = is_rocm = is_musa = is_out_of_tree = is_npu

    def supports_torch_inductor(self) -> bool:
        return False

    def synchronize(self) -> None:
        pass


class Omni:
    """vLLM-Omni's predictor module, its configs and a VllmConfig: builds loaded predictors."""

    def __init__(self, root, module, configuration):
        from vllm.config import VllmConfig

        self.module = module
        config = configuration.Qwen3TTSConfig(**json.loads((root / CONFIG_FILE).read_text()))
        self.talker_config = config.talker_config
        self.vllm_config = VllmConfig()

    def build(self, state: dict[str, torch.Tensor]):
        """A predictor built as Qwen3TTSTalkerForConditionalGeneration.__init__ builds it and
        loaded through its own load_weights from `state` (the checkpoint's talker.code_predictor.*
        tensors, names relative to the predictor, as vLLM's AutoWeightsLoader hands them over
        after the talker's hf_to_vllm_mapper renames talker.code_predictor. to code_predictor.)."""
        from vllm.config.vllm import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            predictor = self.module.Qwen3TTSTalkerCodePredictorForConditionalGenerationVLLM(
                vllm_config=self.vllm_config, config=self.talker_config.code_predictor_config,
                talker_config=self.talker_config, prefix="code_predictor")
        loaded = predictor.load_weights(iter(state.items()))
        params = {name for name, _ in predictor.named_parameters()}
        assert loaded == params, (sorted(params - loaded), sorted(loaded - params))
        return predictor.eval()

    @staticmethod
    def predict(predictor, hidden, code0, code0_embeds) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy codes [B, 16] (code 0 first) from its forward as talker_mtp calls it, and the
        logits [B, 15, V] its lm_head.{0..14} produced, caught by forward hooks."""
        caught: list[torch.Tensor] = []
        hooks = [head.register_forward_hook(lambda _m, _i, out: caught.append(out.detach().clone()))
                 for head in predictor.lm_head]
        try:
            codes = predictor(layer0_code=code0.reshape(-1, 1), layer0_embed=code0_embeds[:, None],
                              last_talker_hidden=hidden[:, None], do_sample=False)
        finally:
            for hook in hooks:
                hook.remove()
        return codes.clone(), torch.stack(caught, dim=1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The checkpoint, our predictor, vLLM-Omni's (Omni) and the inputs.

    vLLM-Omni is imported file by file (tritontts.upstream.vllm_omni_module: its
    package __init__ patches another vLLM version). Its Qwen3-TTS code predictor is plain torch
    (nn.Linear with packed qkv / gate_up, nn.Embedding, its own RMSNorm and RoPE, SDPA with
    is_causal and no KV cache: every step re-prefills all 17 positions) plus vLLM's
    default_weight_loader; it has no vLLM Attention, paged KV cache or parallel linear layers
    (use_parallel_embedding=False for Qwen3-TTS), so no distributed environment, forward
    context or process_weights_after_loading is involved, and every parameter is loaded by
    its load_weights (checked) rather than starting as torch.empty.

    One stand-in, for the module vllm_omni.platforms: current_omni_platform is
    _EagerCpuPlatform, which is not NPU/XPU/CUDA/ROCm/MUSA (so its CustomOps take
    forward_native and attention takes the F.scaled_dot_product_attention branch, as on the
    UnspecifiedOmniPlatform that resolves on a CPU-only machine) and reports no Inductor
    support, so CodePredictorWrapper._setup_compile takes its eager branch (model.forward,
    uncompiled: the same graph without torch.compile, and no bucket warm-up or padding).
    Without it the first forward raises NotImplementedError on a CPU-only machine:
    UnspecifiedOmniPlatform leaves supports_torch_inductor unimplemented
    (vllm_omni/platforms/interface.py:160-162), and _setup_compile calls it
    (models/common/qwen3_code_predictor.py:749). A VllmConfig() (defaults) is passed as the
    talker passes its own; only load_weights' set_current_vllm_config reads it."""
    from tritontts.upstream import vllm_omni_module

    root = write_random_checkpoint(tmp_path_factory.mktemp("qwen3-tts"), kind="custom_voice")
    checkpoint = open_checkpoint(root)
    talker = checkpoint.config.talker
    state = checkpoint.tensors(PREDICTOR)
    ours = CodePredictor(talker.code_predictor, talker.hidden_size)
    load_strict(ours, state, f"{root} ({PREDICTOR}*)")
    ours.eval()

    package = "vllm_omni.model_executor.models.qwen3_tts."
    stand_ins = {"vllm_omni.platforms": {"current_omni_platform": _EagerCpuPlatform()}}
    with vllm_omni_module(package + "qwen3_tts_code_predictor_vllm", stand_ins) as module:
        import vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts as configuration
        omni = Omni(root, module, configuration)

    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(ROWS, talker.hidden_size, generator=g)
    code0 = torch.randint(0, talker.code_predictor.vocab_size, (ROWS,), generator=g)
    # Code 0's embedding comes from the talker's codec_embedding (vLLM-Omni: embed_input_ids).
    codec_embedding = checkpoint.tensors("talker.model.codec_embedding.")["weight"]
    code0_embeds = torch.nn.functional.embedding(code0, codec_embedding)
    return dict(checkpoint=checkpoint, state=state, ours=ours, omni=omni,
                inputs=(hidden, code0, code0_embeds))


def our_codes_and_logits(predictor, hidden, code0, code0_embeds) -> tuple[torch.Tensor, torch.Tensor]:
    steps: list[torch.Tensor] = []

    def recording_greedy(logits, step):
        steps.append(logits.detach().clone())
        return greedy(logits, step)

    codes = predict_frame(predictor, hidden, code0, code0_embeds, recording_greedy)
    return codes, torch.stack(steps, dim=1)


def test_greedy_codes_and_step_logits_equal_vllm_omni_code_predictor(setup):
    omni, inputs = setup["omni"], setup["inputs"]
    predictor = omni.build(setup["state"])
    shape = setup["checkpoint"].config.talker.code_predictor
    assert isinstance(predictor.small_to_mtp_projection, torch.nn.Linear)   # 128 -> 64 exercised
    assert predictor.model.rotary_emb.inv_freq[1].item() == pytest.approx(
        shape.rope_theta ** (-2 / shape.head_dim), rel=1e-6)

    ours, our_logits = our_codes_and_logits(setup["ours"], *inputs)
    theirs, their_logits = omni.predict(predictor, *inputs)
    mismatches = int((ours != theirs).sum())
    diff = float((our_logits - their_logits).abs().max())
    print(f"\ncodes ({ROWS} rows x {ours.shape[1]}): {mismatches} mismatches; step logits "
          f"{tuple(their_logits.shape)} max|diff| {diff:.2e} (max|logit| {float(their_logits.abs().max()):.2f})")
    print("ours:\n", ours, "\nvLLM-Omni:\n", theirs)
    assert ours.shape == theirs.shape == (ROWS, shape.num_code_groups)
    assert torch.equal(theirs[:, 0], inputs[1])
    assert mismatches == 0
    assert diff <= LOGITS_TOLERANCE
    # Not degenerate: the codes vary across rows and steps.
    assert len(set(ours[:, 1:].flatten().tolist())) > ROWS


def test_vllm_omni_codes_and_logits_differ_when_one_predictor_weight_is_perturbed(setup):
    omni, inputs = setup["omni"], setup["inputs"]
    key = "model.layers.1.self_attn.v_proj.weight"   # lands in vLLM-Omni's packed qkv_proj
    state = dict(setup["state"])
    state[key] = state[key] + 0.5 * torch.randn(state[key].shape, generator=torch.Generator().manual_seed(3))
    ours, our_logits = our_codes_and_logits(setup["ours"], *inputs)
    theirs, their_logits = omni.predict(omni.build(state), *inputs)
    mismatches = int((ours != theirs).sum())
    diff = float((our_logits - their_logits).abs().max())
    print(f"\n{key} perturbed on the vLLM-Omni side: {mismatches} of {ours.numel()} codes differ, "
          f"step logits max|diff| {diff:.2e}")
    assert mismatches > 0
    assert diff > 100 * LOGITS_TOLERANCE
