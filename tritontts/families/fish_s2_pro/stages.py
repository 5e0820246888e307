"""The Fish Speech S2 Pro stages (each a tritontts.serving.stage class named by its config.pbtxt):

  fish_s2_pro_prompt  FishS2ProPromptStage  text (+ reference) -> upstream's chat prompt
                                            [1 + 10, T]; a reference recording -> its codes
                                            (the codec's encoder at 44.1 kHz, cached by
                                            content); encodes uploaded voices
  fish_s2_pro_talker  FishS2ProTalkerStage  vLLM: the slow AR, the main-token draw and the
                                            fast AR in every step; one response per chunk of
                                            frames (4, then 25) with left context
  fish_s2_pro_codec   FishS2ProCodecStage   a chunk's codes -> 44.1 kHz audio, stateless;
                                            windows of equal length and start batched

The checkpoint path comes from the launcher (`--checkpoint fish_s2_pro=DIR`, passed to the
stages as TRITONTTS_FISH_S2_PRO_CHECKPOINT); tests hand a checkpoint in directly.
"""
from __future__ import annotations

import hashlib
from typing import Any, AsyncIterator

import numpy as np
import torch

from ... import sampling
from ...audio import reference_recording
from ...serving.lru import LRU
from ...sampling import SAMPLING
from ...protocol import (
    AUDIO, IS_FINAL, PARAMS, SAMPLE_RATE, STREAM_ID, InvalidRequest, decode_params)
from ...serving.stage import PREPARES_REQUESTS, Inputs, Stage, StageContext, begin_request, default_voice_only
from ...engine.vllm_talker import FrameChunkTalkerStage
from ...voice import checkpoint_fingerprint, pack_voice, unpack_voice
from .checkpoint import CODEC_FILE, CONFIG_FILE, FishCheckpoint
from .family import FAMILY
from .prompt import FishPromptBuilder, PromptError, Reference
from .request import DEFAULT_MAX_NEW_TOKENS, FishS2ProParams, parse_fish_s2_pro_params

MIN_REF_SECONDS, MAX_REF_SECONDS = 1.0, 30.0
# Decoder states kept at most (a stream cancelled before its last chunk is dropped last-used
# first): about 8 MB each at released size.
STREAMS = 128
# What a stored voice's codes depend on: the codec (and its sizes), the codebook layout.
VOICE_FILES = (CODEC_FILE, CONFIG_FILE)


def load_served_codec(checkpoint: FishCheckpoint, device: str | torch.device = "cpu"):
    from .codec import load_codec, load_codec_file

    path = checkpoint.path(CODEC_FILE)
    return load_codec(load_codec_file(path), checkpoint.codec_config(), str(path), device)


class FishS2ProPromptStage(Stage):
    """The talker's prompt for one request (tritontts.families.fish_s2_pro.prompt)."""

    one_by_one = PREPARES_REQUESTS

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: FishCheckpoint | None = None):
        super().__init__(context)
        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.build = FishPromptBuilder(self.checkpoint.root, self.checkpoint.config)
        self.codec = load_served_codec(self.checkpoint)
        self.references = LRU(64)
        self.fingerprint = checkpoint_fingerprint(self.checkpoint.root, VOICE_FILES)
        self.voice_spec = {"codes": (np.int64, (self.checkpoint.config.num_codebooks, None))}

    def run(self, inputs: Inputs) -> dict[str, Any]:
        start = begin_request(inputs, parse_fish_s2_pro_params)
        default_voice_only(start.voice, "fish_s2_pro has no preset voices; use "
                           "voice 'default' (its own voice, or ref_audio's), or a voice "
                           "uploaded with POST /v1/audio/voices")
        if not start.text.strip():
            raise InvalidRequest("input has nothing to speak")
        try:
            prompt = self.build(start.text, self.reference(start.params))
        except PromptError as exc:
            raise InvalidRequest(str(exc)) from None
        return {"prompt": prompt.numpy(), "max_frames": start.params.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                "seed": start.seed, SAMPLING: sampling.encode(start.params.sampling), STREAM_ID: start.stream_id}

    def reference(self, params: FishS2ProParams) -> Reference | None:
        if params.voice_features is not None:
            arrays, meta = unpack_voice(params.voice_features, FAMILY.name, self.fingerprint, self.voice_spec)
            return Reference(meta.get("ref_text", ""), torch.from_numpy(arrays["codes"]))
        if params.ref_audio is None:
            return None
        return Reference(params.ref_text or "", self.codes(params.ref_audio))

    def codes(self, ref_audio: bytes) -> torch.Tensor:
        """The recording's codes [10, frames] from the codec's encoder, cached by content."""
        def encode() -> torch.Tensor:
            audio = reference_recording(ref_audio, self.codec.config.sample_rate, MIN_REF_SECONDS, MAX_REF_SECONDS)
            return self.codec.encode(torch.from_numpy(audio)[None, None])[0]

        return self.references.get(hashlib.sha256(ref_audio).hexdigest(), encode)

    def voice_fingerprint(self) -> str:
        return self.fingerprint

    def encode_voice(self, inputs: Inputs) -> bytes:
        """A voice for storing: the recording's codes, with its transcript."""
        params = parse_fish_s2_pro_params(decode_params(inputs.scalar(PARAMS, "")))
        if params.ref_audio is None:
            raise InvalidRequest("a voice is stored from ref_audio and ref_text")
        return pack_voice(FAMILY.name, self.fingerprint, {"codes": self.codes(params.ref_audio).numpy()},
                          ref_text=params.ref_text or "")


