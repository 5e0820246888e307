"""OmniVoice's generator in plain PyTorch: a bidirectional Qwen3 that fills a grid of
8 codebooks x T frames of masked audio codes in a fixed number of unmasking steps.

One sequence is [style tokens | text tokens | reference codes | T masked frames]; text
positions embed their token (row 0 of the ids), audio positions embed the sum of their 8
codes (audio_embeddings, one table with codebook c at offset c * audio_vocab_size). Every
position sees every other position of its own sequence (no causal mask). With classifier-
free guidance each request also runs an unconditional sequence: its T target frames alone.

Each step runs the backbone over all sequences at once, laid out in rows: sequences are
packed into rows of ROW_TOKENS (or the longest sequence), longest first, attention kept
within each sequence by a block mask and positions restarting at 0. One row per sequence
would pad every unconditional sequence to the conditional length; one row for the whole
batch would make attention quadratic in the batch. Then, per request:
  log p   = log_softmax((1 + g) * cond - g * uncond)  (the mask id never predicted)
  tokens  = argmax log p                               (or top-10% Gumbel sampling)
  score   = max log p - layer_penalty * codebook index + Gumbel(position_temperature)
and the k highest-scoring still-masked cells take their tokens, k from a time-shifted
schedule that unmasks all 8 * T cells by the last step. The Gumbel noise comes from the
request's own generator (its seed), so a request's codes do not depend on its batch.

(1 + g) * cond - g * uncond is the reference's log_softmax(c + g * (c - u)) over
log-softmaxed c and u with the per-position normalizers taken out: they shift every class
alike, and the final log_softmax removes any shift.

Parameter names are the checkpoint's (llm.*, audio_embeddings, audio_heads), so
`load_generator` loads model.safetensors strictly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import load_strict
from ...nn.qwen3 import Qwen3Stack
from .checkpoint import OmniVoiceCheckpoint, OmniVoiceConfig, WEIGHTS_FILE

# Rows of the packed layout hold up to this many tokens (more when one sequence is longer).
ROW_TOKENS = 256
# The reference ignores codebook_layer_offsets when it is in the file (a derived buffer).
DERIVED_WEIGHTS = ("codebook_layer_offsets",)


class Backbone(Qwen3Stack):
    """llm.*: Qwen3Model (embed_tokens, layers, norm)."""

    def __init__(self, shape):
        super().__init__(shape)
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)


class OmniVoiceGenerator(nn.Module):
    def __init__(self, config: OmniVoiceConfig):
        super().__init__()
        self.config = config
        codebooks, vocab, hidden = config.num_audio_codebook, config.audio_vocab_size, config.llm.hidden_size
        self.llm = Backbone(config.llm)
        self.audio_embeddings = nn.Embedding(codebooks * vocab, hidden)
        self.audio_heads = nn.Linear(hidden, codebooks * vocab, bias=False)
        self.register_buffer("codebook_offsets", torch.arange(codebooks) * vocab, persistent=False)
        # Where `logits` runs when not in PyTorch (tritontts.nn.runtime: onnxruntime, TensorRT),
        # set by the stage from logits_graph.
        self.logits_runner = None

    def step_logits(self, ids: Tensor, audio: Tensor, sequence: Tensor, positions: Tensor) -> Tensor:
        """`logits`, on the runtime the stage chose."""
        if self.logits_runner is not None:
            return self.logits_runner(ids, audio, sequence, positions)[0]
        return self.logits(ids, audio, sequence, positions)

    def logits(self, ids: Tensor, audio: Tensor, sequence: Tensor, positions: Tensor) -> Tensor:
        """Rows of packed sequences -> audio logits [R, C, W, V] (float32).

        ids [R, C, W] int64: a text position repeats its token in every codebook row; audio
        positions hold their 8 codes. audio [R, W] bool. sequence [R, W]: which sequence
        each position is in (attention stays inside it; padding is a sequence of its own).
        positions [R, W]: RoPE positions within the sequence."""
        text = self.llm.embed_tokens(ids[:, 0])
        # Text positions look up row offsets only (their product with `audio` is 0) and are
        # replaced below: one gather for all rows, no indexing by mask.
        codes = ids * audio[:, None] + self.codebook_offsets[:, None]
        embeds = torch.where(audio[..., None], self.audio_embeddings(codes).sum(1), text)
        mask = (sequence[:, :, None] == sequence[:, None, :])[:, None]
        hidden = self.llm(embeds, mask=mask, positions=positions)
        rows, width = ids.shape[0], ids.shape[2]
        logits = self.audio_heads(hidden).float().view(rows, width, self.config.num_audio_codebook, -1)
        return logits.transpose(1, 2)


def logits_graph(model: OmniVoiceGenerator, max_rows: int = 32, max_tokens: int = 4096):
    """One unmasking step's network as a tritontts.nn.runtime Graph: rows of packed sequences
    (a one-sentence request with guidance is ~200 tokens: one row of ROW_TOKENS)."""
    from ...nn.runtime import Axis, Graph, Method, TensorSpec

    cfg = model.config
    return Graph(
        name="omnivoice_generator_logits", module=Method(model, "logits"),
        inputs=(TensorSpec("ids", torch.int64, ("rows", cfg.num_audio_codebook, "tokens"),
                           high=cfg.audio_vocab_size),
                TensorSpec("audio", torch.bool, ("rows", "tokens")),
                TensorSpec("sequence", torch.int64, ("rows", "tokens"), high=4),
                TensorSpec("positions", torch.int64, ("rows", "tokens"), high=ROW_TOKENS)),
        outputs=("logits",),
        axes={"rows": Axis(1, 2, max_rows), "tokens": Axis(1, min(ROW_TOKENS, max_tokens), max_tokens)},
        output_axes={"logits": {0: "rows", 2: "tokens"}})


def load_generator(checkpoint: OmniVoiceCheckpoint, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> OmniVoiceGenerator:
    from safetensors.torch import load_file

    model = OmniVoiceGenerator(checkpoint.config)
    state = {k: v for k, v in load_file(str(checkpoint.path(WEIGHTS_FILE))).items()
             if k not in DERIVED_WEIGHTS}
    load_strict(model, state, str(checkpoint.path(WEIGHTS_FILE)))
    return model.to(device=device, dtype=dtype).eval()


# --- unmasking ----------------------------------------------------------------------------

@dataclass(frozen=True)
class UnmaskSettings:
    """The reference's generation defaults (OmniVoiceGenerationConfig)."""
    num_steps: int = 32
    guidance_scale: float = 2.0
    t_shift: float = 0.1
    layer_penalty: float = 5.0
    position_temperature: float = 5.0
    class_temperature: float = 0.0


