"""gepard: its upstream implementations for parity checks (tests, benchmarks), on the
same weights as ours (tritontts.upstream has the loading helpers)."""
from __future__ import annotations


from ...upstream import vllm_omni_module


# vLLM-Omni's Gepard talker imports vLLM's qwen3_5 module, which needs torchvision (not
# loadable here); the reference code exercised (the heads' sampling and the frame embedding)
# never touches the backbone class it names.
GEPARD_STAND_INS = {"vllm.model_executor.models.qwen3_5": {"Qwen3_5ForCausalLM": None}}


def gepard_upstream_talker(checkpoint):
    """Gepard's references on a checkpoint's weights, fp32: transformers' Qwen3_5ForCausalLM
    on model.* and lm_head (its torch Gated-DeltaNet fallback), and vLLM-Omni 0.30's
    GepardTalkerForConditionalGeneration holding the heads (its codebook heads fused as its
    own load_weights fuses them), used for its _sample_frame / _audio_frame_embed; its
    backbone and codec are never built. Tensors are read one at a time, converted as read."""
    import torch
    from safetensors import safe_open
    from torch import nn
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    c = checkpoint.config
    fields = {k: v for k, v in checkpoint.backbone_dict.items()
              if k not in ("architectures", "model_type", "torch_dtype", "transformers_version")}
    with torch.device("meta"):
        backbone = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**fields))
    hf, heads = {}, {}
    for path in checkpoint.weight_files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                (hf if name.startswith(("model.", "lm_head.")) else heads)[name] = f.get_tensor(name).float()
    backbone.load_state_dict(hf, strict=True, assign=True)
    backbone.model.rotary_emb = type(backbone.model.rotary_emb)(backbone.config)   # a buffer, not in the file
    with vllm_omni_module("vllm_omni.model_executor.models.gepard.gepard_talker", GEPARD_STAND_INS) as m:
        cls = m.GepardTalkerForConditionalGeneration
        omni = cls.__new__(cls)
        nn.Module.__init__(omni)
    hidden, levels = c.backbone.hidden_size, list(c.head_levels)
    omni.vocab_sizes, omni.num_heads, omni.head0_vocab = levels, len(levels), levels[0]
    omni.temperature, omni.stop_threshold, omni._greedy = c.temperature, c.stop_threshold, False
    omni.fused_codebook_head = nn.Linear(hidden, sum(levels))
    omni.fused_codebook_head.weight.data = torch.cat([heads[f"codebook_heads.{i}.weight"] for i in range(len(levels))])
    omni.fused_codebook_head.bias.data = torch.cat([heads[f"codebook_heads.{i}.bias"] for i in range(len(levels))])
    omni.stop_head = nn.Linear(hidden, 1)
    omni.audio_embeddings = nn.ModuleList(nn.Embedding(n, c.audio_embed_dim) for n in levels)
    omni.audio_embed_proj = nn.Sequential(nn.Linear(len(levels) * c.audio_embed_dim, hidden), nn.GELU(),
                                          nn.Linear(hidden, hidden), nn.LayerNorm(hidden, elementwise_affine=False))
    omni.register_buffer("audio_embed_scale", heads.get("audio_embed_scale", torch.tensor(1.0)))
    omni.null_prefix = nn.Parameter(heads["null_prefix"])
    gather, mask = cls._build_gather_mask(levels)
    omni.register_buffer("_cb_gather_idx", gather, persistent=False)
    omni.register_buffer("_cb_mask", mask, persistent=False)
    state = {k: v for k, v in heads.items() if k.startswith(("stop_head.", "audio_embeddings.", "audio_embed_proj."))}
    missing, unexpected = omni.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"fused_codebook_head.weight", "fused_codebook_head.bias",
                                               "null_prefix", "audio_embed_scale"}, (missing, unexpected)
    return backbone.float().eval(), omni.float().eval()


def gepard_upstream_frames(backbone, omni, config, prompt_ids: list[int], seed: int, max_frames: int):
    """The reference talker loop for one request: frames [n, 32] until the stop head fires
    (from the second frame on, as vLLM-Omni lets it) or max_frames. Prompt embeddings with
    null_prefix at the speaker slots; transformers' cache (prefill, then one position a
    step); each frame drawn by vLLM-Omni's _sample_frame from a generator seeded `seed`; the
    next input its _audio_frame_embed."""
    import torch
    from transformers import DynamicCache

    ids = torch.tensor(prompt_ids)
    embeds = backbone.model.embed_tokens(ids)
    slot = (ids >= config.speaker_base) & (ids < config.speaker_base + config.speaker_slots)
    embeds[slot] = omni.null_prefix[ids[slot] - config.speaker_base]
    generator = torch.Generator().manual_seed(seed)
    cache, frames, x = DynamicCache(config=backbone.config), [], embeds[None]
    with torch.no_grad():
        while len(frames) < max_frames:
            hidden = backbone.model(inputs_embeds=x, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
            head0, rest, stop = omni._sample_frame(hidden, [generator])
            if bool(stop[0]) and frames:
                break
            frames.append(torch.cat([head0, rest[0]]))
            x = omni._audio_frame_embed(head0, rest)[:, None]
    return torch.stack(frames)
