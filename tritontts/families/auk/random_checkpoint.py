"""Random-weight AuK checkpoints in both real layouts (tritontts.families.auk.checkpoint):

  assembled (vLLM-Omni's)   config.json (model_type auk: Qwen2.5-Omni's config + dit, vae,
                            variant, flash_t_grid, defaults), the thinker's model.safetensors
                            (thinker.* under transformers' Qwen2.5-Omni names, plus a talker.*
                            and a token2wav.* tensor that loaders must skip), Qwen2.5-Omni's
                            tokenizer files, auk.safetensors, vae.safetensors
  upstream                  config.yaml, auk_base.safetensors | auk_flash.safetensors,
                            vae.safetensors, and the thinker in Qwen2.5-Omni-3B/

`tiny` runs in seconds (tests); `released` has the released sizes (Qwen2.5-Omni-3B's thinker
without its vision tower, the 10 + 20-block DiT, the VAE) for measuring speed.

  python -m tritontts.families.auk.random_checkpoint OUT [--size released] [--seed N]
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...weights.checkpoint import publish_dir
from ...weights.random_weights import random_checkpoint_cli, save_safetensors, write_qwen2_tokenizer
from .checkpoint import FLASH_T_GRID, UPSTREAM_WEIGHTS

# Qwen2.5-Omni's special tokens in their released order (151643 on): the thinker config's
# token ids point at them.
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
           "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_bos|>", "<|vision_eos|>",
           "<|vision_pad|>", "<|IMAGE|>", "<|VIDEO|>")
CORPUS = ("system\nYou are a helpful assistant.\nuser\nassistant\n"
          'Generate speech based on the following description: "A clear, natural voice.". '
          'The content to speak is: "Hello there, how are you today?". Say the following with the same voice: '
          '"The birch canoe slid on the smooth planks." Add rain to the recording. Make it sound like a radio. '
          "A dog barks twice, then a door closes.|<no_prompt_audio>| 0123456789!")

TEXT = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=512, max_position_embeddings=8192, mrope=[4, 6, 6]),
    # Qwen2.5-Omni-3B's thinker.
    "released": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                     num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, mrope=[16, 24, 24]),
}
AUDIO = {
    "tiny": dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, output_dim=64),
    "released": dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                     output_dim=2048),
}
VISION_TINY = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                   fullatt_block_indexes=[0], window_size=112)
DIT = {
    "tiny": dict(dim=64, heads=2, dim_head=32, ff_mult=2, text_hidden_dim=64, num_layers=1, num_single_layers=2),
    "released": dict(dim=1536, heads=24, dim_head=64, ff_mult=2, text_hidden_dim=2048, num_layers=10,
                     num_single_layers=20),
}
VAE_KWARGS = {
    "tiny": dict(upsample_rates=[5, 4, 3, 2, 2, 2], upsample_kernel_sizes=[10, 8, 6, 4, 4, 4],
                 upsample_initial_channel=64, resblock_kernel_sizes=[3, 7],
                 resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], downsample_rates=[2, 2, 2, 3, 4, 5],
                 downsample_channels=[2, 4, 4, 8, 8, 16, 16], snake_logscale=True, latent_dim=64, use_vae=True,
                 causal=True, flow_hidden_channels=16, act_causal=True),
    "released": dict(upsample_rates=[5, 4, 3, 2, 2, 2], upsample_kernel_sizes=[10, 8, 6, 4, 4, 4],
                     upsample_initial_channel=1536, resblock_kernel_sizes=[3, 7, 11],
                     resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]], downsample_rates=[2, 2, 2, 3, 4, 5],
                     downsample_channels=[12, 24, 48, 96, 192, 384, 768], snake_logscale=True, latent_dim=64,
                     use_vae=True, causal=True, flow_hidden_channels=256, act_causal=True),
}
SIZES = tuple(TEXT)
LAYOUTS = ("assembled", "upstream")


def thinker_config(size: str, ids: dict[str, int]) -> dict:
    text = dict(TEXT[size])
    mrope = text.pop("mrope")
    text.update(model_type="qwen2_5_omni_text", hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0,
                rope_scaling={"mrope_section": mrope, "rope_type": "default", "type": "default"},
                use_sliding_window=False, tie_word_embeddings=False)
    audio = dict(AUDIO[size], model_type="qwen2_5_omni_audio_encoder", num_mel_bins=128, n_window=100,
                 max_source_positions=1500, scale_embedding=False, activation_function="gelu")
    vision = dict(VISION_TINY) if size == "tiny" else {}
    return {"model_type": "qwen2_5_omni_thinker", "text_config": text, "audio_config": audio,
            "vision_config": vision, "audio_token_index": ids["<|AUDIO|>"], "image_token_index": ids["<|IMAGE|>"],
            "video_token_index": ids["<|VIDEO|>"], "audio_start_token_id": ids["<|audio_bos|>"],
            "audio_end_token_id": ids["<|audio_eos|>"], "vision_start_token_id": ids["<|vision_bos|>"],
            "vision_end_token_id": ids["<|vision_eos|>"], "position_id_per_seconds": 25, "seconds_per_chunk": 2,
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"]}


def thinker_state(config: dict, size: str, generator: torch.Generator,
                  dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """thinker.* under transformers' Qwen2.5-Omni names (the naming authority), random
    values in `dtype` (each made and cast alone: the released thinker in fp32 all at once
    would not fit this machine); the vision tower only at tiny size (the encoder never reads
    it)."""
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5OmniThinkerForConditionalGeneration(Qwen2_5OmniThinkerConfig(**config))
    state = {}
    for name, meta in model.state_dict().items():
        if name.startswith("visual.") and size != "tiny":
            continue
        noise = torch.randn(meta.shape, generator=generator)
        norm = meta.ndim == 1 and ("norm" in name or name.endswith("ln_post.weight") or "layernorm" in name)
        value = (1.0 + 0.1 * noise) if norm and name.endswith("weight") else 0.05 * noise
        state["thinker." + name] = value.to(dtype)
    # The rest of Qwen2.5-Omni, which the encoder must skip.
    state["talker.model.norm.weight"] = torch.ones(8)
    state["token2wav.code2wav_dit_model.norm_out.weight"] = torch.ones(8)
    return state


def auk_state(size: str, num_layers: int, generator: torch.Generator,
              dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    from ...nn.dit import RotaryEmbedding
    from .dit import AuKTransformer

    with torch.device("meta"):
        dit = AuKTransformer(**DIT[size], latent_dim=64)
    state = {}
    for name, meta in dit.state_dict().items():
        if name.endswith("inv_freq"):
            state["transformer." + name] = RotaryEmbedding(DIT[size]["dim_head"]).inv_freq  # fixed
            continue
        noise = torch.randn(meta.shape, generator=generator)
        norm = meta.ndim == 1 and "norm" in name
        state["transformer." + name] = ((1.0 + 0.1 * noise) if norm else 0.05 * noise).to(dtype)
    state["layer_weights"] = torch.randn(num_layers, generator=generator)
    state["layer_scale"] = torch.tensor([1.0 + 0.5 * float(torch.rand(1, generator=generator))])
    return state


def vae_state(size: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    from .vae import AuKVAE, VAEConfig, released_state_dict

    # torch's own initialization (seeded from `generator`): fan-in scaled, so the random decoder
    # outputs audio at a real level (~0.4 peak), which parity tolerances need. The FIR filters
    # are fixed buffers and stay as built.
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=generator)))
        vae = AuKVAE(VAEConfig.from_init_kwargs(VAE_KWARGS[size]))
    state = vae.state_dict()
    for name, tensor in state.items():
        if name.endswith((".alpha", ".beta")):          # the snakes' (log-scale) shapes
            state[name] = tensor + 0.1 * torch.randn(tensor.shape, generator=generator)
    # The latent statistics: a spread of means and variances, so normalizing matters.
    state["global_mean"] = 0.1 * torch.randn(64, generator=generator)
    state["global_log_std"] = 0.5 + torch.rand(64, generator=generator)
    vae.load_state_dict(state)
    return released_state_dict(vae, generator)


def vae_section(size: str) -> dict:
    return {"latent_dim": 64, "downsample_rate": 480, "target_sample_rate": 24000,
            "model_init_kwargs": dict(VAE_KWARGS[size])}


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny", layout: str = "assembled",
                            variant: str = "base") -> Path:
    if size not in SIZES or layout not in LAYOUTS or variant not in UPSTREAM_WEIGHTS:
        raise ValueError(f"size in {SIZES}, layout in {LAYOUTS}, variant in {tuple(UPSTREAM_WEIGHTS)}")
    dtype = torch.float32 if size == "tiny" else torch.bfloat16

    def fill(root: Path) -> None:
        generator = torch.Generator().manual_seed(seed)
        thinker_root = root if layout == "assembled" else root / "Qwen2.5-Omni-3B"
        thinker_root.mkdir(exist_ok=True)
        ids = write_qwen2_tokenizer(thinker_root, SPECIAL, CORPUS, eos_token="<|im_end|>")
        thinker = thinker_config(size, ids)
        save_safetensors(thinker_state(thinker, size, generator, dtype), thinker_root / "model.safetensors", dtype)
        dit, vae = dict(DIT[size], attn_mask_enabled=True), vae_section(size)
        weights = auk_state(size, thinker["text_config"]["num_hidden_layers"], generator, dtype)
        save_safetensors(vae_state(size, generator), root / "vae.safetensors", torch.float32)
        omni = {"architectures": ["Qwen2_5OmniModel"], "model_type": "qwen2_5_omni", "thinker_config": thinker,
                "talker_config": {}, "token2wav_config": {}, "enable_audio_output": False}
        if layout == "assembled":
            config = dict(omni, model_type="auk", architectures=["AuKForConditionalGeneration"], dit=dit, vae=vae,
                          variant=variant, flash_t_grid=list(FLASH_T_GRID),
                          defaults={"nfe": 32, "cfg": 2.0, "sway": -1.0})
            (root / "config.json").write_text(json.dumps(config, indent=2))
            save_safetensors(weights, root / "auk.safetensors", dtype)
        else:
            import yaml

            (thinker_root / "config.json").write_text(json.dumps(omni, indent=2))
            name = "AuK-Flash" if variant == "flash" else "AuK"
            schedule = ({"nfe": 4, "cfg_strength": 0.0, "t_grid": list(FLASH_T_GRID)} if variant == "flash"
                        else {"nfe": 32, "cfg_strength": 2.0, "sway_sampling_coef": -1.0})
            (root / "config.yaml").write_text(yaml.safe_dump({"model": {
                "name": name, "arch": dit, "vae": vae, "schedule": schedule,
                "text_encoder": {"text_encoder_path": "Qwen/Qwen2.5-Omni-3B"}}}, sort_keys=False))
            save_safetensors(weights, root / UPSTREAM_WEIGHTS[variant], dtype)

    out = Path(out)
    if out.is_dir() and not any(out.iterdir()):      # a fresh folder made for it (tests' mktemp)
        fill(out)
        return out
    return publish_dir(out, fill)


if __name__ == "__main__":
    random_checkpoint_cli(__doc__, SIZES, write_random_checkpoint)