@dataclass
class UnmaskJob:
    """One sequence to fill: ids [C, L] whose last `frames` columns are the mask id, audio
    from column `audio_start` on (reference codes, then the target)."""
    ids: Tensor
    audio_start: int
    frames: int
    seed: int
    settings: UnmaskSettings = field(default_factory=UnmaskSettings)


def unmask_schedule(frames: int, codebooks: int, num_steps: int, t_shift: float) -> list[int]:
    """Cells to unmask at each step: the time-shifted fraction t' = s t / (1 + (s - 1) t) of
    all cells, rounded up, the last step taking what is left."""
    total = frames * codebooks
    t = torch.linspace(0.0, 1.0, num_steps + 1)
    t = (t_shift * t / (1 + (t_shift - 1) * t)).tolist()
    left, counts = total, []
    for step in range(num_steps):
        count = left if step == num_steps - 1 else min(math.ceil(total * (t[step + 1] - t[step])), left)
        counts.append(count)
        left -= count
    return counts


def _gumbel(values: Tensor, temperature: float, generator: torch.Generator) -> Tensor:
    u = torch.rand(values.shape, generator=generator, device=values.device, dtype=values.dtype)
    return values / temperature - torch.log(-torch.log(u + 1e-10) + 1e-10)


def _top_tenth(log_probs: Tensor) -> Tensor:
    """Only the top 10% of classes keep their value (class sampling draws among them)."""
    k = math.ceil(0.1 * log_probs.shape[-1])
    values, index = log_probs.topk(k, dim=-1)
    return torch.full_like(log_probs, float("-inf")).scatter_(-1, index, values)


