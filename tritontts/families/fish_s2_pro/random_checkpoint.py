"""Random-weight Fish Speech S2 Pro checkpoints in the released layout
(tritontts.families.fish_s2_pro.checkpoint): config.json (fish_qwen3_omni), model.safetensors
(text_model.model.*, audio_decoder.*), tokenizer.json (a byte-level BPE with Fish's special
tokens: <|im_start|>, <|im_end|>, <|voice|>, <|speaker:N|>, <|semantic:N|>, ...) and codec.pth
(the codec's state dict); `tiny` adds codec_config.json (its codec is not the released one's
size). `tiny` runs in seconds (tests); `released` has the released sizes (the Qwen3-4B-shaped
slow AR, the 4-layer fast AR, the 391 M-parameter codec; vocabulary 155776 with the special
tokens at their released ids where known: INFERRED marks the rest) for measuring speed.

  python -m tritontts.families.fish_s2_pro.random_checkpoint OUT [--size released] [--seed N]
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...weights.random_weights import random_checkpoint_cli, save_safetensors
from .checkpoint import CODEC_CONFIG_FILE, CODEC_FILE, CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE

_CORPUS = ("system\nconvert the provided text to speech reference to the following:\n\nText:\n"
           "user\nHello there, how are you today? The birch canoe slid on the smooth planks. "
           "Glue the sheet to the dark blue background. It's easy to tell the depth of a well. "
           "assistant\nSpeech: one more sentence for speech synthesis, 0123456789!")
# Named specials in id order after <|endoftext|> (Qwen's 151643 at released size). Released
# ids: <|im_start|> 151644, <|im_end|> 151645, pad 151669, audio pad 151677; INFERRED: where
# <|voice|>, <|audio_start|>, <|audio_end|> and the speaker tags sit among 151646-151676.
NAMED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|voice|>", "<|audio_start|>", "<|audio_end|>",
         *(f"<|speaker:{i}|>" for i in range(5)))
PAD, AUDIO_PAD = "<|pad|>", "<|audio_pad|>"
# The tiny BPE's size: the corpus has merges enough to fill it (the released size pads it).
BPE_VOCAB = 400

LAYER = {"attention_qkv_bias": False, "attention_o_bias": False, "use_moe": False}
SIZES = {
    # head_dim 32: the smallest vLLM's CPU attention takes.
    "tiny": dict(dim=64, n_head=2, n_local_heads=1, head_dim=32, intermediate_size=128, n_layer=2,
                 fast_layers=2, codebook=64, max_seq_len=4096, base_vocab=None, pad_offset=None),
    "released": dict(dim=2560, n_head=32, n_local_heads=8, head_dim=128, intermediate_size=9728, n_layer=36,
                     fast_layers=4, codebook=4096, max_seq_len=32768, base_vocab=151643, pad_offset=26),
}
# The tiny codec: small widths, the released rates (2048 samples per frame at 44.1 kHz, so
# served audio has real durations) and layer plan (fish_s2_pro/codec.py).
TINY_CODEC = {"encoder_dim": 4, "encoder_rates": [2, 4, 8, 8], "encoder_transformer_layers": [0, 0, 0, 1],
              "encoder_head_dim": 16, "latent_dim": 32, "semantic_codebook_size": 64, "n_codebooks": 9,
              "codebook_size": 16, "codebook_dim": 4, "downsample_factors": [2, 2], "quantizer_layers": 2,
              "quantizer_heads": 2, "quantizer_head_dim": 16, "quantizer_ffn": 64, "quantizer_window": 16,
              "decoder_dim": 64, "decoder_rates": [8, 8, 4, 2]}


def special_ids(size: str, base: int) -> dict[str, int]:
    """The special tokens' ids, in order after a BPE part of `base` entries."""
    s = SIZES[size]
    names = list(NAMED)
    if s["pad_offset"] is not None:      # released: fill up to the known ids
        names += [f"<|reserved_{i}|>" for i in range(len(names), s["pad_offset"])]
    names.append(PAD)
    if s["pad_offset"] is not None:
        names += [f"<|reserved_{i}|>" for i in range(len(names), s["pad_offset"] + 8)]
    names.append(AUDIO_PAD)
    names += [f"<|semantic:{i}|>" for i in range(s["codebook"])]
    return {name: base + k for k, name in enumerate(names)}


