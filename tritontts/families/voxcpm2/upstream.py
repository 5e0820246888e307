"""voxcpm2: its upstream implementations for parity checks (tests, benchmarks), on the
same weights as ours (tritontts.upstream has the loading helpers)."""
from __future__ import annotations

import types
from contextlib import contextmanager

from ...upstream import package_module


@contextmanager
def voxcpm_module(name: str):
    """Import one module of voxcpm 2.0.3 (the VoxCPM2 reference; setup unpacks it into
    .venv/reference) without the __init__ of voxcpm (the inference wrapper: torchaudio,
    librosa, hub downloads), voxcpm.modules or voxcpm.modules.audiovae (which imports both
    VAE versions). Removed from sys.modules afterwards."""
    with package_module("voxcpm", ("modules", "modules.audiovae"), name, {}) as module:
        yield module


def voxcpm2_upstream_model(root, dtype: str = "float32", audio_vae: bool = True):
    """voxcpm 2.0.3's VoxCPM2Model for the checkpoint at `root` (config.json, tokenizer,
    model.safetensors; with `audio_vae`, its AudioVAE v2 from audiovae.safetensors, else a
    stand-in with the sizes only), on the CPU in `dtype`, weights loaded. Its librosa is a
    stand-in whose `load` reads a file at the rate asked for (soundfile; no resampling):
    enough for _encode_wav on clips written at the VAE's input rate."""
    import json
    from pathlib import Path

    import soundfile as sf
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaTokenizerFast

    def load(path, sr, mono=True):
        audio, rate = sf.read(str(path), dtype="float32")
        assert rate == sr, f"{path} is {rate} Hz; the stand-in reads only {sr} Hz files"
        return audio, rate

    root = Path(root)
    config = json.loads((root / "config.json").read_text())
    config["dtype"] = dtype
    if audio_vae:
        with voxcpm_module("voxcpm.modules.audiovae.audio_vae_v2") as vae_module:
            vae = vae_module.AudioVAE(vae_module.AudioVAEConfig(**config["audio_vae_config"]))
        vae.load_state_dict(load_file(str(root / "audiovae.safetensors")), strict=True)
        vae = vae.float().eval()
    else:
        vae = types.SimpleNamespace(chunk_size=640, sample_rate=16000, out_sample_rate=48000, latent_dim=64)
    with package_module("voxcpm", ("modules", "model"), "voxcpm.model.voxcpm2", {"librosa": {"load": load}}) as m:
        model = m.VoxCPM2Model(m.VoxCPMConfig.model_validate(config),
                               LlamaTokenizerFast.from_pretrained(str(root)), vae, device="cpu")
    state = {k: v.to(getattr(torch, dtype)) for k, v in load_file(str(root / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("audio_vae.") for k in missing), (missing, unexpected)
    return model.to(getattr(torch, dtype)).eval()
