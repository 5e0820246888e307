"""AuK's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch). The DiT stage runs the MMDiT velocity
once per Euler step (both CFG rows of a request in one batch); the VAE stage decodes the
latents chunk by chunk; the prompt stage turns a clip into the thinker's audio-tower
embeddings and the VAE's latents. The thinker (the condition encoder) is vLLM's Qwen2 stack
at every size (vllm_model.py): no module of ours to time."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ...nn.runtime import Axis, Graph, Method, TensorSpec
from .audio_tower import AudioTower, SAMPLE_RATE as TOWER_RATE, HOP_LENGTH, N_MELS
from .checkpoint import DEFAULT_NFE
from .dit import AuKTransformer
from .random_checkpoint import DIT, SPECIAL, VAE_KWARGS, thinker_config
from .vae import FIRST_CHUNK_FRAMES, SAMPLE_RATE, AuKVAE, VAEConfig

# The quick start's request ("Hello, how are you?"): a prompt of about 32 tokens and, sized
# from its text, 2 s of speech (100 latent frames); a 3 s clip to clone or edit.
TEXT_TOKENS, TARGET_FRAMES, CLIP_SECONDS = 32, 100, 3


class Velocity(nn.Module):
    """One Euler step's velocity (AuKTransformer.forward: the condition, then one
    evaluation) on noisy latents [R, N, 64], the thinker's fused condition [R, nt, hidden]
    and the step's index into a uniform grid [R] (the time stays fp32, as the stage keeps
    it, whatever the weights' dtype)."""

    def __init__(self, dit: AuKTransformer, steps: int) -> None:
        super().__init__()
        self.dit, self.steps = dit, steps

    def forward(self, x: Tensor, text: Tensor, step: Tensor) -> Tensor:
        return self.dit(x, text, step.float() / self.steps)


class ClipEmbeddings(nn.Module):
    """Log-mel features of clips of equal length [B, 128, frames] -> their audio-tower
    embeddings [B, tokens, hidden]: the tower takes one clip at a time."""

    def __init__(self, tower: AudioTower) -> None:
        super().__init__()
        self.tower = tower

    def forward(self, features: Tensor) -> Tensor:
        return torch.stack([self.tower(clip) for clip in features])


def vae_half(size: str, unused: tuple[str, ...]) -> AuKVAE:
    """The VAE without the `unused` parts (the other direction's): each graph holds, and
    counts, only its own weights."""
    vae = AuKVAE(VAEConfig.from_init_kwargs(VAE_KWARGS[size]))
    for name in unused:
        setattr(vae, name, nn.Identity())
    return vae.eval()


def torch_networks(size: str) -> list[Graph]:
    size = "tiny" if size == "tiny" else "released"
    dit = AuKTransformer(**DIT[size], latent_dim=64).eval()
    vae = vae_half(size, ("audio_encoder",))
    # conv_pre stays: its weight's dtype is the one encode casts the audio to.
    encoding = vae_half(size, ("ups", "resblocks", "activation_post", "conv_post"))
    # The token ids in the thinker config reach no network here.
    tower = AudioTower(thinker_config(size, {t: i for i, t in enumerate(SPECIAL)})["audio_config"]).eval()
    f32, latent = torch.float32, dit.latent_dim
    clip_samples = CLIP_SECONDS * SAMPLE_RATE
    graphs = [
        Graph(name="auk_dit_velocity", module=Velocity(dit, DEFAULT_NFE),
              inputs=(TensorSpec("x", f32, ("batch", "frames", latent)),
                      TensorSpec("text", f32, ("batch", "tokens", dit.text_hidden_dim)),
                      TensorSpec("step", torch.long, ("batch",), high=DEFAULT_NFE)),
              outputs=("velocity",),
              # batch: rows; a request with guidance (the base model's default) is two, CFG's.
              axes={"batch": Axis(1, 2, 32), "frames": Axis(1, TARGET_FRAMES, 1500),
                    "tokens": Axis(1, TEXT_TOKENS, 8192)}),
        # The first chunk (what the first audio waits on): its frames and the lookahead after.
        Graph(name="auk_vae_decoder", module=Method(vae, "decode"),
              inputs=(TensorSpec("latents", f32, ("batch", "frames", latent)),),
              outputs=("audio",),
              axes={"batch": Axis(1, 1, 8), "frames": Axis(1, FIRST_CHUNK_FRAMES + vae.lookahead_frames, 1500)}),
        Graph(name="auk_vae_encoder", module=Method(encoding, "encode"),
              inputs=(TensorSpec("audio", f32, ("batch", "samples")),),
              outputs=("latents",),
              axes={"batch": Axis(1, 1, 8), "samples": Axis(vae.hop, clip_samples, 30 * SAMPLE_RATE)}),
        Graph(name="auk_audio_tower", module=ClipEmbeddings(tower),
              inputs=(TensorSpec("features", f32, ("batch", N_MELS, "mel_frames")),),
              outputs=("embeddings",),
              axes={"batch": Axis(1, 1, 8),
                    "mel_frames": Axis(4, CLIP_SECONDS * TOWER_RATE // HOP_LENGTH, 30 * TOWER_RATE // HOP_LENGTH)}),
    ]
    for graph in graphs:
        graph.module.eval()
    return graphs
