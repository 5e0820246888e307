"""voxtral_tts: its upstream implementations for parity checks (tests, benchmarks), on the
same weights as ours (tritontts.upstream has the loading helpers)."""
from __future__ import annotations


from ...upstream import vllm_omni_module


def voxtral_upstream_talker(checkpoint, reorder: bool = True):
    """The Voxtral TTS talker's references on a checkpoint's weights, fp32: transformers'
    MistralModel on the backbone (wq / wk rows reordered for its rotate-half RoPE unless
    `reorder` is False: the negative control) and vLLM-Omni 0.30's
    FlowMatchingAudioTransformer on acoustic_transformer.*. Built on the meta device and
    filled a tensor at a time, each converted as it is read: a released-size checkpoint
    (bfloat16 on disk) then needs its float32 size and no more."""
    import json

    import torch
    from safetensors import safe_open
    from transformers import MistralConfig, MistralModel
    from transformers.models.mistral.modeling_mistral import MistralRotaryEmbedding

    from .checkpoint import PARAMS_FILE, WEIGHTS_FILE
    from ...nn.llama_format import rotate_half_rows
    from .talker import TEXT_EMBEDDINGS

    b = checkpoint.config.backbone
    config = MistralConfig(hidden_size=b.dim, intermediate_size=b.hidden_dim, num_hidden_layers=b.n_layers,
                           num_attention_heads=b.n_heads, num_key_value_heads=b.n_kv_heads, head_dim=b.head_dim,
                           rms_norm_eps=b.norm_eps, rope_theta=b.rope_theta, vocab_size=b.vocab_size,
                           tie_word_embeddings=True, max_position_embeddings=b.max_seq_len)
    names = {TEXT_EMBEDDINGS: "embed_tokens.weight", "norm.weight": "norm.weight"}
    rows = {}
    for i in range(b.n_layers):
        p, q = f"layers.{i}.", f"layers.{i}."
        names.update({p + "attention.wq.weight": q + "self_attn.q_proj.weight",
                      p + "attention.wk.weight": q + "self_attn.k_proj.weight",
                      p + "attention.wv.weight": q + "self_attn.v_proj.weight",
                      p + "attention.wo.weight": q + "self_attn.o_proj.weight",
                      p + "feed_forward.w1.weight": q + "mlp.gate_proj.weight",
                      p + "feed_forward.w3.weight": q + "mlp.up_proj.weight",
                      p + "feed_forward.w2.weight": q + "mlp.down_proj.weight",
                      p + "attention_norm.weight": q + "input_layernorm.weight",
                      p + "ffn_norm.weight": q + "post_attention_layernorm.weight"})
        if reorder:
            rows.update({p + "attention.wq.weight": b.n_heads, p + "attention.wk.weight": b.n_kv_heads})
    with torch.device("meta"):
        backbone = MistralModel(config)
    # The acoustic transformer (a few hundred MB) is built as it is: its constructor
    # computes buffers (the time grid, the time embedding's frequencies).
    audio_args = json.loads(checkpoint.path(PARAMS_FILE).read_text())["multimodal"]["audio_model_args"]
    with vllm_omni_module("vllm_omni.model_executor.models.voxtral_tts.voxtral_tts_audio_generation") as m:
        acoustic = m.FlowMatchingAudioTransformer(audio_args)
    hf, ref = {}, {}
    with safe_open(str(checkpoint.path(WEIGHTS_FILE)), framework="pt", device="cpu") as f:
        for name in f.keys():
            if name in names:
                tensor = f.get_tensor(name).float()
                hf[names[name]] = rotate_half_rows(tensor, rows[name]) if name in rows else tensor
            elif name.startswith("acoustic_transformer."):
                ref[name[len("acoustic_transformer."):]] = f.get_tensor(name).float()
    backbone.load_state_dict(hf, strict=True, assign=True)
    backbone.rotary_emb = MistralRotaryEmbedding(config)          # a buffer, not in the file
    missing, unexpected = acoustic.load_state_dict(ref, strict=False)
    assert not unexpected and set(missing) <= {"time_embedding.inv_freq"}, (missing, unexpected)
    return backbone.float().eval(), acoustic.float().eval()


def voxtral_upstream_frames(backbone, acoustic, embed_frames, prompt, frames: int, cfg: float = 1.2):
    """The reference talker loop: frames [B, frames, 37] (shifted codes) for prompt
    embeddings [B, T, dim] from `voxtral_upstream_talker`'s modules: transformers' KV cache
    (prefill, then one position a step), vLLM-Omni's FlowMatchingAudioTransformer per frame
    (its own noise, from torch's global generator), the frame's summed codebook embeddings
    as the next input (`embed_frames`: ours, tritontts.families.voxtral_tts.talker.FrameEmbeddings;
    upstream's are vLLM layers). Rows go on past an END_AUDIO frame (a batch runs in step);
    the caller cuts them there."""
    import torch
    from transformers import DynamicCache

    cache, out, x = DynamicCache(), [], prompt
    cfg_rows = torch.full((prompt.shape[0],), float(cfg))
    with torch.no_grad():
        for _ in range(frames):
            hidden = backbone(inputs_embeds=x, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
            codes = acoustic(hidden, cfg_rows)
            out.append(codes)
            x = embed_frames(codes)[:, None]
    return torch.stack(out, dim=1)
