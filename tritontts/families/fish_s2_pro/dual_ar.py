"""Fish Speech S2 Pro's dual-AR talker in plain PyTorch (ours), under the checkpoint's names,
with upstream's sampling; the bridge between the references and the served engine.

  slow AR     text_model.model.*: a Qwen3-4B-shaped decoder in the original LLaMA format
              (fused wqkv, QK-norm per head before RoPE, RoPE on interleaved pairs with its
              cos / sin tables rounded through bfloat16 as upstream stores them), tied output
  input       a position whose main token is <|semantic:c|> also carries the frame's codes:
              (embeddings[token] + sum_k codebook_embeddings[code_k + k * codebook_size])
              / sqrt(1 + num_codebooks); other positions embeddings[token] alone
  main token  the slow AR's logits restricted to the semantic tokens and <|im_end|>, drawn
              (then redrawn by repetition-aware sampling, below); <|im_end|> ends the stream
  fast AR     audio_decoder.*: 4 layers over the frame's 10 positions (a cache per frame):
              position 0 is the slow AR's final-normed hidden state, position i the fast
              embedding of code i - 1 (code 0 = main token - <|semantic:0|>); the output at
              position i gives code i's logits, i = 1 .. num_codebooks - 1

Sampling (upstream's `sample`, in its order, from the request's generator): logits filtered
to the 30 most likely and a top-p nucleus on the raw logits, then divided by the temperature;
a draw is argmax(p / -log u) with u uniform over the whole vocabulary. Each frame draws the
main token twice (at the request's temperature / top-p, then at 1.0 / 0.9): when the first is
a semantic token among the last 10 frames' main tokens (the frames after the first), the
second is taken. Then codes 1-9, one draw each.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn.llama_format import Block, interleaved_rope
from ...nn.qwen3 import KVCache
from .checkpoint import FishConfig, TransformerConfig

TOP_K = 30
RAS_WINDOW = 10
RAS_TEMPERATURE = 1.0
RAS_TOP_P = 0.9


class Attention(nn.Module):
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.base = c.n_head, c.n_local_heads, c.head_dim, c.rope_base
        self.wqkv = nn.Linear(c.dim, (c.n_head + 2 * c.n_local_heads) * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_head * c.head_dim, c.dim, bias=False)
        self.qk_norm = c.qk_norm
        # Upstream's RoPE tables are bfloat16 (vLLM-Omni's fast AR computes them in fp32: its
        # parity test sets None to compare everything else).
        self.rope_table_dtype: torch.dtype | None = torch.bfloat16
        if c.qk_norm:
            self.q_norm = nn.RMSNorm(c.head_dim, eps=c.norm_eps)
            self.k_norm = nn.RMSNorm(c.head_dim, eps=c.norm_eps)

    def forward(self, x: Tensor, positions: Tensor, cache: KVCache, layer: int) -> Tensor:
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                      self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim)
        k = k.view(b, t, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = interleaved_rope(q, positions, self.base, self.rope_table_dtype).transpose(1, 2)
        k = interleaved_rope(k, positions, self.base, self.rope_table_dtype).transpose(1, 2)
        k, v = cache.extend(layer, k, v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2))
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        mask = None
        if t > 1:      # causal over the cached past and the new positions
            past = k.shape[2] - t
            mask = torch.arange(past + t, device=x.device)[None] <= past + torch.arange(t, device=x.device)[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class Transformer(nn.Module):
    """Embeddings, blocks, final norm; the fast one adds its output head and (for the slow
    one's input) the codebook embeddings, as the checkpoint files them."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(Block(Attention(c), c.dim, c.intermediate_size, c.norm_eps)
                                    for _ in range(c.n_layer))
        self.norm = nn.RMSNorm(c.dim, eps=c.norm_eps)

    def forward(self, x: Tensor, positions: Tensor, cache: KVCache) -> Tensor:
        """[B, T, D] at positions [T] (after the cache's) -> final-normed [B, T, D]."""
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, cache, i)
        return self.norm(x)


