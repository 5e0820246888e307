"""The Qwen3-TTS talker in plain PyTorch: the reference for parity tests and the model code a
vLLM port reuses. Module and parameter names are the checkpoint's `talker.*` names with the
prefix removed, so `load_talker` loads model.safetensors strictly.

  talker.model                   Qwen3 decoder: layers (QK-norm attention, SwiGLU), norm,
                                 codec_embedding [vocab, H], text_embedding [text_vocab, text_H]
  talker.text_projection         ResizeMLP text_H -> text_H -> H (silu, biases)
  talker.codec_head              H -> vocab: logits of codebook 0
  talker.code_predictor          model (5 layers, norm, codec_embedding.{0..14} [2048, H]),
                                 lm_head.{0..14} [2048, Hc], small_to_mtp_projection H -> Hc
                                 (only where Hc != H: 1.7B has it, 0.6B does not)

One 12.5 Hz frame is 16 codes. A decode step: codebook 0 comes from codec_head on the
talker's last hidden state; the code predictor then runs over [hidden, embed(code 0)] and
emits codes 1..15 one at a time (lm_head[i] for code i+1, fed back through
codec_embedding[i]); the next talker input is the sum of the 16 codes' embeddings plus the
next text embedding (the prompt's trailing text, then tts_pad).

RoPE: the reference talker applies multimodal RoPE (mrope_section [24, 20, 20], interleaved)
to position ids of shape [3, B, T], but builds all three rows from the same 1-D positions
(get_rope_index: cumsum of the attention mask; decode: cache offset + rope_deltas, expanded
to 3 rows). With equal rows, choosing a frequency's angle from row 0, 1 or 2 picks the same
angle, so it is exactly 1-D RoPE over positions 0, 1, 2, ... (vLLM-Omni runs the talker as a
plain Qwen3Model for the same reason; tests/qwen3_tts/test_qwen3_tts_talker.py checks the
logits against the reference's MRoPE path). The code predictor uses 1-D RoPE and restarts at
position 0 every frame.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import load_strict
from .checkpoint import TALKER_PREFIX, WEIGHTS_FILE, DecoderShape, Qwen3TTSConfig, TalkerConfig
from ...nn.qwen3 import KVCache, Qwen3Stack

# The reference never lets codebook 0 take the last 1024 codec ids (control tokens, languages,
# speakers) except codec EOS: generate() passes suppress_tokens = [vocab - 1024, vocab) minus
# EOS. For the released vocabulary of 3072 that leaves exactly the 2048 codes of codebook 0.
CONTROL_TAIL = 1024
# generate() passes min_new_tokens=2: EOS is masked for the first two codebook-0 draws.
MIN_FRAMES_BEFORE_EOS = 2
# Qwen3TTSForConditionalGeneration.generate's default repetition_penalty (and
# generation_config.json's); it applies to earlier codebook-0 tokens only.
REPETITION_PENALTY = 1.05

Sampler = Callable[[Tensor, int], Tensor]   # (logits [B, V], step) -> ids [B]


def greedy(logits: Tensor, step: int) -> Tensor:
    return logits.argmax(dim=-1)


class TopKTopPSampler:
    """Temperature, then top-k, then top-p (nucleus), then a draw: the order of transformers'
    logits warpers, which the reference's sampling goes through."""

    def __init__(self, temperature: float = 0.9, top_k: int = 50, top_p: float = 1.0,
                 generator: torch.Generator | None = None):
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator

    def __call__(self, logits: Tensor, step: int) -> Tensor:
        logits = logits.float() / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, order = logits.sort(dim=-1, descending=True)
            probs = ordered.softmax(-1)
            # Keep the most likely tokens until their mass reaches top_p (at least one).
            drop_sorted = probs.cumsum(-1) - probs >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        # Drawn where the request's generator lives (the CPU): a seed then gives the same
        # codes whichever device computed the logits.
        probs = logits.softmax(-1)
        where = self.generator.device if self.generator is not None else probs.device
        return torch.multinomial(probs.to(where), 1, generator=self.generator)[..., 0].to(probs.device)