def write_tokenizer(out: Path, size: str) -> dict[str, int]:
    """tokenizer.json: a BPE trained on a small corpus with Qwen2's split, then the special
    tokens (ids in the order they follow the vocabulary; at the released size the BPE part is
    padded to Qwen's 151643 entries with tokens no text reaches). Returns the ids by token."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from ...weights.random_weights import train_byte_level_bpe

    s = SIZES[size]
    data = json.loads(train_byte_level_bpe([_CORPUS], PRETOKENIZE_REGEX, BPE_VOCAB).to_str())
    vocab = data["model"]["vocab"]
    base = s["base_vocab"] or len(vocab)
    for k in range(len(vocab), base):
        vocab[f"<|unused_bpe_{k}|>"] = k
    ids = special_ids(size, base)
    data["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for t, i in ids.items()]
    (out / TOKENIZER_FILE).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return ids


def config_dict(size: str, ids: dict[str, int]) -> dict:
    s = SIZES[size]
    vocab = max(ids.values()) + 1
    vocab += -vocab % 8 if size == "released" else 0          # 155774 -> 155776, as released
    common = {"dim": s["dim"], "n_head": s["n_head"], "n_local_heads": s["n_local_heads"], "head_dim": s["head_dim"],
              "intermediate_size": s["intermediate_size"], "rope_base": 1000000.0, "norm_eps": 1e-6, **LAYER}
    return {
        "model_type": "fish_qwen3_omni", "dtype": "float32" if size == "tiny" else "bfloat16",
        "semantic_start_token_id": ids["<|semantic:0|>"],
        "semantic_end_token_id": ids[f"<|semantic:{s['codebook'] - 1}|>"],
        "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids[PAD], "audio_pad_token_id": ids[AUDIO_PAD],
        "text_config": {**common, "model_type": "fish_qwen3", "n_layer": s["n_layer"], "vocab_size": vocab,
                        "attention_qk_norm": True, "tie_word_embeddings": True, "max_seq_len": s["max_seq_len"]},
        "audio_decoder_config": {**common, "model_type": "fish_qwen3_audio_decoder", "n_layer": s["fast_layers"],
                                 "vocab_size": s["codebook"], "num_codebooks": 10, "attention_qk_norm": False,
                                 "max_seq_len": 11, "text_dim": s["dim"], "tie_word_embeddings": False},
    }


def random_state(config, generator: torch.Generator, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors in `dtype`, each cast as it is made: norm scales
    near 1, weights at unit fan-in scale (logits of a few units), embeddings unit normal."""
    from .dual_ar import FishDualAR

    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in FishDualAR(config).state_dict().items()}
    state = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * noise
        elif name.endswith("embeddings.weight"):
            value = noise
        else:
            value = noise * shape[-1] ** -0.5
        state[name] = value.to(dtype)
    return state


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    from .checkpoint import parse_config_dict
    from .codec import FishCodecConfig, random_codec_state

    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out, size)
    data = config_dict(size, ids)
    (out / CONFIG_FILE).write_text(json.dumps(data, indent=2), encoding="utf-8")
    # The released weights are bfloat16; tiny ones stay float32 so parity tests are exact.
    dtype = torch.float32 if size == "tiny" else torch.bfloat16
    generator = torch.Generator().manual_seed(seed)
    save_safetensors(random_state(parse_config_dict(data), generator, dtype), out / WEIGHTS_FILE, dtype)
    if size == "tiny":
        (out / CODEC_CONFIG_FILE).write_text(json.dumps(TINY_CODEC, indent=2), encoding="utf-8")
        codec = FishCodecConfig.from_dict(TINY_CODEC)
    else:
        codec = FishCodecConfig()
    torch.save(random_codec_state(codec, generator), out / CODEC_FILE)
    return out


def main(argv=None):
    random_checkpoint_cli(__doc__, SIZES, write_random_checkpoint, argv)


if __name__ == "__main__":
    main()