class FastTransformer(Transformer):
    def __init__(self, config: FishConfig) -> None:
        super().__init__(config.fast)
        self.codebook_embeddings = nn.Embedding(config.codebook_size * config.num_codebooks, config.slow.dim)
        self.output = nn.Linear(config.fast.dim, config.fast.vocab_size, bias=False)


class TextModel(nn.Module):
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.model = Transformer(c)


@dataclass
class FishSampling:
    temperature: float = 0.8
    top_p: float = 0.8


def filtered_probs(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: int = TOP_K) -> Tensor:
    """[V] -> probabilities: the top_k most likely and the top-p nucleus of the raw logits
    (the most likely always kept), then the temperature (upstream's order)."""
    ordered, order = torch.sort(logits, descending=True)
    cumulative = torch.cumsum(F.softmax(ordered, dim=-1), dim=-1)
    drop = (cumulative > top_p) | (torch.arange(logits.shape[-1], device=logits.device) >= top_k)
    drop[0] = False
    drop = drop.scatter(0, order, drop)
    return F.softmax(logits.masked_fill(drop, float("-inf")) / torch.clip(temperature, min=1e-5), dim=-1)


def draw(probs: Tensor, generator: torch.Generator) -> int:
    """argmax(p / -log u), u uniform per entry (an exponential race: a draw from p)."""
    u = torch.empty_like(probs).uniform_(generator=generator)
    return int(torch.argmax(probs / -torch.log(u)))