class TalkerModel(Qwen3Stack):
    """talker.model: the backbone with both embedding tables."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class ResizeMLP(nn.Module):
    """talker.text_projection: text_hidden -> text_hidden -> hidden, silu between."""

    def __init__(self, size_in: int, size_mid: int, size_out: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(size_in, size_mid, bias=True)
        self.linear_fc2 = nn.Linear(size_mid, size_out, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class PredictorModel(Qwen3Stack):
    """talker.code_predictor.model: codebooks 1..G-1 are embedded at the talker's width."""

    def __init__(self, cfg: DecoderShape, talker_hidden: int):
        super().__init__(cfg)
        self.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, talker_hidden)
                                             for _ in range(cfg.num_code_groups - 1))


class CodePredictor(nn.Module):
    def __init__(self, cfg: DecoderShape, talker_hidden: int):
        super().__init__()
        self.model = PredictorModel(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
                                     for _ in range(cfg.num_code_groups - 1))
        # Inputs are at the talker's width; a narrower predictor projects them first. The
        # checkpoint has this layer only when the widths differ (nn.Identity has no weights).
        self.small_to_mtp_projection = (nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
                                        if cfg.hidden_size != talker_hidden else nn.Identity())


# --- the talker -----------------------------------------------------------------------------

class Qwen3TTSTalker(nn.Module):
    def __init__(self, config: Qwen3TTSConfig):
        super().__init__()
        t = config.talker
        self.config = config
        self.model = TalkerModel(t)
        self.text_projection = ResizeMLP(t.text_hidden_size, t.text_hidden_size, t.hidden_size)
        self.codec_head = nn.Linear(t.hidden_size, t.vocab_size, bias=False)
        self.code_predictor = CodePredictor(t.code_predictor, t.hidden_size)

    @property
    def device(self) -> torch.device:
        return self.codec_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.codec_head.weight.dtype

    def ids(self, values) -> Tensor:
        return torch.as_tensor(values, dtype=torch.long, device=self.device)

    # Embeddings ------------------------------------------------------------------------

    def embed_text(self, ids) -> Tensor:
        """Text token ids [...] -> [..., H]: text_embedding, then text_projection."""
        return self.text_projection(self.model.text_embedding(self.ids(ids)))

    def embed_codec(self, ids) -> Tensor:
        return self.model.codec_embedding(self.ids(ids))

    def tts_embeds(self) -> tuple[Tensor, Tensor, Tensor]:
        """The text-track embeddings of tts_bos, tts_eos and tts_pad, [H] each."""
        c = self.config
        bos, eos, pad = self.embed_text([c.tts_bos_token_id, c.tts_eos_token_id, c.tts_pad_token_id])
        return bos, eos, pad

    def frame_embedding(self, codes: Tensor) -> Tensor:
        """codes [..., G] -> [..., H]: the sum of the G codes' embeddings (codebook 0 in the
        talker's codec_embedding, codebook i in the predictor's codec_embedding[i - 1])."""
        codes = self.ids(codes)
        total = self.model.codec_embedding(codes[..., 0])
        for i, table in enumerate(self.code_predictor.model.codec_embedding):
            total = total + table(codes[..., i + 1])
        return total

    # Forward ---------------------------------------------------------------------------

    def forward(self, embeds: Tensor, cache: KVCache | None = None) -> Tensor:
        """Input embeddings [B, T, H] -> final-normed hidden states [B, T, H]."""
        return self.model(embeds, cache)

    def codec_logits(self, hidden: Tensor) -> Tensor:
        return self.codec_head(hidden)

    @torch.no_grad()
    def predict_codes(self, past_hidden: Tensor, code0: Tensor, sampler: Sampler = greedy) -> Tensor:
        """Codes 1..G-1 of a frame for each row: past_hidden [B, H] (the talker's last hidden
        state, whose codec_head gave code0 [B]) -> codes [B, G] with code0 first. `sampler`
        gets (logits [B, 2048], i) for code i + 1."""
        code0 = self.ids(code0)
        return predict_frame(self.code_predictor, past_hidden.to(self.dtype), code0,
                             self.embed_codec(code0), sampler)

    @torch.no_grad()
    def generate_greedy(self, prompt_embeds: Tensor, trailing_text: Tensor, max_frames: int,
                        repetition_penalty: float = REPETITION_PENALTY) -> Tensor:
        """Frames [F, G] (F <= max_frames, up to codebook-0 EOS) for one prompt ([T, H] and
        trailing text [N, H], as prompt.py builds them), both levels greedy: what the
        reference's generate(do_sample=False, subtalker_dosample=False) returns with
        max_new_tokens = max_frames + 1. Recomputes nothing: a KV cache, one row."""
        t = self.config.talker
        pad = self.tts_embeds()[2]
        cache = self.model.new_cache()
        hidden = self(prompt_embeds[None].to(self.dtype), cache)[:, -1]
        frames: list[Tensor] = []
        previous = self.ids([]).view(1, 0)
        for step in range(max_frames):
            logits = constrain_code0(self.codec_logits(hidden), previous, step, t, repetition_penalty)
            code0 = logits.argmax(dim=-1)
            if int(code0) == t.codec_eos_token_id:
                break
            previous = torch.cat([previous, code0[:, None]], dim=1)
            codes = self.predict_codes(hidden, code0, greedy)
            frames.append(codes[0])
            if step + 1 < max_frames:
                text = trailing_text[step] if step < trailing_text.shape[0] else pad
                hidden = self(self.frame_embedding(codes)[:, None] + text.to(self.dtype), cache)[:, -1]
        return torch.stack(frames) if frames else self.ids([]).view(0, t.num_code_groups)


