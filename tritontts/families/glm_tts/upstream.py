"""glm_tts: its upstream implementations for parity checks (tests, benchmarks), on the
same weights as ours (tritontts.upstream has the loading helpers)."""
from __future__ import annotations




def glm_tts_dit_stand_ins() -> dict[str, dict]:
    """What vLLM-Omni's GLM-TTS DiT wrapper imports that cannot run here, for
    vllm_omni_module: their diffusion attention layer (it needs their runtime; the stand-in
    is plain SDPA on their [B, T, heads, dim] layout, what that layer computes unmasked;
    with a mask their DiT calls SDPA itself), the checkpoint resolver (handed the folder as
    it is: theirs may download) and their output template."""
    import types

    import torch

    class SdpaAttention(torch.nn.Module):
        def __init__(self, softmax_scale: float, **_) -> None:
            super().__init__()
            self.scale = softmax_scale

        def forward(self, q, k, v, attn_metadata=None):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=self.scale)
            return out.transpose(1, 2)

    return {"vllm_omni.diffusion.attention.layer": {"Attention": SdpaAttention},
            "vllm_omni.model_executor.models.glm_tts.glm_tts":
                {"resolve_glm_tts_model_dir": lambda path, **_: path},
            "vllm_omni.model_executor.models.output_templates": {"OmniOutput": types.SimpleNamespace}}
