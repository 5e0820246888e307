"""Write a random-weight CosyVoice3 checkpoint in the released file layout.

Same files, same key names, same tokenizer special tokens and ONNX input/output names as
Fun-CosyVoice3-0.5B-2512. `tiny` sizes run in seconds on a CPU (the tests); `full` has the
released network sizes (Qwen2-0.5B talker, 22-layer DiT, 512-channel HiFT) for measuring
speed. `python -m tritontts.families.cosyvoice3.random_checkpoint OUT_DIR [--size released]` writes one by hand.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...nn.speaker import write_random_campplus
from ...weights.random_weights import random_checkpoint_cli
from .checkpoint import TEXT_MODEL_DIR
from .talker import SPEECH_VOCAB

# Hidden size / heads keep head_dim 64: vLLM's CPU attention rejects smaller heads.
_QWEN2_COMMON = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     hidden_act="silu")
SIZES = {
    "tiny": dict(qwen2=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1),
                 text_vocab=None, dit_dim=64, dit_depth=2, dit_heads=2, lookahead_channels=64,
                 hift_channels=32),
    # Fun-CosyVoice3-0.5B-2512 as released (Qwen2-0.5B body, vocabulary of 151936 rows).
    "released": dict(qwen2=dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                            num_attention_heads=14, num_key_value_heads=2),
                 text_vocab=151936, dit_dim=1024, dit_depth=22, dit_heads=16,
                 lookahead_channels=1024, hift_channels=512),
}
# cosyvoice3.yaml as released (same keys, same tags), network sizes filled in per SIZES.
YAML_TEMPLATE = """\
__set_seed1: !apply:random.seed [1986]
sample_rate: 24000
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {lookahead_channels}
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dit_dim}
            depth: {dit_depth}
            heads: {dit_heads}
            dim_head: 64
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: {hift_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {hift_channels}
"""
_CORPUS = ("The quick brown fox jumps over the lazy dog. You are a helpful assistant. "
           "Speech synthesis turns text into sound, one token at a time. 0123456789 "
           "Hello there, how are you today? I am fine, thank you, and you?")


def _write_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([_CORPUS] * 4, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(str(out))
    return len(fast)


def _write_speech_tokenizer(path: Path, rng: np.random.Generator) -> None:
    """whisper log-mel feats [1, 128, T] (100 Hz) -> indices [1, T/4] in [0, 6561) (25 Hz)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((128, 1)).astype(np.float32), "w")
    scale = numpy_helper.from_array(np.array([997.0], np.float32), "scale")
    vocab = numpy_helper.from_array(np.array([6561], np.int64), "vocab")
    nodes = [
        helper.make_node("Unsqueeze", ["feats", "axis1"], ["f4"]),            # [1,1,128,T]
        helper.make_node("AveragePool", ["f4"], ["pooled"], kernel_shape=[1, 4], strides=[1, 4]),
        helper.make_node("Squeeze", ["pooled", "axis1"], ["p3"]),             # [1,128,T/4]
        helper.make_node("Transpose", ["p3"], ["pt"], perm=[0, 2, 1]),        # [1,T/4,128]
        helper.make_node("MatMul", ["pt", "w"], ["proj"]),                    # [1,T/4,1]
        helper.make_node("Squeeze", ["proj", "axis2"], ["p"]),
        helper.make_node("Mul", ["p", "scale"], ["ps"]),
        helper.make_node("Abs", ["ps"], ["pa"]),
        helper.make_node("Cast", ["pa"], ["pi"], to=TensorProto.INT64),
        helper.make_node("Mod", ["pi", "vocab"], ["indices64"]),
        helper.make_node("Cast", ["indices64"], ["indices"], to=TensorProto.INT32),
        # feats_length is part of the real signature; the tiny graph reads it for shape only.
        helper.make_node("Identity", ["feats_length"], ["feats_length_out"]),
    ]
    axes = [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
            numpy_helper.from_array(np.array([2], np.int64), "axis2")]
    graph = helper.make_graph(
        nodes, "speech_tokenizer_v3_tiny",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("indices", TensorProto.INT32, [1, "N"]),
         helper.make_tensor_value_info("feats_length_out", TensorProto.INT32, [1])],
        [w, scale, vocab, *axes])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def write_random_llm(out: Path, size: str = "tiny", seed: int = 0) -> None:
    """CosyVoice-BlankEN/ (config + tokenizer) and llm.pt with upstream key names."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sizes = SIZES[size]
    text_dir = out / TEXT_MODEL_DIR
    text_dir.mkdir(parents=True, exist_ok=True)
    n_tokens = _write_tokenizer(text_dir)
    # Room for CosyVoice3's 283 added special tokens, rounded up like Qwen's padded vocab.
    text_vocab = sizes["text_vocab"] or ((n_tokens + 300) // 64 + 1) * 64
    config = Qwen2Config(vocab_size=text_vocab, tie_word_embeddings=True,
                         **_QWEN2_COMMON, **sizes["qwen2"])
    config.save_pretrained(str(text_dir))
    torch.manual_seed(seed)
    qwen = Qwen2ForCausalLM(config)
    hidden = sizes["qwen2"]["hidden_size"]
    state = {f"llm.model.{k}": v for k, v in qwen.state_dict().items()}
    state["speech_embedding.weight"] = torch.randn(SPEECH_VOCAB, hidden) * 0.02
    state["llm_decoder.weight"] = torch.randn(SPEECH_VOCAB, hidden) * 0.02
    torch.save(state, out / "llm.pt")


def write_random_flow_and_hift(out: Path, seed: int = 0) -> None:
    """flow.pt and hift.pt from our own modules built from the written yaml (upstream key names)."""
    from ...weights.hyperpyyaml import load_hyperpyyaml
    from .flow import build_flow
    from ...nn.hift import HiFTGenerator

    config = load_hyperpyyaml(out / "cosyvoice3.yaml", {"qwen_pretrain_path": ""})
    torch.manual_seed(seed + 1)
    torch.save(build_flow(config["flow"]).state_dict(), out / "flow.pt")
    torch.manual_seed(seed + 2)
    torch.save(HiFTGenerator.from_config(config["hift"]).state_dict(), out / "hift.pt")


def write_config(out: Path, size: str = "tiny") -> Path:
    """cosyvoice3.yaml with the network sizes of `size`; returns its path."""
    sizes = SIZES[size]
    path = out / "cosyvoice3.yaml"
    path.write_text(YAML_TEMPLATE.format(
        hidden=sizes["qwen2"]["hidden_size"],
        **{k: v for k, v in sizes.items() if k.startswith(("dit", "lookahead", "hift"))}))
    return path


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    write_config(out, size)
    write_random_llm(out, size, seed)
    write_random_flow_and_hift(out, seed)
    write_random_campplus(out / "campplus.onnx", rng)
    _write_speech_tokenizer(out / "speech_tokenizer_v3.onnx", rng)
    return out


def main(argv=None):
    random_checkpoint_cli(__doc__, SIZES, write_random_checkpoint, argv)


if __name__ == "__main__":
    main()