@torch.no_grad()
def predict_frame(predictor: CodePredictor, past_hidden: Tensor, code0: Tensor,
                  code0_embeds: Tensor, sampler: Sampler = greedy) -> Tensor:
    """The code predictor's loop, shared by this talker and the vLLM one: past_hidden [B, H]
    and code0 [B] (with its talker embedding [B, H]) -> codes [B, G], code0 first."""
    cache = predictor.model.new_cache()
    # Each frame starts a fresh sequence: [talker hidden, embed(code 0)] at positions 0, 1.
    step_input = torch.stack([past_hidden, code0_embeds], dim=1)
    codes = [code0]
    for i, head in enumerate(predictor.lm_head):
        hidden = predictor.model(predictor.small_to_mtp_projection(step_input), cache)[:, -1]
        code = sampler(head(hidden), i)
        codes.append(code)
        step_input = predictor.model.codec_embedding[i](code)[:, None]
    return torch.stack(codes, dim=1)


def constrain_code0(logits: Tensor, previous: Tensor, step: int, cfg: TalkerConfig,
                    repetition_penalty: float = REPETITION_PENALTY) -> Tensor:
    """The reference's processing of codebook-0 logits [B, vocab] before the draw at `step`
    (0-based) given the codes drawn before it [B, step]: transformers' repetition penalty
    (earlier codes' logits divided by the penalty, or multiplied where negative), the codec
    control tail masked but for EOS, and EOS masked for the first MIN_FRAMES_BEFORE_EOS draws."""
    logits = logits.clone()
    if previous.numel() and repetition_penalty != 1.0:
        seen = logits.gather(-1, previous)
        logits.scatter_(-1, previous, torch.where(seen < 0, seen * repetition_penalty,
                                                  seen / repetition_penalty))
    blocked = torch.zeros(cfg.vocab_size, dtype=torch.bool, device=logits.device)
    blocked[max(cfg.vocab_size - CONTROL_TAIL, 0):] = True
    blocked[cfg.codec_eos_token_id] = step < MIN_FRAMES_BEFORE_EOS
    return logits.masked_fill(blocked, float("-inf"))


def load_talker(checkpoint, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> Qwen3TTSTalker:
    """The talker of an opened checkpoint (checkpoint.open_checkpoint), its talker.*
    tensors loaded strictly, in eval mode on `device` as `dtype`."""
    talker = Qwen3TTSTalker(checkpoint.config)
    load_strict(talker, checkpoint.tensors(TALKER_PREFIX),
                f"{checkpoint.path(WEIGHTS_FILE)} ({TALKER_PREFIX}*)")
    return talker.to(device=device, dtype=dtype).eval()