class _Packed:
    """The batch's sequences in rows: per job a conditional sequence and, with guidance, an
    unconditional one (its target frames alone); placed longest first into the first row
    with room (rows of ROW_TOKENS, or of the longest sequence)."""

    def __init__(self, jobs: list[UnmaskJob], device: torch.device):
        pieces = []                                     # (ids [C, n], audio start, job, part)
        for index, job in enumerate(jobs):
            pieces.append((job.ids, job.audio_start, index, 0))
            if job.settings.guidance_scale != 0:
                pieces.append((job.ids[:, job.ids.shape[1] - job.frames:], 0, index, 1))
        width = max(ROW_TOKENS, max(p[0].shape[1] for p in pieces))
        rows: list[list] = []
        used: list[int] = []
        placed = {}
        for piece in sorted(pieces, key=lambda p: -p[0].shape[1]):
            n = piece[0].shape[1]
            row = next((r for r, u in enumerate(used) if u + n <= width), None)
            if row is None:
                rows.append([])
                used.append(0)
                row = len(rows) - 1
            placed[(piece[2], piece[3])] = (row, used[row], n)
            rows[row].append((piece, used[row]))
            used[row] += n
        width = max(used)
        codebooks = jobs[0].ids.shape[0]
        self.ids = torch.zeros((len(rows), codebooks, width), dtype=torch.long)
        self.audio = torch.zeros((len(rows), width), dtype=torch.bool)
        self.sequence = torch.full((len(rows), width), -1, dtype=torch.long)   # -1: padding
        self.positions = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            for number, ((ids, audio_start, _, _), start) in enumerate(row):
                n = ids.shape[1]
                self.ids[r, :, start:start + n] = ids
                self.audio[r, start + audio_start:start + n] = True
                self.sequence[r, start:start + n] = number
                self.positions[r, start:start + n] = torch.arange(n)
        self.ids, self.audio = self.ids.to(device), self.audio.to(device)
        self.sequence, self.positions = self.sequence.to(device), self.positions.to(device)
        # Where each job's target frames are: (row, first column) for cond and uncond.
        self.cond, self.uncond = [], []
        for index, job in enumerate(jobs):
            row, start, n = placed[(index, 0)]
            self.cond.append((row, start + n - job.frames))
            self.uncond.append(placed[(index, 1)][:2] if (index, 1) in placed else None)


@torch.inference_mode()
def unmask(model: OmniVoiceGenerator, jobs: list[UnmaskJob], cancelled=lambda: False) -> list[Tensor]:
    """Fill every job's masked frames; jobs of one call share num_steps (a batch moves in
    lockstep). Returns codes [C, frames] int64 per job. `cancelled()` is asked between steps:
    True stops the batch (the caller has nobody left to answer)."""
    if not jobs:
        return []
    steps = jobs[0].settings.num_steps
    if any(job.settings.num_steps != steps for job in jobs):
        raise ValueError("one unmasking batch needs one num_steps")
    cfg = model.config
    mask_id, codebooks = cfg.audio_mask_id, cfg.num_audio_codebook
    device = model.audio_heads.weight.device
    packed = _Packed(jobs, device)
    schedules = [unmask_schedule(job.frames, codebooks, steps, job.settings.t_shift) for job in jobs]
    generators = [torch.Generator(device=device).manual_seed(job.seed) for job in jobs]
    tokens = [torch.full((codebooks, job.frames), mask_id, dtype=torch.long, device=device) for job in jobs]
    penalty = torch.arange(codebooks, device=device, dtype=torch.float32)[:, None]
    for step in range(steps):
        if cancelled():
            raise InterruptedError("cancelled")
        logits = model.step_logits(packed.ids, packed.audio, packed.sequence, packed.positions)
        for index, job in enumerate(jobs):
            count = schedules[index][step]
            if count <= 0:
                continue
            s, frames = job.settings, job.frames
            row, start = packed.cond[index]
            cond = logits[row, :, start:start + frames]
            if s.guidance_scale != 0:
                urow, ustart = packed.uncond[index]
                uncond = logits[urow, :, ustart:ustart + frames]
                log_probs = F.log_softmax((1 + s.guidance_scale) * cond - s.guidance_scale * uncond, dim=-1)
            else:
                log_probs = F.log_softmax(cond, dim=-1)
            log_probs[..., mask_id] = float("-inf")
            if s.class_temperature > 0:
                predicted = _gumbel(_top_tenth(log_probs), s.class_temperature,
                                    generators[index]).argmax(dim=-1)
            else:
                predicted = log_probs.argmax(dim=-1)
            scores = log_probs.max(dim=-1).values - penalty * s.layer_penalty
            if s.position_temperature > 0:
                scores = _gumbel(scores, s.position_temperature, generators[index])
            current = tokens[index]
            scores = scores.masked_fill(current != mask_id, float("-inf"))
            chosen = torch.topk(scores.flatten(), count).indices
            flat = current.flatten()
            flat[chosen] = predicted.flatten()[chosen]
            tokens[index] = current = flat.view(codebooks, frames)
            packed.ids[row, :, start:start + frames] = current
            if packed.uncond[index] is not None:
                urow, ustart = packed.uncond[index]
                packed.ids[urow, :, ustart:ustart + frames] = current
    return tokens