class FishS2ProTalkerStage(FrameChunkTalkerStage):
    """Frames from the vLLM talker, sent as chunks of codes after up to left_context_frames
    earlier ones, with the window's first frame (the codec's positions are absolute); the
    <|im_end|> frame ends the stream and is not audio."""

    positioned = True

    def __init__(self, context: StageContext, checkpoint: FishCheckpoint | None = None):
        from .vllm_model import prepare_vllm_talker, register

        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.talker_dir = prepare_vllm_talker(self.checkpoint)
        register()
        super().__init__(context)

    def model_path(self) -> str:
        return str(self.talker_dir)

    def is_end(self, frame) -> bool:
        return int(frame[0]) == self.checkpoint.config.im_end_id

    def window_codes(self, frames):
        return frames[:, 1:].numpy().astype(np.int32)

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        from .dual_ar import FishSampling, FrameSampler
        from .vllm_model import FishStream

        c = self.checkpoint.config
        stream_id, seed = int(inputs.scalar(STREAM_ID)), int(inputs.scalar("seed"))
        prompt = torch.from_numpy(np.array(inputs["prompt"], np.int64))
        if prompt.ndim != 2 or prompt.shape[0] != 1 + c.num_codebooks:
            raise InvalidRequest(f"prompt must be [{1 + c.num_codebooks}, T], got {tuple(prompt.shape)}")
        max_frames = self.frame_budget(prompt.shape[1], int(inputs.scalar("max_frames")),
                                       "the text or the reference")
        overrides = sampling.decode(inputs.scalar(SAMPLING, ""))
        defaults = FishSampling()
        sampler = FrameSampler(torch.Generator().manual_seed(seed), FishSampling(
            float(overrides.get("temperature", defaults.temperature)), float(overrides.get("top_p", defaults.top_p))))
        stream = FishStream(prompt, sampler)
        async for chunk in self.stream_frames(prompt[0].tolist(), stream, f"{stream_id}", max_frames,
                                              c.im_end_id, inputs.cancelled):
            yield chunk


