"""Our Fish Speech S2 Pro fast AR (tritontts.families.fish_s2_pro.dual_ar: decode_frames over the
audio_decoder.* weights) against vLLM-Omni 0.30's FishSpeechFastAR (vLLM layers, run on this
CPU in a single-process vLLM: gloo distributed init, model parallel 1, quant methods'
process_weights_after_loading) on the same tiny random weights, greedy, fp32: from the same
slow-AR hidden states and main tokens the 9 residual codes are equal. vLLM-Omni computes the
fast AR's RoPE tables in fp32 where upstream rounds them to bfloat16: compared with fp32 tables
here, and the bf16 tables' effect on the codes is printed (upstream's, which we serve); a
perturbed weight as the negative control."""
from __future__ import annotations

import pytest
import torch

from tritontts.families.fish_s2_pro.checkpoint import parse_config_dict
from tritontts.families.fish_s2_pro.dual_ar import FishDualAR, decode_frames

SEMANTIC_BEGIN, CODEBOOK = 200, 64
LAYER = {"dim": 64, "n_head": 4, "n_local_heads": 2, "head_dim": 16, "intermediate_size": 128,
         "rope_base": 1000000.0, "norm_eps": 1e-6}
CONFIG = {
    "model_type": "fish_qwen3_omni", "semantic_start_token_id": SEMANTIC_BEGIN,
    "semantic_end_token_id": SEMANTIC_BEGIN + CODEBOOK - 1, "eos_token_id": 5, "pad_token_id": 6,
    "audio_pad_token_id": 7,
    "text_config": {**LAYER, "n_layer": 1, "vocab_size": 300, "attention_qk_norm": True, "max_seq_len": 64},
    "audio_decoder_config": {**LAYER, "n_layer": 2, "vocab_size": CODEBOOK, "num_codebooks": 10,
                             "attention_qk_norm": False, "max_seq_len": 11, "text_dim": 64},
}


class _EagerCpuPlatform:
    """Stands in for vllm_omni.platforms.current_omni_platform: not an accelerator, no
    Inductor (the fast AR's forward runs eagerly, uncompiled)."""

    def is_npu(self) -> bool:
        return False

    is_xpu = is_cuda = is_rocm = is_musa = is_out_of_tree = is_npu

    def supports_torch_inductor(self) -> bool:
        return False


class Greedy:
    """A FrameSampler stand-in: argmax for the main token and every code."""

    def main(self, logits, config) -> int:
        return int(torch.argmax(logits))

    def code(self, logits) -> int:
        return int(torch.argmax(logits))


@pytest.fixture(scope="module")
def pair():
    from vllm.config import VllmConfig

    # vLLM's parallel state is process-wide: set up for this module (or reused) and released
    # when the module ends or its setup fails (tritontts.testing.engine).
    from tritontts.testing.engine import vllm_parallel_state

    with vllm_parallel_state(VllmConfig()) as vllm_config:
        yield _pair(vllm_config)


