"""The AuK stages (each a tritontts.serving.stage class named by its config.pbtxt):

  auk_prompt   AuKPromptStage   text, voice, params -> the thinker's prompt ids; a clip's
                                audio-tower embeddings (its <|AUDIO|> places) and VAE latents;
                                the output length and the sampling schedule
  auk_encoder  AuKEncoderStage  vLLM: the thinker's prefill, its layers fused into the
                                condition [tokens, hidden]
  auk_dit      AuKDiTStage      the rectified-flow MMDiT from seeded noise to latents [frames,
                                64], Triton's batches run together (per time grid and CFG)
  auk_vae      AuKVAEStage      latents -> 24 kHz audio, decoded and sent in chunks (a short
                                first one), each exact (context and lookahead around it)

AuK has no token stream: the whole latent sequence comes out of the ODE at once, so the
first audio leaves after the encoder, every DiT step and the VAE's first chunk.

The checkpoint path comes from the launcher (`--checkpoint auk=DIR`, passed to the stages as
TRITONTTS_AUK_CHECKPOINT); tests hand a checkpoint in directly.
"""
from __future__ import annotations

import threading
from typing import Any, AsyncIterator

import numpy as np
import torch

from ...protocol import (
    AUDIO, CHUNK_INDEX, IS_FINAL, MAX_INPUT_CHARS, PARAMS, SAMPLE_RATE, STREAM_ID, TEXT, VOICE,
    InvalidRequest, at_least_one_row, decode_params)
from ...serving.stage import (
    PREPARES_REQUESTS, Inputs, Stage, StageContext, StreamingStage, default_voice_only, one_row_per_stream)
from ...engine.vllm_talker import VllmTalkerStage
from .checkpoint import AuKCheckpoint
from .family import FAMILY
from .request import AuKParams, parse_auk_params

MIN_CLIP_SECONDS, MAX_CLIP_SECONDS = 0.1, 30.0
# vLLM-Omni's offset between the noise seed and the clip's posterior draw (so that a seed
# gives the same noise as there, and the two draws are not copies of each other).
VAE_SEED_OFFSET = 0x5EED_0A0C


def schedule_for(checkpoint: AuKCheckpoint, params: AuKParams) -> tuple[tuple[float, ...], float]:
    """(time grid, guidance weight) of a request: AuK-Flash's distilled grid (no knobs: a
    400 names them), else the request's knobs over the checkpoint's recipe."""
    from .dit import time_grid

    recipe = checkpoint.schedule
    if checkpoint.is_flash:
        asked = params.sampling_asked()
        if asked:
            raise InvalidRequest(f"{', '.join(asked)}: AuK-Flash runs its distilled {recipe.nfe}-step grid only "
                                 "(the student was trained on it); omit them")
        return tuple(recipe.t_grid), recipe.cfg
    sway = recipe.sway if params.sway is None else params.sway
    steps = recipe.nfe if params.num_inference_steps is None else params.num_inference_steps
    try:
        grid = time_grid(steps, sway, params.t_grid)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    cfg = recipe.cfg if params.guidance_scale is None else params.guidance_scale
    return tuple(float(t) for t in grid), cfg


