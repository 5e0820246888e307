"""One decode step's audio codes, Triton-free: the rules the reference's generate applies to
the fused audio head's logits (transformers' HiggsAudioV2 generation; boson-ai's serving
samples the same way), per request:

  1. delay pattern: codebook k is held at the stream bos for its first k + 1 steps; once any
     codebook has emitted the stream eos, codebook k is held at the eos from k + 1 steps on
     (so all end together, K steps later)
  2. sampling: temperature, top-k, top-p per codebook, then one multinomial draw per
     codebook from the request's own generator (greedy: argmax)
  3. repetition-aware sampling (RAS): a codebook whose new code already occurs
     ras_win_max_num_repeat times among the last ras_win_len steps (prompt reference
     included; bos/eos not counted) is redrawn from its raw logits' softmax
  4. the step's token for the text stream: the audio token; the delay token from the first
     eos on; the end-of-turn token once every codebook is at the eos (generation stops)

The same operations in the same order as the reference, so that with the same seed the
codes are equal (tests/higgs_audio_v2/test_higgs_audio_v2_talker.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .checkpoint import HiggsAudioV2Config


@dataclass(frozen=True)
class AudioSampling:
    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.95
    ras_win_len: int | None = 7
    ras_win_max_num_repeat: int = 2


def warp(scores: torch.Tensor, s: AudioSampling) -> torch.Tensor:
    """Temperature, top-k, top-p over the last axis (transformers' warpers, in their order)."""
    if s.temperature != 1.0:
        scores = scores / s.temperature
    if s.top_k > 0:
        k = min(s.top_k, scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if s.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - s.top_p)
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores


class AudioCodeSampler:
    """The per-request state of the rules above. `history` holds the steps the model has
    seen as audio ([n, K]: the prompt reference's, then each generated step)."""

    def __init__(self, cfg: HiggsAudioV2Config, sampling: AudioSampling, generator: torch.Generator,
                 history: torch.Tensor | None = None):
        k = cfg.num_codebooks
        self.cfg, self.sampling, self.generator = cfg, sampling, generator
        # The prompt ends with <|audio_out_bos|>: codebook k takes the bos for steps 0..k.
        self.bos_left = torch.arange(k)
        self.eos_left = torch.arange(1, k + 1)
        self.last_token = cfg.audio_bos_token_id
        self.history = history if history is not None else torch.zeros((0, k), dtype=torch.int64)

    def step(self, logits: torch.Tensor) -> tuple[torch.Tensor, int]:
        """logits [K * C] (raw, float32) -> (codes [K] int64, the step's text-stream token)."""
        cfg, s = self.cfg, self.sampling
        raw = logits.float().reshape(cfg.num_codebooks, cfg.codebook_size)
        scores = raw.clone()
        vocab = torch.arange(cfg.codebook_size)
        held = self.bos_left >= 0
        scores[held[:, None] & (vocab != cfg.audio_stream_bos_id)[None]] = float("-inf")
        self.bos_left = self.bos_left - held.long()
        if self.last_token == cfg.audio_delay_token_id:
            self.eos_left = self.eos_left - 1
        ended = self.eos_left <= 0
        scores[ended[:, None] & (vocab != cfg.audio_stream_eos_id)[None]] = float("-inf")
        if s.do_sample:
            probs = warp(scores, s).softmax(dim=-1)
            codes = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        else:
            codes = scores.argmax(dim=-1)
        if s.ras_win_len is not None and self.history.shape[0]:
            window = self.history[-s.ras_win_len:]
            repeats = ((window == codes[None]) & (window != cfg.audio_stream_bos_id)
                       & (window != cfg.audio_stream_eos_id)).sum(dim=0)
            redraw = repeats >= s.ras_win_max_num_repeat
            if redraw.any():
                codes = codes.clone()
                codes[redraw] = torch.multinomial(raw[redraw].softmax(dim=-1), 1, replacement=True,
                                                  generator=self.generator).view(-1)
        is_eos = codes == cfg.audio_stream_eos_id
        token = cfg.audio_token_id
        if is_eos.any() or self.last_token == cfg.audio_delay_token_id:
            token = cfg.audio_delay_token_id
        if is_eos.all():
            token = cfg.eos_token_id
        self.last_token = token
        self.history = torch.cat([self.history, codes[None]])
        return codes, token


def audio_frames(steps: torch.Tensor, cfg: HiggsAudioV2Config, finished: bool) -> int:
    """How many audio frames the generated steps [n, K] (step 0: the all-bos step) hold
    complete: frame i's codebook k is at step 1 + i + k, so n steps complete n - K frames;
    a finished stream's last step (all eos) closes the utterance and holds none."""
    n = steps.shape[0]
    if finished and n and bool((steps[-1] == cfg.audio_stream_eos_id).all()):
        n -= 1
    return max(0, n - cfg.num_codebooks)


def frame_codes(steps: torch.Tensor, cfg: HiggsAudioV2Config, start: int, end: int) -> torch.Tensor:
    """Audio frames [start, end) as codec codes [end - start, K]: the delay undone, and any
    stream bos/eos left inside clipped to the last code (as the reference decodes)."""
    k = cfg.num_codebooks
    out = torch.stack([steps[1 + start + q:1 + end + q, q] for q in range(k)], dim=1)
    return out.clamp(0, cfg.codes - 1)