@dataclass
class FrameSampler:
    """One request's draws: its generator, settings and repetition window."""
    generator: torch.Generator
    sampling: FishSampling = field(default_factory=FishSampling)
    recent: deque = field(default_factory=lambda: deque(maxlen=RAS_WINDOW))
    frames: int = 0

    def settings(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        # Made as upstream makes them: the Python floats in the model's dtype.
        return (torch.tensor(self.sampling.temperature, dtype=dtype), torch.tensor(self.sampling.top_p, dtype=dtype))

    def main(self, logits: Tensor, config: FishConfig) -> int:
        """The main token from the slow AR's logits [V] (already restricted)."""
        temperature, top_p = self.settings(logits.dtype)
        first = draw(filtered_probs(logits, temperature, top_p), self.generator)
        high = draw(filtered_probs(logits, torch.tensor(RAS_TEMPERATURE, dtype=logits.dtype),
                                   torch.tensor(RAS_TOP_P, dtype=logits.dtype)), self.generator)
        token = high if (self.frames > 0 and config.is_semantic(first) and first in self.recent) else first
        if self.frames > 0:          # upstream's window starts after the first frame
            self.recent.append(token)
        self.frames += 1
        return token

    def code(self, logits: Tensor) -> int:
        temperature, top_p = self.settings(logits.dtype)
        return draw(filtered_probs(logits, temperature, top_p), self.generator)


def position_inputs(token_embeds: Tensor, tokens: Tensor, codes: Tensor, fast: "FastTransformer",
                    config: FishConfig) -> Tensor:
    """The slow AR's inputs [..., D] from the main tokens' embeddings [..., D], the tokens
    [...] and their codes [..., K] (any values where the token is not semantic)."""
    semantic = ((tokens >= config.semantic_begin_id) & (tokens <= config.semantic_end_id))[..., None]
    offsets = torch.arange(config.num_codebooks, device=codes.device) * config.codebook_size
    rows = (codes.clamp(0, config.codebook_size - 1) + offsets).masked_fill(~semantic, 0)
    summed = fast.codebook_embeddings(rows).sum(dim=-2)
    return torch.where(semantic, (token_embeds + summed) / math.sqrt(config.num_codebooks + 1), token_embeds)


def decode_frames(fast: "FastTransformer", config: FishConfig, hidden: Tensor, logits: Tensor,
                  samplers: list[FrameSampler]) -> Tensor:
    """Final-normed hidden [B, D] of each row's last position and its restricted main logits
    [B, V] -> frames [B, 1 + K]: the main token, then its K codes (code 0 from the main token,
    codes 1.. from the fast AR batched over the rows, each row drawing from its own sampler)."""
    c = config
    main = [s.main(logits[b], c) for b, s in enumerate(samplers)]
    frame = torch.zeros(len(samplers), 1 + c.num_codebooks, dtype=torch.long)
    frame[:, 0] = torch.tensor(main)
    frame[:, 1] = (frame[:, 0] - c.semantic_begin_id).clamp(0, c.codebook_size - 1)
    cache = KVCache(len(fast.layers))
    fast(hidden[:, None], torch.tensor([0]), cache)          # position 0: its output unused
    x = fast.embeddings(frame[:, 1].to(hidden.device))[:, None]
    for i in range(1, c.num_codebooks):
        code_logits = fast.output(fast(x, torch.tensor([i]), cache)[:, 0])
        frame[:, 1 + i] = torch.tensor([s.code(code_logits[b]) for b, s in enumerate(samplers)])
        x = fast.embeddings(frame[:, 1 + i].to(hidden.device))[:, None]
    return frame


class FishDualAR(nn.Module):
    """load_state_dict takes the checkpoint's text_model.model.* and audio_decoder.* tensors."""

    def __init__(self, config: FishConfig) -> None:
        super().__init__()
        self.config = config
        self.text_model = TextModel(config.slow)
        self.audio_decoder = FastTransformer(config)
        if not config.tie_word_embeddings:
            self.text_model.output = nn.Linear(config.slow.dim, config.slow.vocab_size, bias=False)
        allowed = torch.full((config.slow.vocab_size,), float("-inf"))
        allowed[config.semantic_begin_id:config.semantic_end_id + 1] = 0.0
        allowed[config.im_end_id] = 0.0
        self.register_buffer("allowed", allowed, persistent=False)

    @property
    def slow(self) -> Transformer:
        return self.text_model.model

    def embed(self, tokens: Tensor, codes: Tensor) -> Tensor:
        """Main tokens [B, T] and their codes [B, T, K] -> the slow AR's inputs [B, T, D]."""
        return position_inputs(self.slow.embeddings(tokens), tokens, codes, self.audio_decoder, self.config)

    def main_logits(self, hidden: Tensor) -> Tensor:
        """Final-normed hidden [..., D] -> logits over the allowed tokens [..., V] (-inf elsewhere)."""
        if self.config.tie_word_embeddings:
            logits = F.linear(hidden, self.slow.embeddings.weight)
        else:
            logits = self.text_model.output(hidden)
        return logits + self.allowed

    def frame(self, hidden: Tensor, samplers: list[FrameSampler]) -> Tensor:
        return decode_frames(self.audio_decoder, self.config, hidden, self.main_logits(hidden), samplers)

    @torch.no_grad()
    def generate(self, tokens: Tensor, codes: Tensor, sampler: FrameSampler, max_frames: int) -> Tensor:
        """One prompt (tokens [T], codes [T, K]) -> frames [n, 1 + K] up to and without the
        <|im_end|> frame, or max_frames; KV-cached, one position per step."""
        c = self.config
        cache = KVCache(len(self.slow.layers))
        x = self.embed(tokens[None], codes[None])
        hidden = self.slow(x, torch.arange(tokens.shape[0]), cache)[:, -1]
        frames = []
        for step in range(max_frames):
            frame = self.frame(hidden, [sampler])
            if int(frame[0, 0]) == c.im_end_id:
                break
            frames.append(frame[0])
            x = self.embed(frame[:, :1], frame[:, None, 1:])
            hidden = self.slow(x, torch.tensor([tokens.shape[0] + step]), cache)[:, -1]
        return torch.stack(frames) if frames else torch.zeros(0, 1 + c.num_codebooks, dtype=torch.long)
