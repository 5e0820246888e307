"""Random-weight Gepard-1.0 checkpoints in the released layout (tritontts.families.gepard.checkpoint):
config.json (bare qwen3_5_text), gepard_config.json, model.safetensors (the backbone under
transformers' Qwen3.5 names, lm_head, the audio heads), a byte-level BPE tokenizer with
Gepard's special tokens after its vocabulary, and the NanoCodec .nemo archive. `tiny` runs in
seconds (tests); `released` has the released sizes for measuring speed. No released
config.json is reachable here: the backbone is the issue's 14 layers x 1024 with the other
sizes of the Qwen3.5 small models (INFERRED below); the sidecar's values are vLLM-Omni's
GepardConfig defaults, which it documents as the trained checkpoint's.

  python -m tritontts.families.gepard.random_checkpoint OUT [--size released] [--seed N]
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...weights.random_weights import (
    randomize, random_checkpoint_cli, save_safetensors, write_qwen2_tokenizer)
from .checkpoint import DEFAULT_CODEC_ID, parse_backbone, parse_sidecar
from .heads import GepardHeads

# The special tokens in the released order (start_of_speech is tokeniser_length - 7); the
# two unnamed ones are reserved slots of the released vocabulary.
SPECIAL = ("<|start_of_speech|>", "<|end_of_speech|>", "<|reserved_0|>", "<|start_of_text|>",
           "<|end_of_text|>", "<|reserved_1|>", "<|tts_pad|>")
SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, linear_key_head_dim=64, linear_value_head_dim=64,
                 linear_num_key_heads=2, linear_num_value_heads=4, vocab_size=512, audio_embed_dim=8),
    # INFERRED: Qwen3.5-0.8B's widths on the 14 layers x 1024.
    "released": dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=14, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
                     linear_num_key_heads=16, linear_num_value_heads=16, vocab_size=248320, audio_embed_dim=32),
}
STOP_BIAS = {"tiny": -1.5, "released": -20.0}
RELEASED_FIRST_SPECIAL = 248070      # <|start_of_speech|>'s released id
CORPUS = ("Hello there, how are you today? The birch canoe slid on the smooth planks. "
          "Glue the sheet to the dark blue background. It's easy to tell the depth of a well. "
          "These days a chicken leg is a rare dish. Speech synthesis, one frame at a time: 0123456789!")


def backbone_config(size: str) -> dict:
    s = dict(SIZES[size])
    s.pop("audio_embed_dim")
    return {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", **s,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "linear_conv_kernel_dim": 4,
            "full_attention_interval": 4, "max_position_embeddings": 4096 if size == "tiny" else 32768,
            "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}}


def sidecar(first_special: int, size: str) -> dict:
    levels = [8, 7, 6, 6]
    return {
        "audio_heads": {f"level_audio_{i}": n for i, n in enumerate(levels * 8)},
        "audio_embed_dim": SIZES[size]["audio_embed_dim"],
        "special_tokens": {"start_of_speech": first_special, "end_of_speech": first_special + 1,
                           "start_of_text": first_special + 3, "end_of_text": first_special + 4,
                           "tts_pad": first_special + 6, "tokeniser_length": first_special + 7},
        "text_repetition": {"enabled": True, "target_text_tokens": 16, "apply_below": 13, "max_repeats": 8},
        "codec": {"codec_id": DEFAULT_CODEC_ID, "sample_rate": 22050, "frame_rate_hz": 21.5,
                  "fsq_levels": levels, "num_layers": 8, "do_unfold": True},
        "voice_cloning": {"enabled": True, "compressor": {"num_queries": 8, "num_layers": 2, "num_heads": 8}},
        "stop_threshold": 0.5, "temperature": 0.3,
    }


def backbone_state(config: dict, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The backbone's tensors under their checkpoint names (transformers' Qwen3_5ForCausalLM
    is the naming authority), random values."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**fields))
    state = {}
    for name, meta in model.state_dict().items():
        noise = torch.randn(meta.shape, generator=generator)
        if name.endswith("linear_attn.norm.weight"):
            value = 1.0 + 0.1 * noise          # the gated norm scales by its weight
        elif name.endswith("norm.weight"):
            value = 0.1 * noise                # the other norms scale by 1 + weight
        elif name.endswith("A_log"):
            value = torch.rand(meta.shape, generator=generator).log()    # decay rates in (0, 1]
        else:
            value = 0.05 * noise
        state[name] = value
    return state


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    from .codec import write_random_nemo_codec

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    vocab_size = SIZES[size]["vocab_size"]
    ids = write_qwen2_tokenizer(out, SPECIAL, CORPUS, vocab_size=480 - len(SPECIAL))
    first = ids[SPECIAL[0]]
    if size != "tiny":
        # The released ids: the BPE's own tokens stay below, the rest of the table is unused.
        first = RELEASED_FIRST_SPECIAL
        _move_special_tokens(out, first)
    config = backbone_config(size)
    side = sidecar(first, size)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "gepard_config.json").write_text(json.dumps(side, indent=2))
    parsed = parse_sidecar(side, parse_backbone(config))
    state = backbone_state(config, generator)
    heads = GepardHeads(parsed)
    state.update(randomize(heads, generator))
    state["null_prefix"] = 0.5 * torch.randn(heads.null_prefix.shape, generator=generator)
    # A trained stop head is far below its threshold until the end: random weights on a bias
    # of 0 would stop within a few frames. Tiny: now and then; released: not within the
    # frames a benchmark measures.
    state["stop_head.bias"] = torch.full((1,), STOP_BIAS[size])
    save_safetensors(state, out / "model.safetensors", torch.float32 if size == "tiny" else torch.bfloat16)
    write_random_nemo_codec(out / parsed.codec_file_name, seed, size)
    assert vocab_size > parsed.speaker_base + parsed.speaker_slots
    return out


def _move_special_tokens(out: Path, first: int) -> None:
    """Re-number the tokenizer's special tokens from `first` (their released ids)."""
    path = out / "tokenizer_config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    decoder = data["added_tokens_decoder"]
    data["added_tokens_decoder"] = {str(first + i): decoder[k] for i, k in enumerate(sorted(decoder, key=int))}
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    random_checkpoint_cli(__doc__, SIZES, write_random_checkpoint)
