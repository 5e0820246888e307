"""Write a random-weight higgs-audio v2 checkpoint in the transformers layout
(checkpoint.py): config.json (higgs_audio_v2), generation_config.json, model.safetensors
with transformers' tensor names (text_lm_head included, as the converted release keeps it),
a Llama 3 style tokenizer.json with higgs' audio tokens, and audio_tokenizer/ (the codec,
tritontts/nn/higgs_codec/). `tiny` runs in seconds on a CPU (tests); `released` has the
released sizes (Llama-3.2-3B, vocab 128256, the released codec) for measuring speed.

  python -m tritontts.families.higgs_audio_v2.random_checkpoint OUT [--size released] [--seed N]
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...weights.random_weights import save_safetensors, random_checkpoint_cli
from .checkpoint import (AUDIO_DELAY, AUDIO_EOS, AUDIO_OUT, AUDIO_OUT_BOS, BEGIN_OF_TEXT, CODEC_DIR,
                         CONFIG_FILE, END_HEADER, END_OF_TURN, GENERATION_FILE, LAYER_TENSORS,
                         START_HEADER, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE)

# Llama 3's special tokens the higgs tokenizer keeps, by their released ids (higgs renames
# some reserved ones: 128011-128013 and 128015-128016 are its audio tokens).
SPECIAL_IDS = {BEGIN_OF_TEXT: 128000, "<|end_of_text|>": 128001, START_HEADER: 128006,
               END_HEADER: 128007, "<|eom_id|>": 128008, END_OF_TURN: 128009,
               "<|audio_bos|>": 128011, AUDIO_EOS: 128012, AUDIO_OUT_BOS: 128013,
               AUDIO_DELAY: 128014, "<|AUDIO|>": 128015, AUDIO_OUT: 128016}
# Llama 3's pre-tokenizer split (contractions, letters, 1-3 digits, punctuation, spaces).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CORPUS = ("system\n\nGenerate audio following instruction. user\n\nHello there, how are you today? "
           "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. "
           "assistant\n\nThis is the reference voice. One more. 0123456789, speech synthesis!")

SIZES = {
    # head_dim 32: the smallest vLLM's CPU attention takes.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, max_position_embeddings=2048),
    # Llama-3.2-3B, as the released config has it.
    "released": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                     num_attention_heads=24, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=2048, vocab_size=128256),
}
NUM_CODEBOOKS, CODEBOOK_SIZE = 8, 1026


def write_llama3_tokenizer(out: Path, size: str) -> dict[str, int]:
    """tokenizer.json (byte-level BPE trained on a small corpus, Llama 3's split; at the
    released size the special tokens keep their released ids) and tokenizer_config.json.
    Returns the special tokens' ids."""
    from ...weights.random_weights import train_byte_level_bpe

    data = json.loads(train_byte_level_bpe([_CORPUS], LLAMA3_SPLIT, 480).to_str())
    if size == "released":
        # Llama 3's layout: 128000 BPE entries (ours padded with entries no text reaches),
        # then its 256 special tokens, higgs' among them at their released ids; the rest
        # keep reserved names. Added tokens must follow the vocabulary without gaps (the
        # tokenizer numbers them in order).
        vocab = data["model"]["vocab"]
        for k in range(len(vocab), 128000):
            vocab[f"<|unused_bpe_{k}|>"] = k
        by_id = {i: t for t, i in SPECIAL_IDS.items()}
        names = [by_id.get(i, f"<|reserved_special_token_{100 + i - 128000}|>") for i in range(128000, 128256)]
        ids = {t: 128000 + k for k, t in enumerate(names)}
    else:
        base = len(data["model"]["vocab"])
        ids = {token: base + i for i, token in enumerate(sorted(SPECIAL_IDS, key=SPECIAL_IDS.get))}
    data["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}
                            for t, i in sorted(ids.items(), key=lambda kv: kv[1])]
    (out / TOKENIZER_FILE).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps({
        "bos_token": BEGIN_OF_TEXT, "eos_token": END_OF_TURN, "pad_token": END_OF_TURN,
        "clean_up_tokenization_spaces": True, "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for t, i in ids.items()},
    }, indent=2), encoding="utf-8")
    return ids