class FishS2ProCodecStage(Stage):
    """A chunk's codes -> its 44.1 kHz audio, exactly as one whole decode of the utterance
    would give it: stateful per stream (FishCodec.decode_stream: the decoder transformer's
    keys and values of the last 127 frames per layer and the convolutions' 10-frame context
    carried from chunk to chunk, keyed by stream_id), so each chunk costs only its new
    frames. The decoder's receptive field (1026 frames at released size: its 8-layer
    transformer's 128-frame windows compound) is far longer than any affordable left
    context, so a stateless window could only approximate it. Chunks of different streams
    at the same point (same frames so far, same length) decode as one batch; a stream's
    chunks in one batch run in order. A chunk with no state for its stream (a restarted
    instance, an evicted stream) decodes its window's left context again instead: close to
    the whole decode, not exact."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: FishCheckpoint | None = None):
        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        self.codec = load_served_codec(checkpoint, self.device)
        self.num_codebooks = checkpoint.config.num_codebooks
        self.hop = self.codec.config.hop
        self.sample_rate = self.codec.config.sample_rate
        self.streams = LRU(STREAMS)

    def run(self, inputs: Inputs) -> dict[str, Any]:
        (result,) = self.run_batch([inputs])
        if isinstance(result, Exception):
            raise result
        return result

    def run_batch(self, batch: list[Inputs], ready=None) -> list[dict[str, Any] | Exception]:
        from .codec import DecoderStream

        results: list[Any] = [None] * len(batch)
        work = []                     # (index, stream id, codes to decode, state, samples to skip, final)
        for i, inputs in enumerate(batch):
            try:
                window = np.asarray(inputs["codes"])
                context, first = int(inputs.scalar("left_context")), int(inputs.scalar("first_frame"))
                if window.ndim != 2 or window.shape[1] != self.num_codebooks:
                    raise InvalidRequest(f"codes must be [frames, {self.num_codebooks}], got {tuple(window.shape)}")
                if not 0 <= context <= window.shape[0] or first < 0:
                    raise InvalidRequest(f"left_context {context} / first_frame {first} do not fit a window of "
                                         f"{window.shape[0]} frames")
            except InvalidRequest as exc:
                results[i] = exc
                continue
            work.append((i, int(inputs.scalar(STREAM_ID)), window, context, first, bool(inputs.scalar(IS_FINAL))))
        while work:
            # One chunk per stream per round, in arrival order (a stream's next chunk needs
            # the state its previous one leaves).
            now, later, seen = [], [], set()
            for item in work:
                (later if item[1] in seen else now).append(item)
                seen.add(item[1])
            groups: dict[tuple, list] = {}
            for i, stream, window, context, first, final in now:
                if context == window.shape[0]:
                    # Nothing new to voice: a stream that ended on a chunk boundary sends a
                    # final window of context only. Its audio is empty; its state goes.
                    if final:
                        self.streams.pop(stream)
                    results[i] = {AUDIO: np.zeros(0, np.float32), SAMPLE_RATE: self.sample_rate}
                    continue
                state = self.streams.get(stream)
                if state is not None and state.frames == first + context:
                    codes, skip = window[context:], 0                 # exact: new frames only
                else:
                    # No state for this point of the stream: the window again, from its start.
                    codes, skip, state = window, context, DecoderStream(frames=first)
                key = (state.frames, codes.shape[0], skip, *shape_of(state))
                groups.setdefault(key, []).append((i, stream, codes, state, skip, final))
            for members in groups.values():
                self.decode_group(members, results)
            work = later
        return results

    @torch.no_grad()
    def decode_group(self, members: list, results: list) -> None:
        from .codec import DecoderStream

        states = [m[3] for m in members]
        merged = DecoderStream(
            past=None if states[0].past is None else [
                (torch.cat([s.past[layer][0] for s in states]), torch.cat([s.past[layer][1] for s in states]))
                for layer in range(len(states[0].past))],
            tail=None if states[0].tail is None else torch.cat([s.tail for s in states]),
            frames=states[0].frames)
        codes = torch.from_numpy(np.stack([m[2] for m in members]).astype(np.int64)).transpose(1, 2).to(self.device)
        audio, after = self.codec.decode_stream(codes, merged)
        audio = audio[:, 0].float().cpu().numpy()
        for row, (i, stream, _, _, skip, final) in enumerate(members):
            if final:
                self.streams.pop(stream)
            else:
                self.streams.put(stream, DecoderStream(
                    past=[(k[row:row + 1], v[row:row + 1]) for k, v in after.past],
                    tail=after.tail[row:row + 1], frames=after.frames))
            results[i] = {AUDIO: audio[row, skip * self.hop:], SAMPLE_RATE: self.sample_rate}


def shape_of(state) -> tuple[int, int]:
    """What must agree for states to decode as one batch: cached keys and tail lengths."""
    return (0 if state.past is None else state.past[0][0].shape[1],
            0 if state.tail is None else state.tail.shape[-1])