class AuKPromptStage(Stage):
    one_by_one = PREPARES_REQUESTS

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: AuKCheckpoint | None = None):
        from .prompt import PromptBuilder

        super().__init__(context)
        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        self.build = PromptBuilder(self.checkpoint.thinker_root)
        self._clip_models = None
        self._lock = threading.Lock()

    def clip_models(self):
        """(the thinker's audio tower, the VAE), loaded on the first request with a clip."""
        with self._lock:
            if self._clip_models is None:
                from ...weights.checkpoint import read_tensors
                from .audio_tower import load_audio_tower
                from .vae import load_vae

                prefix = "thinker.audio_tower."
                tensors = {}
                for f in self.checkpoint.thinker_files:
                    tensors.update(read_tensors(f, prefix))
                tower = load_audio_tower(tensors, self.checkpoint.audio_config).to(self.device)
                vae = load_vae(self.checkpoint.vae_file, self.checkpoint.vae, self.device)
                self._clip_models = (tower, vae)
            return self._clip_models

    def run(self, inputs: Inputs) -> dict[str, Any]:
        import secrets

        text = inputs.scalar(TEXT, "") or ""
        if len(text) > MAX_INPUT_CHARS:
            raise InvalidRequest(f"input is {len(text)} characters; the limit is {MAX_INPUT_CHARS}")
        params = parse_auk_params(decode_params(inputs.scalar(PARAMS, "")))
        voice = inputs.scalar(VOICE, "") or ""
        default_voice_only(voice, "AuK has no preset voices; use voice 'default', describe "
                           "one in instructions, or send a clip in ref_audio")
        seed = params.seed if params.seed is not None else secrets.randbits(62)
        return {**self.plan(text, params, seed), STREAM_ID: secrets.randbits(63)}

    @torch.no_grad()
    def plan(self, text: str, params: AuKParams, seed: int) -> dict[str, Any]:
        """The later stages' inputs (Triton-free: tests call it directly)."""
        from .prompt import instruction_for, output_frames

        grid, cfg = schedule_for(self.checkpoint, params)
        instruction = instruction_for(text, params, params.ref_audio is not None)
        hidden, latent = self.checkpoint.hidden_size, self.checkpoint.latent_dim
        embeds = np.zeros((0, hidden), np.float32)
        ref = np.zeros((0, latent), np.float32)
        if params.ref_audio is not None:
            embeds, ref = self.clip(params.ref_audio, params.vae_sample, seed)
        frames = output_frames(text, params, ref.shape[0], self.checkpoint.frames_for)
        prompt = self.build(instruction, embeds.shape[0])
        return {"ids": np.asarray(prompt.ids, np.int64), "audio_start": prompt.audio_start,
                "audio_tokens": embeds.shape[0], "audio_embeds": at_least_one_row(embeds),
                "ref_latents": at_least_one_row(ref), "ref_frames": ref.shape[0], "frames": frames,
                "t_grid": np.asarray(grid, np.float32), "cfg": cfg, "seed": seed}

    def clip(self, data: bytes, vae_sample: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """A clip's (audio-tower embeddings [n, hidden], normalized VAE latents [frames, 64])."""
        from ...audio import reference_recording, resample
        from .audio_tower import SAMPLE_RATE as TOWER_RATE
        from .audio_tower import audio_features

        rate, hop = self.checkpoint.sample_rate, self.checkpoint.hop
        audio = reference_recording(data, rate, MIN_CLIP_SECONDS, MAX_CLIP_SECONDS)
        tower, vae = self.clip_models()
        embeds = tower(audio_features(resample(audio, rate, TOWER_RATE)).to(self.device)).cpu()
        # Whole latent frames only: the encoder is causal, so a trailing partial frame changes
        # none of the frames before it.
        wav = torch.from_numpy(audio[: audio.size // hop * hop].astype(np.float32))
        generator = torch.Generator().manual_seed((seed + VAE_SEED_OFFSET) % 2**63) if vae_sample else None
        latents = vae.encode(wav[None].to(self.device), sample=vae_sample, generator=generator)[0].cpu()
        return embeds.float().numpy(), latents.float().numpy()


FORWARDED = ("ref_latents", "ref_frames", "frames", "t_grid", "cfg", "seed")


class AuKEncoderStage(VllmTalkerStage):
    """The thinker's prefill on vLLM (tritontts/families/auk/vllm_model.py): one response per request,
    the fused condition, with what the DiT needs forwarded."""

    shares_rows = True

    def __init__(self, context: StageContext, checkpoint: AuKCheckpoint | None = None):
        from .prompt import IM_END, PromptBuilder
        from .vllm_model import prepare_vllm_encoder, register

        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        end_of_turn = PromptBuilder(self.checkpoint.thinker_root).special[IM_END]
        self.encoder_dir = prepare_vllm_encoder(self.checkpoint, end_of_turn)
        register()
        super().__init__(context)

    def model_path(self) -> str:
        return str(self.encoder_dir)

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        from vllm import SamplingParams

        from ...engine.vllm_frames import FRAMES_ARG, register, release
        from .vllm_model import EncoderRequest

        ids = np.array(inputs.flat("ids"), np.int64)
        if ids.shape[0] >= self.max_model_len:
            raise InvalidRequest(f"the instruction (with its clip) takes {ids.shape[0]} of the encoder's "
                                 f"{self.max_model_len} positions: shorten it or the clip")
        tokens = int(inputs.scalar("audio_tokens"))
        request = EncoderRequest(ids.shape[0], int(inputs.scalar("audio_start")),
                                 torch.from_numpy(np.array(inputs["audio_embeds"][:tokens], np.float32))
                                 if tokens else None)
        key = f"auk-{int(inputs.scalar(STREAM_ID))}"
        register(key, request)
        params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False, extra_args={FRAMES_ARG: key})
        try:
            async for _ in self.generate(ids.tolist(), params, key, inputs.cancelled):
                pass
            condition = request.take()
        finally:
            release(key)
        yield {"condition": condition.numpy(), **{name: inputs[name] for name in FORWARDED}, IS_FINAL: True}


class AuKDiTStage(Stage):
    """Seeded noise -> latents through the DiT's Euler steps; the requests of a Triton batch
    that share a time grid and guidance weight run as one batch (padded rows, masks: each
    equals what it gives alone)."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: AuKCheckpoint | None = None):
        from .dit import load_transformer

        super().__init__(context)
        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        self.dit = load_transformer(self.checkpoint.read_weights(), self.checkpoint.dit).to(self.device)

    def run(self, inputs: Inputs) -> dict[str, Any]:
        (result,) = self.run_batch([inputs])
        if isinstance(result, Exception):
            raise result
        return result

    @torch.no_grad()
    def run_batch(self, batch: list[Inputs], ready=None) -> list[dict[str, Any] | Exception]:
        from .dit import SampleRequest, sample_latents

        results: list[dict[str, Any] | Exception | None] = [None] * len(batch)
        groups: dict[tuple, list[int]] = {}
        requests = {}
        for i, inputs in enumerate(batch):
            grid = tuple(float(t) for t in inputs.flat("t_grid"))
            groups.setdefault((grid, float(inputs.scalar("cfg"))), []).append(i)
            ref = np.array(inputs["ref_latents"][:int(inputs.scalar("ref_frames"))], np.float32)
            requests[i] = SampleRequest(text=torch.from_numpy(np.array(inputs["condition"], np.float32)),
                                        ref=torch.from_numpy(ref), frames=int(inputs.scalar("frames")),
                                        seed=int(inputs.scalar("seed")))
        # A stream's own rows in successive calls (run_in_groups says why).
        calls = [(grid, cfg, members) for (grid, cfg), group in groups.items()
                 for members in one_row_per_stream(batch, group)]
        for grid, cfg, members in calls:
            try:
                latents = sample_latents(self.dit, [requests[i] for i in members], torch.tensor(grid), cfg,
                                         cancelled=lambda: all(batch[i].cancelled() for i in members))
            except Exception as exc:  # noqa: BLE001 - this group's requests fail
                for i in members:
                    results[i] = exc
                continue
            for i, lat in zip(members, latents):
                results[i] = {"latents": lat.float().cpu().numpy()}
        return results  # type: ignore[return-value]


class AuKVAEStage(StreamingStage):
    """The finished latents -> 24 kHz audio in chunks, each decoded with the VAE's context
    and lookahead around it, so the chunks join into exactly the whole-sequence decode.

    Chunk plan (config parameters): first_chunk_frames (10: the first audio leaves soon), then
    each chunk twice the one before, up to chunk_frames (200). Every chunk decodes its context
    again (52 frames back, 7 ahead at released size), so few, growing chunks keep that
    overhead small while a player that started on the first chunk is kept fed whenever the
    decoder runs faster than real time."""

    one_by_one = ("each request is a whole utterance decoded in its own chunk plan, one response per chunk, "
                  "and a stream's next chunk waits on its last; requests of a batch run in turn")

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: AuKCheckpoint | None = None):
        from .vae import CHUNK_FRAMES, FIRST_CHUNK_FRAMES, load_vae

        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        self.vae = load_vae(checkpoint.vae_file, checkpoint.vae).to(self.device)
        self.sample_rate = checkpoint.sample_rate
        self.first = context.int_parameter("first_chunk_frames", FIRST_CHUNK_FRAMES)
        self.most = context.int_parameter("chunk_frames", CHUNK_FRAMES)

    def run(self, inputs: Inputs):
        from .vae import chunk_bounds

        latents = torch.from_numpy(np.array(inputs["latents"], np.float32))[None].to(self.device)
        bounds = list(chunk_bounds(latents.shape[1], self.first, self.most))
        for i, (start, end) in enumerate(bounds):
            if inputs.cancelled():
                return
            audio = self.vae.decode_range(latents, start, end)[0]
            # chunk_index is an input too (the DiT's one response): number this stage's chunks.
            yield {AUDIO: audio.float().cpu().numpy(), SAMPLE_RATE: self.sample_rate, CHUNK_INDEX: i,
                   IS_FINAL: i == len(bounds) - 1}
