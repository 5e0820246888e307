"""Write a random-weight VoxCPM2 checkpoint in the released layout (checkpoint.py):
config.json (VoxCPMConfig), model.safetensors under upstream's VoxCPM2Model parameter names
(base_lm.*, residual_lm.*, feat_encoder.*, feat_decoder.*, fsq_layer.*, the projections and
the stop head), audiovae.safetensors (audio_vae.write_random_audio_vae) and a small Llama
style tokenizer (tokenizer.json + tokenizer_config.json). `tiny` runs in seconds on a CPU
(tests); `released` has the released model's sizes, for measuring speed.

  python -m tritontts.families.voxcpm2.random_checkpoint OUT [--size released] [--seed N]
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...weights.random_weights import random_checkpoint_cli, save_safetensors
from .audio_vae import RELEASED_CONFIG, TINY_RELEASED_RATES_CONFIG, write_random_audio_vae
from .checkpoint import VoxCPM2Config, parse_config
from .talker import VoxCPM2Talker

# Upstream's VoxCPM2Model hard-codes these token ids (audio start / end, reference audio
# start / end), so the tokenizer keeps them there.
AUDIO_TOKENS = {101: "<|audio_start|>", 102: "<|audio_end|>",
                103: "<|ref_audio_start|>", 104: "<|ref_audio_end|>"}
_CORPUS = ("Hello there, how are you today? The birch canoe slid on the smooth planks. "
           "Glue the sheet to the dark blue background. This is the reference voice. "
           "One more sentence for speech synthesis: 0123456789! "
           # CJK words become multi-character tokens: the tokenizer splits those.
           "你好世界，今天天气很好。我们一起去公园散步吧。")

STOP_SHIFT = 1.0

SIZES = {
    # head_dim 32 everywhere: the LM's LongRoPE factor lists serve the local modules too.
    "tiny": dict(
        lm=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, original_max_position=2048),
        residual_lm_num_layers=2, fsq_latent_dim=32,
        encoder=dict(hidden_dim=64, ffn_dim=128, num_heads=2, num_layers=2),
        dit=dict(hidden_dim=64, ffn_dim=128, num_heads=2, num_layers=2),
        audio_vae=TINY_RELEASED_RATES_CONFIG, max_length=1024),
    # The released sizes as far as they are known here; values marked (inferred) are
    # assumptions, not read from the released config.json.
    "released": dict(
        lm=dict(hidden_size=2048, intermediate_size=6144,           # (inferred)
                num_hidden_layers=28, num_attention_heads=16,       # (inferred)
                num_key_value_heads=2, max_position_embeddings=32768,   # (inferred)
                original_max_position=32768, vocab_size=73448),     # (inferred)
        residual_lm_num_layers=8, fsq_latent_dim=512,               # (inferred)
        # Head width 128 like the LM's (one factor list for all): 8 heads of 128 (inferred).
        encoder=dict(hidden_dim=1024, ffn_dim=4096, num_heads=8, num_layers=12),   # (inferred)
        dit=dict(hidden_dim=1024, ffn_dim=4096, num_heads=8, num_layers=12),       # (inferred)
        audio_vae=RELEASED_CONFIG, max_length=8192),
}


def write_llama_tokenizer(out: Path, size: str) -> int:
    """tokenizer.json (a byte-fallback BPE over "▁"-marked words, as Llama's; <unk> <s> </s>
    at 0-2, the audio tokens at 101-104, reserved tokens between) and tokenizer_config.json.
    Returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<unk>", "<s>", "</s>"]
    specials += [f"<|reserved_{i}|>" for i in range(len(specials), min(AUDIO_TOKENS))]
    specials += [AUDIO_TOKENS[i] for i in sorted(AUDIO_TOKENS)]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Metaspace(replacement="▁", prepend_scheme="first")])
    tok.train_from_iterator([_CORPUS] * 16, trainers.BpeTrainer(
        vocab_size=600, show_progress=False, special_tokens=specials + byte_tokens))
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    assert all(vocab[t] == i for i, t in enumerate(specials)), "special tokens out of place"
    # Only the control tokens are added tokens; byte tokens stay plain vocabulary entries.
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in specials]
    for t in data["added_tokens"]:
        t["special"] = True
    if size == "released":
        # Pad with entries no text reaches, up to the released vocabulary size.
        for k in range(len(vocab), SIZES[size]["lm"]["vocab_size"]):
            vocab[f"<|unused_{k}|>"] = k
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": None, "add_bos_token": True, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "legacy": False, "model_max_length": 32768,
        "added_tokens_decoder": {str(t["id"]): {"content": t["content"], "lstrip": False,
                                                "normalized": False, "rstrip": False,
                                                "single_word": False, "special": True}
                                 for t in data["added_tokens"]},
    }, indent=2, ensure_ascii=False), encoding="utf-8")
    return len(vocab)


