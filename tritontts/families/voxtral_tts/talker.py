"""Voxtral TTS's talker in plain PyTorch: the Ministral backbone under the checkpoint's Mistral
names, the audio embeddings, and a whole-sequence `generate` (the bridge between the
reference modules and the served engine).

  backbone      layers.N.attention.{wq,wk,wv,wo} (GQA), feed_forward.{w1,w2,w3} (SwiGLU),
                attention_norm / ffn_norm / norm (RMSNorm); RoPE on interleaved pairs
                (x0, x1), (x2, x3), ... as Mistral-format weights expect (vLLM's kernels
                rotate halves: tritontts.nn.llama_format.rotate_half_rows reorders wq/wk rows)
  embeddings    text: mm_audio_embeddings.tok_embeddings; a frame of 37 codes: the sum of
                its codes' rows of one table (mm_audio_embeddings.audio_codebook_embeddings
                .embeddings), codebook k offset by the sizes of the codebooks before it
  prompt        [BOS] [BEGIN_AUDIO] [AUDIO] x N [NEXT_AUDIO_TEXT] text [REPEAT_AUDIO_TEXT]
                [BEGIN_AUDIO] (mistral-common's speech request); the N [AUDIO] positions
                take the preset voice's embedding rows instead of a text embedding
  step          the acoustic transformer turns the last position's hidden state into a frame;
                its semantic code END_AUDIO ends the utterance (that frame is not audio); the
                frame's summed embedding is the next position's input
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn.llama_format import Block, interleaved_rope
from .acoustic import END_AUDIO, AcousticConfig, AcousticTransformer
from .checkpoint import BackboneConfig, VoxtralTTSConfig

TEXT_EMBEDDINGS = "mm_audio_embeddings.tok_embeddings.weight"
CODEBOOK_EMBEDDINGS = "mm_audio_embeddings.audio_codebook_embeddings.embeddings.weight"


class Attention(nn.Module):
    def __init__(self, b: BackboneConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = b.n_heads, b.n_kv_heads, b.head_dim, b.rope_theta
        self.wq = nn.Linear(b.dim, b.n_heads * b.head_dim, bias=False)
        self.wk = nn.Linear(b.dim, b.n_kv_heads * b.head_dim, bias=False)
        self.wv = nn.Linear(b.dim, b.n_kv_heads * b.head_dim, bias=False)
        self.wo = nn.Linear(b.n_heads * b.head_dim, b.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:          # [B, T, D], causal, positions 0..T-1
        bsz, t, _ = x.shape
        positions = torch.arange(t, device=x.device)
        q = interleaved_rope(self.wq(x).view(bsz, t, self.heads, self.head_dim), positions, self.theta)
        k = interleaved_rope(self.wk(x).view(bsz, t, self.kv_heads, self.head_dim), positions, self.theta)
        v = self.wv(x).view(bsz, t, self.kv_heads, self.head_dim)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, t, -1))


class FrameEmbeddings(nn.Module):
    """Frames [..., 37] (as the talker makes them, shifted by 2) -> [..., dim]: the sum of the
    codes' rows of one table, codebook k's codes offset by the sizes of those before it."""

    def __init__(self, a: AcousticConfig, dim: int) -> None:
        super().__init__()
        self.table = nn.Embedding(a.embedding_rows, dim)
        self.register_buffer("offsets", torch.tensor([0] + a.codebook_sizes[:-1]).cumsum(0), persistent=False)

    def forward(self, codes: Tensor) -> Tensor:
        return self.table(codes.long().to(self.offsets.device) + self.offsets).sum(dim=-2)


def place_voice(embeds: Tensor, ids: Tensor, voice: Tensor, audio_token_id: int) -> Tensor:
    """The prompt's embeddings [T, dim] with the voice's rows at its [AUDIO] positions (in
    place; their counts must agree)."""
    audio = ids == audio_token_id
    if int(audio.sum()) != voice.shape[0]:
        raise ValueError(f"the prompt has {int(audio.sum())} [AUDIO] positions, the voice {voice.shape[0]} rows")
    embeds[audio] = voice.to(embeds)
    return embeds


class VoxtralTalker(nn.Module):
    """Backbone + audio embeddings + acoustic transformer; load_state_dict takes
    consolidated.safetensors' backbone, mm_audio_embeddings.* and acoustic_transformer.*
    tensors (see `talker_state`)."""

    def __init__(self, config: VoxtralTTSConfig) -> None:
        super().__init__()
        b, a = config.backbone, config.acoustic
        self.config = config
        self.layers = nn.ModuleList(Block(Attention(b), b.dim, b.hidden_dim, b.norm_eps)
                                    for _ in range(b.n_layers))
        self.norm = nn.RMSNorm(b.dim, eps=b.norm_eps)
        self.tok_embeddings = nn.Embedding(b.vocab_size, b.dim)
        self.embed_frames = FrameEmbeddings(a, b.dim)
        self.acoustic_transformer = AcousticTransformer(a)

    def prompt_embeds(self, ids: Tensor, voice: Tensor) -> Tensor:
        """Prompt ids [T] -> [T, dim]: text embeddings, the voice's rows at the [AUDIO] ones."""
        return place_voice(self.tok_embeddings(ids), ids, voice, self.config.audio_token_id)

    def hidden(self, embeds: Tensor) -> Tensor:
        """[B, T, dim] -> final-normed hidden states [B, T, dim]."""
        for layer in self.layers:
            embeds = layer(embeds)
        return self.norm(embeds)

    @torch.no_grad()
    def generate(self, prompt: Tensor, noise: Callable[[], Tensor], max_frames: int, cfg: float = 1.2) -> Tensor:
        """Frames [n, 37] (shifted codes) for one prompt [T, dim], until END_AUDIO (not
        included) or max_frames; noise() gives each frame's [1, 36]. Reruns the whole
        sequence each step (no KV cache): plain and exact."""
        sequence = prompt[None]
        frames = []
        for _ in range(max_frames):
            frame = self.acoustic_transformer.frame(self.hidden(sequence)[:, -1], noise(), cfg)
            if int(frame[0, 0]) == END_AUDIO:
                break
            frames.append(frame[0])
            sequence = torch.cat([sequence, self.embed_frames(frame)[:, None]], dim=1)
        return torch.stack(frames) if frames else torch.zeros(0, 37, dtype=torch.long)


def talker_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """consolidated.safetensors' tensors under VoxtralTalker's names (the codec's and the
    unused output head left out)."""
    out = {}
    for name, tensor in state.items():
        if name == TEXT_EMBEDDINGS:
            out["tok_embeddings.weight"] = tensor
        elif name == CODEBOOK_EMBEDDINGS:
            out["embed_frames.table.weight"] = tensor
        elif name.startswith(("layers.", "norm.", "acoustic_transformer.")):
            out[name] = tensor
    return out
