"""VoxCPM2's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch). Each talker step runs, besides the
two MiniCPM4 stacks (vLLM's), our patch step: the local DiT's flow matching (10 Euler
steps with classifier-free guidance) makes the next patch from the step's hidden states,
the local encoder embeds it as the next position's input, and the stop head decides; the
audio_vae stage decodes each chunk's latents after their left context with the causal
AudioVAE; the prompt stage encodes a reference to clone with the AudioVAE's encoder. At
tiny size also the backbone: both stacks (ours, talker.VoxCPM2Talker) over a prompt."""
from __future__ import annotations

import json

import torch
from torch import Tensor, nn

from ...nn.runtime import Axis, Graph, TensorSpec
from .audio_vae import AudioVAE, AudioVAEConfig, decoder_context_frames, random_audio_vae_state
from .checkpoint import parse_config
from .prompt import pad_to_patches
from .random_checkpoint import SIZES, config_dict
from .talker import DEFAULT_CFG, DEFAULT_STEPS, VoxCPM2Talker

# model.json's steady chunk (16 patches; the first is 1) after the VAE's left context; a
# 3 s reference to clone (what the contract tests send); a prompt of 64 positions (a
# sentence after a 3 s reference's 19 patches).
CHUNK_PATCHES, REFERENCE_SECONDS, PROMPT_POSITIONS = 16, 3, 64
# The tiny checkpoint's vocabulary is its trained tokenizer's (at most 600 entries); only
# the backbone's unused token table depends on it.
TINY_VOCAB = 600


class PatchStep(nn.Module):
    """One talker step after the two stacks, as VoxCPM2TalkerForVllm runs it: the step's lm
    and residual hidden states [B, H], the previous patch [B, P, D] and the starting noise
    [B, D, P] -> (the new patch [B, P, D], its input embedding [B, H], the stop logits
    [B, 2]), at upstream's default steps and guidance. The talker's methods on its parts
    (the stacks left out: their weights are not this network's)."""

    PARTS = ("feat_encoder", "feat_decoder", "enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj",
             "stop_proj", "stop_head")
    embed_patches = VoxCPM2Talker.embed_patches
    dit_condition = VoxCPM2Talker.dit_condition
    sample_patches = VoxCPM2Talker.sample_patches
    stop_logits = VoxCPM2Talker.stop_logits

    def __init__(self, talker: VoxCPM2Talker) -> None:
        super().__init__()
        for name in self.PARTS:
            setattr(self, name, getattr(talker, name))

    def forward(self, lm_hidden: Tensor, residual: Tensor, previous: Tensor, noise: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        mu = self.dit_condition(lm_hidden, residual)
        patch = self.sample_patches(mu, previous, noise, DEFAULT_STEPS, DEFAULT_CFG)
        return patch, self.embed_patches(patch[:, None])[:, 0], self.stop_logits(lm_hidden)


class Backbone(nn.Module):
    """Both stacks over a prompt, as the whole-sequence generate runs them: base inputs and
    patch embeddings [B, T, H] and the audio positions [B, T] -> (lm hidden, residual
    hidden) [B, T, H]. The talker's parts between and in the stacks (its token table
    rides along in base_lm)."""

    PARTS = ("base_lm", "fsq_layer", "fusion_concat_proj", "residual_lm")
    residual_inputs = VoxCPM2Talker.residual_inputs

    def __init__(self, talker: VoxCPM2Talker) -> None:
        super().__init__()
        for name in self.PARTS:
            setattr(self, name, getattr(talker, name))

    def forward(self, embeds: Tensor, patch_embeds: Tensor, audio_mask: Tensor) -> tuple[Tensor, Tensor]:
        lm_hidden, residual_in = self.residual_inputs(self.base_lm(embeds, causal=True), audio_mask, patch_embeds)
        return lm_hidden, self.residual_lm(residual_in, causal=True)


class VAEDecoder(nn.Module):
    """A window of latent frames [B, D, frames] -> its audio [B, frames * decode_hop] at the
    output rate (AudioVAE.decode: the stage keeps the samples after the left context)."""

    def __init__(self, vae: AudioVAE) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latents: Tensor) -> Tensor:
        return self.vae.decode(latents)


