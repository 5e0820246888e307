"""VoxCPM2's talker (everything in model.safetensors) in plain PyTorch: the module tree the
checkpoint loads into strictly, the per-step pieces the vLLM model reuses
(tritontts.families.voxcpm2.vllm_model), and a whole-sequence `generate` that is the parity bridge
between upstream (voxcpm 2.0.3, VoxCPM2Model._inference) and the served engine.

One step makes one patch of `patch_size` latents (6.25 steps/s at 25 latents/s):

  base_lm      MiniCPM4 over input embeddings: text ids embedded x scale_emb (muP), or an
               audio patch's LocEnc embedding projected by enc_to_lm_proj
  fsq_layer    the base LM's output at audio positions goes through FSQ ("lm hidden")
  residual_lm  a second, shallower MiniCPM4 over fusion_concat_proj([lm hidden, the
               position's patch embedding, zero at text positions]) ("residual hidden")
  feat_decoder the local DiT's flow matching (LocalCFM) makes the next patch from
               lm_to_dit_proj(lm hidden) ++ res_to_dit_proj(residual hidden), conditioned on
               the previous patch
  stop head    stop_head(silu(stop_proj(lm hidden))), argmax; a stop is accepted only after
               `min_len` + 1 steps, and the step that stops still keeps its patch

The patch made from position p's hidden states is the input of position p + 1 (through
feat_encoder and enc_to_lm_proj), both for the base LM and for the residual LM's fusion.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import load_strict
from .checkpoint import LocalConfig, VoxCPM2Checkpoint, VoxCPM2Config
from .local import LocalCFM, LocDiT, LocEnc, ScalarQuantizer
from .minicpm4 import MiniCPM4Config, MiniCPM4Stack
from .prompt import TalkerPrompt

# Upstream's _generate defaults.
DEFAULT_STEPS = 10
DEFAULT_CFG = 2.0
DEFAULT_MIN_LEN = 2
DEFAULT_MAX_LEN = 2000


def stack_config(config: VoxCPM2Config, **overrides) -> MiniCPM4Config:
    """The base LM's MiniCPM4Config (with `overrides`: the residual LM and the local
    modules copy it and replace a few fields, as upstream does)."""
    lm = config.lm
    values = dict(
        hidden_size=lm.hidden_size, intermediate_size=lm.intermediate_size,
        num_attention_heads=lm.num_attention_heads, num_key_value_heads=lm.num_key_value_heads,
        num_hidden_layers=lm.num_hidden_layers, rms_norm_eps=lm.rms_norm_eps, use_mup=lm.use_mup,
        scale_depth=lm.scale_depth, rope_theta=lm.rope_theta,
        max_position_embeddings=lm.max_position_embeddings,
        original_max_position_embeddings=lm.rope_original_max_position,
        long_factor=lm.rope_long_factor, short_factor=lm.rope_short_factor,
        kv_channels=lm.kv_channels)
    values.update(overrides)
    return MiniCPM4Config(**values)


def residual_config(config: VoxCPM2Config) -> MiniCPM4Config:
    return stack_config(config, num_hidden_layers=config.residual_lm_num_layers,
                        no_rope=config.residual_lm_no_rope)


def local_config(config: VoxCPM2Config, local: LocalConfig) -> MiniCPM4Config:
    return stack_config(config, hidden_size=local.hidden_dim, intermediate_size=local.ffn_dim,
                        num_attention_heads=local.num_heads, num_hidden_layers=local.num_layers,
                        kv_channels=local.kv_channels)


# (stack name "base_lm" or "residual_lm", layer index) -> that layer's attention module.
AttentionFactory = Callable[[str, int], nn.Module]


class VoxCPM2Talker(nn.Module):
    def __init__(self, config: VoxCPM2Config, attention: AttentionFactory | None = None) -> None:
        super().__init__()
        self.config = config
        lm = config.lm
        h = lm.hidden_size

        def layers(stack: str):
            return (lambda i: attention(stack, i)) if attention else None

        self.base_lm = MiniCPM4Stack(stack_config(config), layers("base_lm"))
        self.base_lm.embed_tokens = nn.Embedding(lm.vocab_size, h)
        self.residual_lm = MiniCPM4Stack(residual_config(config), layers("residual_lm"))
        self.feat_encoder = LocEnc(local_config(config, config.encoder), config.feat_dim)
        self.feat_decoder = LocalCFM(LocDiT(local_config(config, config.dit), config.feat_dim),
                                     config.feat_dim, config.dit_mean_mode)
        self.fsq_layer = ScalarQuantizer(h, h, config.fsq_latent_dim, config.fsq_scale)
        self.enc_to_lm_proj = nn.Linear(config.encoder.hidden_dim, h)
        self.lm_to_dit_proj = nn.Linear(h, config.dit.hidden_dim)
        self.res_to_dit_proj = nn.Linear(h, config.dit.hidden_dim)
        self.fusion_concat_proj = nn.Linear(2 * h, h)
        self.stop_proj = nn.Linear(h, h)
        self.stop_head = nn.Linear(h, 2, bias=False)
        self.scale_emb = lm.scale_emb if lm.use_mup else 1.0

    # The per-step pieces (shared with the vLLM model) -------------------------------------

    def embed_patches(self, patches: Tensor) -> Tensor:
        """Patches [..., T, P, D] -> their input embeddings [..., T, H]."""
        return self.enc_to_lm_proj(self.feat_encoder(patches))

    def prompt_inputs(self, prompt: TalkerPrompt) -> tuple[Tensor, Tensor]:
        """The prompt's base-LM inputs [T, H] and patch embeddings [T, H] (zero at text
        positions): text embeddings x scale_emb where text_mask, patch embeddings where
        audio_mask (upstream masks by multiplying; so does this)."""
        dtype = self.enc_to_lm_proj.weight.dtype
        feat = self.embed_patches(prompt.feats[None].to(dtype))[0]
        text = self.base_lm.embed_tokens(prompt.ids) * self.scale_emb
        text_mask, audio_mask = prompt.text_mask[:, None].to(dtype), prompt.audio_mask[:, None].to(dtype)
        return text_mask * text + audio_mask * feat, audio_mask * feat

    def residual_inputs(self, base_out: Tensor, audio_mask: Tensor, patch_embeds: Tensor
                        ) -> tuple[Tensor, Tensor]:
        """Base LM outputs [..., H] -> (lm hidden: FSQ'd at audio positions, the residual
        LM's inputs). `patch_embeds` are zero at text positions."""
        audio = audio_mask[..., None].to(base_out.dtype)
        lm_hidden = self.fsq_layer(base_out) * audio + base_out * (1 - audio)
        return lm_hidden, self.fusion_concat_proj(torch.cat((lm_hidden, patch_embeds), dim=-1))

    def dit_condition(self, lm_hidden: Tensor, residual_hidden: Tensor) -> Tensor:
        return torch.cat((self.lm_to_dit_proj(lm_hidden), self.res_to_dit_proj(residual_hidden)), dim=-1)

    def sample_patches(self, mu: Tensor, previous: Tensor, noise: Tensor, steps: int = DEFAULT_STEPS,
                       cfg: float | Tensor = DEFAULT_CFG) -> Tensor:
        """mu [B, 2 * dit_hidden], previous patches [B, P, D], noise [B, D, P] -> patches
        [B, P, D]. `cfg` may be one value per row ([B])."""
        return self.feat_decoder(mu, previous.transpose(1, 2).contiguous(), noise.to(mu.dtype),
                                 n_timesteps=steps, cfg_value=cfg).transpose(1, 2)

    def stop_logits(self, lm_hidden: Tensor) -> Tensor:
        return self.stop_head(F.silu(self.stop_proj(lm_hidden)))

    # Whole-sequence generation (tests' bridge between upstream and the engine) -----------

    @torch.no_grad()
    def generate(self, prompt: TalkerPrompt, noise: Callable[[], Tensor], *, steps: int = DEFAULT_STEPS,
                 cfg: float = DEFAULT_CFG, min_len: int = DEFAULT_MIN_LEN,
                 max_len: int = DEFAULT_MAX_LEN) -> Tensor:
        """The generated patches [n, P, D] (n <= max_len) for one prompt, `noise()` giving
        each step's [1, D, P] starting noise in order. Both LMs rerun over the whole
        sequence each step (no KV cache): slow, plain, exact."""
        base_in, patch_embeds = self.prompt_inputs(prompt)
        audio_mask = prompt.audio_mask.to(base_in.dtype)
        previous = prompt.feats[-1:].to(base_in.dtype)
        patches = []
        for step in range(max_len):
            base_out = self.base_lm(base_in[None], causal=True)[0]
            lm_hidden, res_in = self.residual_inputs(base_out, audio_mask, patch_embeds)
            res_out = self.residual_lm(res_in[None], causal=True)[0]
            mu = self.dit_condition(lm_hidden[-1:], res_out[-1:])
            patch = self.sample_patches(mu, previous, noise(), steps, cfg)
            patches.append(patch[0])
            previous = patch
            if step > min_len and int(self.stop_logits(lm_hidden[-1]).argmax()) == 1:
                break
            embed = self.embed_patches(patch[:, None])[0]
            base_in = torch.cat((base_in, embed))
            patch_embeds = torch.cat((patch_embeds, embed))
            audio_mask = torch.cat((audio_mask, audio_mask.new_ones(1)))
        return torch.stack(patches)


def load_talker(checkpoint: VoxCPM2Checkpoint, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> VoxCPM2Talker:
    """The talker of an opened checkpoint, model.safetensors loaded strictly, in eval mode."""
    from safetensors.torch import load_file

    path = checkpoint.path("model.safetensors")
    talker = VoxCPM2Talker(checkpoint.config)
    load_strict(talker, load_file(str(path)), str(path))
    return talker.to(device=device, dtype=dtype).eval()
