"""auk: its upstream implementations for parity checks (tests, benchmarks), on the
same weights as ours (tritontts.upstream has the loading helpers)."""
from __future__ import annotations

from contextlib import contextmanager

from ...upstream import package_module


@contextmanager
def auk_module(name: str):
    """Import one module of vLLM-Omni 0.30's AuK diffusion package (`auk_transformer`,
    `auk_vae`: pure torch) without running the package inits above it: vllm_omni's, the
    diffusion registry's, and auk/__init__.py (which imports the pipeline, and with it
    torchaudio and the diffusion engine)."""
    with package_module("vllm_omni", ("model_executor", "model_executor.models", "diffusion",
                                       "diffusion.models", "diffusion.models.auk"),
                         f"vllm_omni.diffusion.models.auk.{name}", {}) as module:
        yield module


def auk_fused_condition(hidden_states, layer_weights, layer_scale: float):
    """AuK's upstream read-out of a transformers thinker's `hidden_states` (embeddings first,
    then every layer's output, the last after the final norm): layers 1.. layer-normed
    without affine, mixed by softmax(layer_weights), times layer_scale -> [T, hidden]."""
    import torch
    import torch.nn.functional as F

    hidden = torch.stack(tuple(hidden_states[1:]), dim=0)[:, 0]
    mix = torch.softmax(torch.as_tensor(layer_weights, dtype=torch.float32), dim=0)
    return (F.layer_norm(hidden, hidden.shape[-1:]) * mix[:, None, None]).sum(0) * layer_scale


def auk_upstream_audio(root, instruction: str, frames: int, seed: int, t_grid=None, nfe: int = 32,
                        cfg: float = 2.0, sway: float | None = -1.0, clip24k=None, vae_sample: bool = False):
    """AuK end to end by the references, fp32, on a checkpoint folder: transformers'
    Qwen2_5OmniThinkerForConditionalGeneration (its processor's Whisper features for the clip,
    its own audio tower and mRoPE) over the rendered prompt tokenized whole, its hidden states
    fused by the upstream rule; vLLM-Omni 0.30's sample_latents with its AuKTransformer
    (noise from a generator seeded with `seed`) and its AuKVAE (the clip encoded, the latents
    decoded). The clip goes in at 24 kHz; its 16 kHz copy is resampled as the stage does.
    Returns the waveform [frames * 480]."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

    from ...audio import resample
    from .checkpoint import open_checkpoint
    from .prompt import PromptBuilder, rendered

    ckpt = open_checkpoint(root)
    with auk_module("auk_vae") as vae_module:
        vae = vae_module.AuKVAE.from_config(ckpt.vae)
        vae.load_weights(str(ckpt.vae_file))
        vae.eval()
    with auk_module("auk_transformer") as dit_module:
        dit = dit_module.AuKTransformer(**ckpt.dit)
        dit.load_state_dict(dit_module.dit_state_dict(load_file(str(ckpt.weights_file))), strict=True)
        dit.eval()
        sample_latents = dit_module.sample_latents

    config = Qwen2_5OmniThinkerConfig(**ckpt.thinker_config)
    config._attn_implementation = "eager"
    thinker = Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
    state = {}
    for f in ckpt.thinker_files:
        state.update({k[len("thinker."):]: v for k, v in load_file(str(f)).items() if k.startswith("thinker.")})
    thinker.load_state_dict(state, strict=False)
    tokenizer = PromptBuilder(ckpt.thinker_root).tokenizer
    kwargs, ref = {}, torch.zeros(1, 0, ckpt.latent_dim)
    audio_tokens = 0
    with torch.no_grad():
        if clip24k is not None:
            clip16k = resample(np.asarray(clip24k, np.float32), ckpt.sample_rate, 16000)
            extractor = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160,
                                                chunk_length=300, n_fft=400)
            feats = extractor(clip16k, sampling_rate=16000, padding="max_length", return_attention_mask=True,
                              return_tensors="pt")
            mask = feats["attention_mask"]
            kwargs = {"input_features": feats["input_features"], "feature_attention_mask": mask}
            length = int(mask.sum())
            audio_tokens = ((length - 1) // 2 + 1 - 2) // 2 + 1
            wav = torch.from_numpy(np.asarray(clip24k, np.float32))
            wav = wav[: wav.shape[0] // ckpt.hop * ckpt.hop][None]
            generator = torch.Generator().manual_seed((seed + 0x5EED_0A0C) % 2**63) if vae_sample else None
            ref = vae.encode(wav, sample=vae_sample, generator=generator)
        ids = tokenizer(rendered(instruction, audio_tokens), add_special_tokens=False)["input_ids"]
        out = thinker(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      output_hidden_states=True, use_cache=False, **kwargs)
        cond = auk_fused_condition(out.hidden_states, *ckpt.read_fusion())
        latents = sample_latents(dit, text=cond[None], c_mask=torch.ones(1, cond.shape[0], dtype=torch.bool),
                                 ref=ref, ref_mask=torch.ones(ref.shape[:2], dtype=torch.bool), gen_frames=frames,
                                 nfe=nfe, cfg_strength=cfg, sway_sampling_coef=sway,
                                 t_grid=None if t_grid is None else list(t_grid),
                                 generator=torch.Generator().manual_seed(seed), latent_dim=ckpt.latent_dim,
                                 device="cpu", dtype=torch.float32)
        return vae.decode(latents.float())[0].numpy()