def config_dict(size: str, ids: dict[str, int]) -> dict:
    shape = dict(SIZES[size])
    vocab = shape.pop("vocab_size", max(ids.values()) + 1)
    return {
        "model_type": "higgs_audio_v2", "architectures": ["HiggsAudioV2ForConditionalGeneration"],
        "vocab_size": vocab, **shape, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                            "low_freq_factor": 0.125, "high_freq_factor": 0.5,
                            "original_max_position_embeddings": 1024},
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "tie_word_embeddings": False, "pretraining_tp": 1, "initializer_range": 0.02,
        "use_cache": True, "bos_token_id": ids[BEGIN_OF_TEXT], "eos_token_id": ids[END_OF_TURN],
        "pad_token_id": ids["<|end_of_text|>"], "num_codebooks": NUM_CODEBOOKS,
        "codebook_size": CODEBOOK_SIZE, "audio_token_id": ids[AUDIO_OUT],
        "audio_bos_token_id": ids[AUDIO_OUT_BOS], "audio_delay_token_id": ids[AUDIO_DELAY],
        "audio_stream_bos_id": 1024, "audio_stream_eos_id": 1025,
        "dtype": "float32" if size == "tiny" else "bfloat16",
    }


def random_state(config: dict, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of transformers' HiggsAudioV2ForConditionalGeneration(use_text_head=True),
    in `dtype`: norm scales near 1, weights small (scaled so activations stay O(1) through
    the stack). Each is cast as it is made: the released size (3.2 B values) then never
    holds all of them in float32 at once."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    shapes = {"self_attn.q_proj.weight": (heads * hd, h), "self_attn.k_proj.weight": (kv * hd, h),
              "self_attn.v_proj.weight": (kv * hd, h), "self_attn.o_proj.weight": (h, heads * hd),
              "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
              "mlp.down_proj.weight": (h, inter), "audio_mlp.gate_proj.weight": (inter, h),
              "audio_mlp.up_proj.weight": (inter, h), "audio_mlp.down_proj.weight": (h, inter)}
    audio_rows = config["num_codebooks"] * config["codebook_size"]

    def weight(*shape):
        return (torch.randn(shape, generator=generator) * (shape[-1] ** -0.5)).to(dtype)

    def norm():
        return (1.0 + 0.1 * torch.randn(h, generator=generator)).to(dtype)

    def table(rows):
        return torch.randn(rows, h, generator=generator).to(dtype)

    state = {"model.embed_tokens.weight": table(config["vocab_size"])}
    for i in range(layers):
        for name in LAYER_TENSORS:
            key = f"model.layers.{i}.{name}"
            state[key] = norm() if name.endswith("layernorm.weight") else weight(*shapes[name])
    state["model.norm.weight"] = norm()
    state["model.embed_audio_tokens.embed_audio_tokens.weight"] = table(audio_rows)
    # Logits of a few units, so that sampling is neither uniform nor one-hot; the stream
    # markers' rows (bos 1024, eos 1025 of each codebook) near zero, so that a stream rarely
    # ends by chance, as in a trained model (an early end made test audio too short).
    head = 3.0 * weight(audio_rows, h)
    size = config["codebook_size"]
    for k in range(config["num_codebooks"]):
        head[k * size + 1024:k * size + 1026] *= 0.05
    state["audio_lm_head.weight"] = head
    state["text_lm_head.weight"] = weight(config["vocab_size"], h)
    return state


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny",
                            sampling: dict | None = None) -> Path:
    """`sampling` adds to (or replaces) generation_config.json's fields, e.g. greedy
    decoding for parity tests."""
    from ...nn.higgs_codec import write_random_codec

    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_llama3_tokenizer(out, size)
    config = config_dict(size, ids)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2), encoding="utf-8")
    # What the converted release's file holds (token ids, repetition-aware sampling).
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                  "pad_token_id": config["pad_token_id"], "ras_win_len": 7,
                  "ras_win_max_num_repeat": 2, **(sampling or {})}
    (out / GENERATION_FILE).write_text(json.dumps(generation, indent=2), encoding="utf-8")
    # The released weights are bfloat16; tiny ones stay float32 so parity tests are exact.
    dtype = torch.float32 if size == "tiny" else torch.bfloat16
    save_safetensors(random_state(config, torch.Generator().manual_seed(seed), dtype), out / WEIGHTS_FILE, dtype)
    write_random_codec(out / CODEC_DIR, size=size, seed=seed + 1)
    return out


def main(argv=None):
    random_checkpoint_cli(__doc__, SIZES, write_random_checkpoint, argv)


if __name__ == "__main__":
    main()