def _pair(vllm_config):
    from vllm.config.vllm import set_current_vllm_config

    from tritontts.upstream import vllm_omni_module

    from tritontts.families.fish_s2_pro.random_checkpoint import random_state

    config = parse_config_dict(CONFIG)
    ours = FishDualAR(config)
    state = random_state(config, torch.Generator().manual_seed(0), torch.float32)
    ours.load_state_dict(state)
    package = "vllm_omni.model_executor.models.fish_speech."
    with vllm_omni_module(package + "fish_speech_fast_ar", {"vllm_omni.platforms": {"current_omni_platform":
                                                                                   _EagerCpuPlatform()}}) as m:
        import vllm_omni.model_executor.models.fish_speech.configuration_fish_speech as configuration

        f, t = CONFIG["audio_decoder_config"], CONFIG["text_config"]
        fast_config = configuration.FishSpeechFastARConfig(
            vocab_size=CODEBOOK, num_codebooks=10, dim=f["dim"], n_head=f["n_head"], n_local_heads=f["n_local_heads"],
            head_dim=f["head_dim"], n_layer=f["n_layer"], intermediate_size=f["intermediate_size"], max_seq_len=11,
            text_dim=f["dim"], rope_base=f["rope_base"], rms_norm_eps=f["norm_eps"])
        slow_config = configuration.FishSpeechSlowARConfig(
            vocab_size=t["vocab_size"], dim=t["dim"], n_head=t["n_head"], n_local_heads=t["n_local_heads"],
            head_dim=t["head_dim"], n_layer=t["n_layer"], intermediate_size=t["intermediate_size"],
            codebook_size=CODEBOOK, num_codebooks=10, semantic_begin_id=SEMANTIC_BEGIN,
            semantic_end_id=SEMANTIC_BEGIN + CODEBOOK - 1)
        with set_current_vllm_config(vllm_config):
            ref = m.FishSpeechFastAR(vllm_config=vllm_config, config=fast_config, slow_ar_config=slow_config,
                                     prefix="fast_ar")
    # The checkpoint's audio_decoder.* under vLLM-Omni's fast AR names (its own remap).
    names = {"attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj",
             "feed_forward.w2": "mlp.down_proj", "feed_forward.w3": "mlp.up_proj",
             "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    q_size, kv_size = f["n_head"] * f["head_dim"], f["n_local_heads"] * f["head_dim"]
    weights = []
    for name, tensor in state.items():
        if not name.startswith("audio_decoder.") or name.endswith("codebook_embeddings.weight"):
            continue
        rest = name[len("audio_decoder."):]
        if rest.startswith("layers."):
            _, index, leaf = rest.split(".", 2)
            module = leaf.rsplit(".", 1)[0]
            prefix = f"model.layers.{index}."
            if module == "attention.wqkv":
                q, k, v = tensor.split([q_size, kv_size, kv_size])
                weights += [(prefix + "self_attn.q_proj.weight", q), (prefix + "self_attn.k_proj.weight", k),
                            (prefix + "self_attn.v_proj.weight", v)]
            else:
                weights.append((prefix + names[module] + ".weight", tensor))
        else:
            weights.append(({"embeddings.weight": "fast_embeddings.weight", "output.weight": "fast_output.weight",
                             "norm.weight": "fast_norm.weight"}[rest], tensor))
    with set_current_vllm_config(vllm_config):
        loaded = ref.load_weights(iter(weights))
        for module in ref.modules():
            method = getattr(module, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(module)
    assert {n for n, _ in ref.named_parameters()} <= loaded | {n for n, _ in ref.named_parameters() if "rotary" in n}
    return config, ours.eval(), ref.eval()


def test_residual_codes_match_vllm_omni_greedy(pair):
    config, ours, ref = pair
    gen = torch.Generator().manual_seed(3)
    rows = 4
    hidden = torch.randn(rows, config.slow.dim, generator=gen)
    main = SEMANTIC_BEGIN + torch.randint(0, CODEBOOK, (rows,), generator=gen)
    logits = torch.full((rows, config.slow.vocab_size), float("-inf"))
    logits[torch.arange(rows), main] = 0.0          # the main tokens, as drawn
    with torch.no_grad():
        want = ref(hidden, main, do_sample=False)
        for layer in ours.audio_decoder.layers:
            layer.attention.rope_table_dtype = None         # vLLM-Omni's fp32 tables
        got = decode_frames(ours.audio_decoder, config, hidden, logits, [Greedy()] * rows)
        for layer in ours.audio_decoder.layers:
            layer.attention.rope_table_dtype = torch.bfloat16
        upstream = decode_frames(ours.audio_decoder, config, hidden, logits, [Greedy()] * rows)
        # Negative control: one fast-AR weight perturbed changes the codes.
        weight = ours.audio_decoder.layers[0].feed_forward.w2.weight
        saved = weight.clone()
        weight.add_(0.5 * torch.randn(weight.shape, generator=gen))
        perturbed = decode_frames(ours.audio_decoder, config, hidden, logits, [Greedy()] * rows)
        weight.copy_(saved)
    print(f"codes (ours, fp32 tables) {got[:, 1:].tolist()}\nvLLM-Omni {want.tolist()}\n"
          f"with upstream's bf16 tables, codes that differ: {int((upstream != got).sum())} of {got[:, 1:].numel()}")
    assert torch.equal(got[:, 1:], want)
    assert torch.equal(got[:, 0], main)
    assert not torch.equal(perturbed[:, 2:], want[:, 1:])