def _rope_factors(head_dim: int) -> tuple[list[float], list[float]]:
    """LongRoPE factor lists of head_dim / 2 values: short ones near 1, long ones growing
    with the frequency index (low frequencies stretched most), as LongRoPE's are shaped."""
    n = head_dim // 2
    short = [round(1.0 + 0.05 * i / max(n - 1, 1), 6) for i in range(n)]
    long = [round(1.0 + 40.0 * (i / max(n - 1, 1)) ** 2, 6) for i in range(n)]
    return long, short


def config_dict(size: str, vocab_size: int) -> dict:
    s = SIZES[size]
    lm = dict(s["lm"])
    head_dim = lm["hidden_size"] // lm["num_attention_heads"]
    long, short = _rope_factors(head_dim)
    dtype = "float32" if size == "tiny" else "bfloat16"
    return {
        "architecture": "voxcpm2",
        "lm_config": {
            "bos_token_id": 1, "eos_token_id": 2, "hidden_size": lm["hidden_size"],
            "intermediate_size": lm["intermediate_size"],
            "max_position_embeddings": lm["max_position_embeddings"],
            "num_attention_heads": lm["num_attention_heads"],
            "num_hidden_layers": lm["num_hidden_layers"],
            "num_key_value_heads": lm["num_key_value_heads"], "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "rope_scaling": {"type": "longrope", "long_factor": long, "short_factor": short,
                             "original_max_position_embeddings": lm["original_max_position"]},
            "vocab_size": vocab_size, "use_mup": True, "scale_emb": 12.0,
            "dim_model_base": 256, "scale_depth": 1.4,
        },
        "patch_size": 4, "feat_dim": s["audio_vae"].latent_dim,
        "residual_lm_num_layers": s["residual_lm_num_layers"], "residual_lm_no_rope": False,
        "scalar_quantization_latent_dim": s["fsq_latent_dim"], "scalar_quantization_scale": 9,
        "encoder_config": dict(s["encoder"]),
        "dit_config": {**s["dit"], "dit_mean_mode": False,
                       "cfm_config": {"sigma_min": 1e-6, "solver": "euler", "t_scheduler": "log-norm",
                                      "training_cfg_rate": 0.1, "inference_cfg_rate": 2.0,
                                      "reg_loss_type": "l1", "ratio_r_neq_t_range": [0.25, 0.75],
                                      "noise_cond_prob_range": [0.0, 0.0]}},
        "audio_vae_config": s["audio_vae"].to_dict(),
        "max_length": s["max_length"], "device": "cuda", "dtype": dtype,
    }


def random_state(config: VoxCPM2Config, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors (the talker's: its names and shapes are upstream's),
    in `dtype`: norm scales near 1, matrices scaled by 1/sqrt(fan-in) so activations stay
    O(1), biases small, embeddings and the local encoder's learned token unit-variance. Each
    is cast as it is made."""
    with torch.device("meta"):
        model = VoxCPM2Talker(config)
    state = {}
    for name, t in model.state_dict().items():
        noise = torch.randn(t.shape, generator=generator)
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * noise
        elif name.endswith("bias"):
            value = 0.02 * noise
        elif name.endswith("embed_tokens.weight") or name.endswith("special_token"):
            value = noise
        else:
            value = noise * t.shape[-1] ** -0.5
        if name == "stop_head.weight":
            # Shift the stop class down, so a random talker stops after a few to a few dozen
            # patches (as a trained one stops when the text is spoken) rather than at the
            # first step it may.
            value[1] -= STOP_SHIFT * value.abs().mean()
        state[name] = value.to(dtype)
    return state


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = write_llama_tokenizer(out, size)
    config = config_dict(size, vocab_size)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    # Released weights are bfloat16; tiny ones stay float32 so parity tests are exact.
    dtype = torch.float32 if size == "tiny" else torch.bfloat16
    save_safetensors(random_state(parse_config(out / "config.json"), torch.Generator().manual_seed(seed), dtype),
                     out / "model.safetensors", dtype)
    write_random_audio_vae(out / "audiovae.safetensors", SIZES[size]["audio_vae"], seed=seed + 1)
    return out


def main(argv=None):
    random_checkpoint_cli(__doc__, SIZES, write_random_checkpoint, argv)


if __name__ == "__main__":
    main()
