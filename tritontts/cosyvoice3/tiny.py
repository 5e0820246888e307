"""Write a tiny random-weight CosyVoice3 checkpoint in the released file layout.

Same files, same key names, same tokenizer special tokens and ONNX input/output names as
Fun-CosyVoice3-0.5B-2512, at sizes that run in seconds on a CPU. Used by the tests;
`python -m tritontts.cosyvoice3.tiny OUT_DIR` writes one by hand.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from .checkpoint import TEXT_MODEL_DIR
from .talker import SPEECH_VOCAB

# Hidden size / heads keep head_dim 64: vLLM's CPU attention rejects smaller heads.
TINY_QWEN2 = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu")
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


def _write_campplus(path: Path, rng: np.random.Generator) -> None:
    """fbank [B, T, 80] -> 192-d embedding: mean over time, then a random projection."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((80, 192)).astype(np.float32) * 0.1, "w")
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),
         helper.make_node("MatMul", ["pooled", "w"], ["output"])],
        "campplus_tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["B", "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", 192])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


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


def write_tiny_llm(out: Path, seed: int = 0) -> None:
    """CosyVoice-BlankEN/ (config + tokenizer) and llm.pt with upstream key names."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    text_dir = out / TEXT_MODEL_DIR
    text_dir.mkdir(parents=True, exist_ok=True)
    n_tokens = _write_tokenizer(text_dir)
    # Room for CosyVoice3's 283 added special tokens, rounded up like Qwen's padded vocab.
    text_vocab = ((n_tokens + 300) // 64 + 1) * 64
    config = Qwen2Config(vocab_size=text_vocab, tie_word_embeddings=True, **TINY_QWEN2)
    config.save_pretrained(str(text_dir))
    torch.manual_seed(seed)
    qwen = Qwen2ForCausalLM(config)
    hidden = TINY_QWEN2["hidden_size"]
    state = {f"llm.model.{k}": v for k, v in qwen.state_dict().items()}
    state["speech_embedding.weight"] = torch.randn(SPEECH_VOCAB, hidden) * 0.02
    state["llm_decoder.weight"] = torch.randn(SPEECH_VOCAB, hidden) * 0.02
    torch.save(state, out / "llm.pt")


def write_tiny_checkpoint(out: str | Path, seed: int = 0) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    write_tiny_llm(out, seed)
    _write_campplus(out / "campplus.onnx", rng)
    _write_speech_tokenizer(out / "speech_tokenizer_v3.onnx", rng)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_tiny_checkpoint(args.out, args.seed))


if __name__ == "__main__":
    main()
