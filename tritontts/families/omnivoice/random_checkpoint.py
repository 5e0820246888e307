"""Write a random-weight OmniVoice checkpoint in the released file layout (checkpoint.py).

Same files, config fields and tensor names as k2-fsa/OmniVoice: config.json (omnivoice,
llm_config a Qwen3 config), model.safetensors (llm.*, audio_embeddings, audio_heads and the
codebook_layer_offsets buffer, as the reference's save_pretrained writes it), a Qwen2-style
text tokenizer with OmniVoice's control tokens after its vocabulary, and audio_tokenizer/
(the higgs-audio v2 codec, tritontts/nn/higgs_codec/). `tiny` runs in seconds on a CPU
(tests); `released` has the released sizes (Qwen3-0.6B backbone, the released codec), for
measuring speed.

`python -m tritontts.families.omnivoice.random_checkpoint OUT [--size released]` writes one.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...weights.random_weights import (
    randomize, save_safetensors, write_qwen2_tokenizer, random_checkpoint_cli)
from .checkpoint import CODEC_DIR, CONFIG_FILE, CONTROL_TOKENS, WEIGHTS_FILE, parse_config

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>") + CONTROL_TOKENS
_CORPUS = ("<|lang_start|>en<|lang_end|><|instruct_start|>female, low pitch, british accent"
           "<|instruct_end|><|text_start|>The quick brown fox jumps over the lazy dog.<|text_end|>"
           "<|denoise|><|lang_start|>None<|lang_end|><|instruct_start|>None<|instruct_end|>"
           "Hello there, how are you today? I am fine, thank you, and you? 0123456789 [laughter] "
           "Speech synthesis turns text into sound, one frame at a time. 你好，世界。男，四川话")

BACKBONES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32),
    # Qwen3-0.6B, as the released llm_config has it.
    "released": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151676),
}


def config_dict(size: str, text_vocab: int = 1152) -> dict:
    llm = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": text_vocab,
           "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
           "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
           "use_sliding_window": False, "dtype": "float32"}
    llm.update(BACKBONES[size])
    return {"model_type": "omnivoice", "architectures": ["OmniVoice"], "audio_vocab_size": 1025,
            "audio_mask_id": 1024, "num_audio_codebook": 8,
            "audio_codebook_weights": [8, 8, 6, 6, 4, 4, 2, 2], "llm_config": llm,
            "dtype": "float32" if size == "tiny" else "bfloat16"}


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    from ...nn.higgs_codec import write_random_codec
    from .generator import OmniVoiceGenerator

    if size not in BACKBONES:
        raise ValueError(f"size must be one of {sorted(BACKBONES)}, got {size!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_qwen2_tokenizer(out, SPECIAL_TOKENS, _CORPUS, eos_token="<|endoftext|>")
    # The text table also looks up every audio position's first code (the reference embeds
    # row 0 of all positions, then keeps the audio embedding there), so it outgrows 1025.
    config = config_dict(size, max(max(ids.values()) + 1, 1152))
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    model = OmniVoiceGenerator(parse_config(config, out / CONFIG_FILE))
    state = randomize(model, torch.Generator().manual_seed(seed))
    state["codebook_layer_offsets"] = model.codebook_offsets.clone()
    # The released weights are bfloat16; tiny ones stay float32 so parity tests are exact.
    save_safetensors(state, out / WEIGHTS_FILE, torch.float32 if size == "tiny" else torch.bfloat16)
    write_random_codec(out / CODEC_DIR, size=size, seed=seed + 1)
    return out


def main(argv=None):
    random_checkpoint_cli(__doc__, BACKBONES, write_random_checkpoint, argv)


if __name__ == "__main__":
    main()
