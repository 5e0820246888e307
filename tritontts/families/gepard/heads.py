"""Gepard's audio side of the talker, around the Qwen3.5 backbone (Triton-free, vLLM-free):

  heads      32 linear FSQ heads (checkpoint: codebook_heads.N) read the backbone's last
             hidden state; one frame is one code per head, each drawn by Gumbel-max at the
             sidecar's temperature from the request's own generator
  stop       stop_head: sigmoid > stop_threshold ends the utterance (never on the first frame)
  embed      the next position's input: audio_embed_proj (Linear, GELU, Linear, LayerNorm
             without affine) over the 32 codes' audio_embeddings, concatenated
  prefix     null_prefix: the default voice's rows, put at the prompt's speaker slots

The heads are applied as one fused matrix (their weights stacked once after loading): the
31 heads after the first are gathered into a [31, 8] table padded with -inf, so one argmax
draws them all. The noise a row sees is drawn from its generator in a fixed order (the 31
heads' table, then head 0's row), so it does not depend on the other rows of the batch.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .checkpoint import GepardConfig


class GepardHeads(nn.Module):
    def __init__(self, config: GepardConfig):
        super().__init__()
        hidden, levels = config.backbone.hidden_size, config.head_levels
        self.levels = levels
        self.temperature = config.temperature
        self.stop_threshold = config.stop_threshold
        self.codebook_heads = nn.ModuleList(nn.Linear(hidden, n) for n in levels)
        self.stop_head = nn.Linear(hidden, 1)
        self.audio_embeddings = nn.ModuleList(nn.Embedding(n, config.audio_embed_dim) for n in levels)
        self.audio_embed_proj = nn.Sequential(
            nn.Linear(len(levels) * config.audio_embed_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden),
            nn.LayerNorm(hidden, elementwise_affine=False))
        self.null_prefix = nn.Parameter(torch.zeros(config.speaker_slots, hidden))
        width = max(levels[1:], default=levels[0])
        gather = torch.zeros(len(levels) - 1, width, dtype=torch.long)
        pad = torch.full((len(levels) - 1, width), float("-inf"))
        for i, n in enumerate(levels[1:], start=1):
            offset = sum(levels[:i])         # a Python int: built on any default device (meta too)
            gather[i - 1, :n] = torch.arange(offset, offset + n)
            pad[i - 1, :n] = 0.0
        self.register_buffer("_gather", gather, persistent=False)
        self.register_buffer("_pad", pad, persistent=False)
        self._fused: tuple[Tensor, Tensor] | None = None
        # A scale on the frame embedding, 1 unless the checkpoint carries audio_embed_scale.
        self.embed_scale = 1.0

    def fused_logits(self, hidden: Tensor) -> Tensor:
        """[n, H] -> [n, sum(levels)]: every head's logits side by side (the stacked weights
        made again when the heads move to another device or dtype)."""
        weight = self.codebook_heads[0].weight
        if self._fused is None or self._fused[0].device != weight.device or self._fused[0].dtype != weight.dtype:
            self._fused = (torch.cat([h.weight for h in self.codebook_heads]).detach(),
                           torch.cat([h.bias for h in self.codebook_heads]).detach())
        return torch.nn.functional.linear(hidden, *self._fused)

    def draw(self, hidden: Tensor, generators: list[torch.Generator]) -> tuple[Tensor, Tensor]:
        """[n, H] -> codes [n, 32] int64 and the stop head's verdict [n] bool."""
        fused = self.fused_logits(hidden)
        rest = fused[:, self._gather].float() + self._pad
        first = fused[:, :self.levels[0]].float()
        noise_rest = torch.stack([gumbel(rest.shape[1:], g, rest.device) for g in generators])
        noise_first = torch.stack([gumbel(first.shape[1:], g, first.device) for g in generators])
        codes = torch.cat([(first / self.temperature + noise_first).argmax(-1, keepdim=True),
                           (rest / self.temperature + noise_rest).argmax(-1)], dim=1)
        stop = torch.sigmoid(self.stop_head(hidden).float())[:, 0] > self.stop_threshold
        return codes, stop

    def embed(self, codes: Tensor) -> Tensor:
        """codes [n, 32] -> the next positions' input embeddings [n, H]."""
        parts = [table(codes[:, i]) for i, table in enumerate(self.audio_embeddings)]
        return self.audio_embed_proj(torch.cat(parts, dim=-1)) * self.embed_scale


def gumbel(shape, generator: torch.Generator, device) -> Tensor:
    """Gumbel(0, 1) noise drawn from `generator` (on its device), fp32."""
    u = torch.rand(shape, generator=generator, device=generator.device)
    return (-torch.log(-torch.log(u.clamp_min(1e-20)))).to(device)


def heads_state(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """The checkpoint tensors GepardHeads owns (everything but the backbone and lm_head)."""
    return {k: v for k, v in weights.items() if k.split(".", 1)[0] in (
        "codebook_heads", "stop_head", "audio_embeddings", "audio_embed_proj", "null_prefix")}