class VAEEncoder(nn.Module):
    """A reference [B, samples] at 16 kHz -> its latent patches [B, n, P, D], padded at the
    end to whole patches (prompt.encode_patches of a reference)."""

    def __init__(self, vae: AudioVAE, patch_size: int) -> None:
        super().__init__()
        self.vae, self.patch_size = vae, patch_size

    def forward(self, audio: Tensor) -> Tensor:
        audio = pad_to_patches(audio, self.patch_size * self.vae.config.encode_hop, at_start=False)
        latents = self.vae.encode(audio)                                     # [B, D, n * P]
        b, d, _ = latents.shape
        return latents.view(b, d, -1, self.patch_size).permute(0, 2, 3, 1)


class _ConfigFile:
    """config.json's mapping in memory, for parse_config (which reads a path)."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def read_text(self, encoding: str | None = None) -> str:
        return json.dumps(self.data)

    def __str__(self) -> str:
        return "config.json"


def random_vae(config: AudioVAEConfig, unused: str) -> AudioVAE:
    """The AudioVAE as load_audio_vae serves it (weight norm folded) without its `unused`
    half, in the random checkpoint's distribution: default init (weight_v zeros) would
    fold to 0 / 0."""
    vae = AudioVAE(config)
    setattr(vae, unused, nn.Identity())
    vae.load_state_dict(random_audio_vae_state(vae))
    return vae.fold_weight_norm().eval()


def torch_networks(size: str) -> list[Graph]:
    size = "tiny" if size == "tiny" else "released"
    vocab = TINY_VOCAB if size == "tiny" else SIZES[size]["lm"]["vocab_size"]
    config = parse_config(_ConfigFile(config_dict(size, vocab)))
    talker = VoxCPM2Talker(config).eval()
    vae_config = AudioVAEConfig.from_dict(config.audio_vae)
    p, d, h, f32 = config.patch_size, config.feat_dim, config.lm.hidden_size, torch.float32
    context = -(-decoder_context_frames(vae_config) // p) * p      # whole patches, as the talker sends
    graphs = [
        Graph(name="voxcpm2_patch_step", module=PatchStep(talker),
              inputs=(TensorSpec("lm_hidden", f32, ("batch", h)), TensorSpec("residual", f32, ("batch", h)),
                      TensorSpec("previous", f32, ("batch", p, d)), TensorSpec("noise", f32, ("batch", d, p))),
              outputs=("patch", "embed", "stop_logits"), axes={"batch": Axis(1, 1, 16)}),
        Graph(name="voxcpm2_vae_decoder", module=VAEDecoder(random_vae(vae_config, "encoder")),
              inputs=(TensorSpec("latents", f32, ("batch", d, "frames")),),
              outputs=("audio",),
              axes={"batch": Axis(1, 1, 8), "frames": Axis(1, context + CHUNK_PATCHES * p, 2048)}),
        Graph(name="voxcpm2_vae_encoder", module=VAEEncoder(random_vae(vae_config, "decoder"), p),
              inputs=(TensorSpec("audio", f32, ("batch", "samples")),),
              outputs=("patches",),
              axes={"batch": Axis(1, 1, 8),
                    "samples": Axis(1, REFERENCE_SECONDS * vae_config.sample_rate, 30 * vae_config.sample_rate)}),
    ]
    if size == "tiny":
        graphs.append(Graph(
            name="voxcpm2_talker_backbone", module=Backbone(talker),
            inputs=(TensorSpec("embeds", f32, ("batch", "positions", h)),
                    TensorSpec("patch_embeds", f32, ("batch", "positions", h)),
                    TensorSpec("audio_mask", torch.bool, ("batch", "positions"))),
            outputs=("lm_hidden", "residual_hidden"),
            axes={"batch": Axis(1, 1, 16), "positions": Axis(1, PROMPT_POSITIONS, 4096)}))
    for graph in graphs:
        graph.module.eval()
    return graphs
