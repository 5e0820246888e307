"""The VoxCPM2 stages (each a tritontts.serving.stage class named by its config.pbtxt):

  voxcpm2_prompt     VoxCPM2PromptStage    text (+ reference) -> the talker's sequence: ids,
                                           audio mask, reference latent patches (AudioVAE
                                           encoder, cached by content); encodes uploaded voices
  voxcpm2_talker     VoxCPM2TalkerStage    vLLM: both LMs, the local DiT in every step; one
                                           response per chunk of patches, with left context
  voxcpm2_audio_vae  VoxCPM2AudioVAEStage  a chunk's latents (after their left context) ->
                                           48 kHz audio; stateless, batched across streams

The checkpoint path comes from the launcher (`--checkpoint voxcpm2=DIR`, passed to the
stages as TRITONTTS_VOXCPM2_CHECKPOINT); tests hand a checkpoint in directly.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any, AsyncIterator

import numpy as np
import torch

from ... import sampling
from ...audio import reference_recording
from ...serving.lru import LRU
from ...sampling import SAMPLING
from ...protocol import IS_FINAL, PARAMS, STREAM_ID, InvalidRequest, decode_params
from ...serving.stage import (
    PREPARES_REQUESTS,
    Inputs, Stage, StageContext, begin_request, default_voice_only)
from ...serving.window_decoder import WindowDecoderStage
from ...engine.vllm_talker import VllmTalkerStage, chunk_sizes
from ...voice import checkpoint_fingerprint, pack_voice, unpack_voice
from .audio_vae import AudioVAEConfig, decoder_context_frames, load_audio_vae
from .checkpoint import VoxCPM2Checkpoint
from .family import FAMILY
from .prompt import TalkerPrompt, TextTokenizer, build_prompt, encode_patches, max_steps
from .request import VoxCPM2Params, parse_voxcpm2_params
from .talker import DEFAULT_CFG, DEFAULT_MAX_LEN, DEFAULT_MIN_LEN, DEFAULT_STEPS

MIN_REF_SECONDS, MAX_REF_SECONDS = 1.0, 30.0
# What a stored voice's latents depend on: the VAE, and the patch size / latent width.
VOICE_FILES = ("audiovae.safetensors", "config.json")
VOICE_ARRAYS = ("reference", "continuation")      # patches [n, patch_size, feat_dim]


def load_vae(checkpoint: VoxCPM2Checkpoint, device: str | torch.device = "cpu"):
    return load_audio_vae(checkpoint.path("audiovae.safetensors"),
                          AudioVAEConfig.from_dict(checkpoint.config.audio_vae or {}), device)


def clean_text(text: str) -> str:
    """Upstream's: newlines as spaces, runs of whitespace as one."""
    return re.sub(r"\s+", " ", text.replace("\n", " ")).strip()


class VoxCPM2PromptStage(Stage):
    """The talker's input sequence for one request (tritontts.families.voxcpm2.prompt)."""

    one_by_one = PREPARES_REQUESTS

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: VoxCPM2Checkpoint | None = None):
        super().__init__(context)
        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.tokenizer = TextTokenizer(self.checkpoint.root)
        self.vae = load_vae(self.checkpoint)
        self.references = LRU(64)
        self.fingerprint = checkpoint_fingerprint(self.checkpoint.root, VOICE_FILES)
        c = self.checkpoint.config
        self.voice_spec = {name: (np.float32, (None, c.patch_size, c.feat_dim)) for name in VOICE_ARRAYS}

    def run(self, inputs: Inputs) -> dict[str, Any]:
        start = begin_request(inputs, parse_voxcpm2_params)
        default_voice_only(start.voice, "voxcpm2 has no preset voices; use "
                           "voice 'default' (its own voice, or ref_audio's), or a voice "
                           "uploaded with POST /v1/audio/voices")
        params = start.params
        c = self.checkpoint.config
        target = self.tokenizer(clean_text(start.text))
        if not target:
            raise InvalidRequest("input has nothing to speak")
        reference, continuation, ref_text = self.voice(params)
        # Upstream tokenizes transcript + text as one string, joined as they are.
        ids = self.tokenizer(ref_text + clean_text(start.text)) if continuation is not None else target
        prompt = build_prompt(ids, c.patch_size, c.feat_dim,
                              reference=reference, continuation=continuation)
        return {"ids": prompt.ids.numpy(), "audio_mask": prompt.audio_mask.numpy() > 0,
                "feats": prompt.feats.numpy(), "context_patches": prompt.context.shape[0],
                "max_steps": max_steps(len(target), params.max_new_tokens or DEFAULT_MAX_LEN),
                "seed": start.seed, SAMPLING: sampling.encode(params.sampling), STREAM_ID: start.stream_id}

    def voice(self, params: VoxCPM2Params) -> tuple[torch.Tensor | None, torch.Tensor | None, str]:
        """(reference patches, continuation patches, transcript) for the request's clone_mode;
        (None, None, "") without a voice to clone."""
        if params.voice_features is not None:
            arrays, meta = unpack_voice(params.voice_features, FAMILY.name, self.fingerprint, self.voice_spec,
                                        optional=("continuation",))
            mode = params.clone_mode or ("both" if "continuation" in arrays else "reference")
            if mode != "reference" and "continuation" not in arrays:
                raise InvalidRequest(f"clone_mode {mode!r} continues the recording, and this voice was "
                                     "stored without ref_text; use clone_mode 'reference' or upload "
                                     "the voice again with its transcript")
            reference = torch.from_numpy(arrays["reference"]) if mode != "continuation" else None
            continuation = torch.from_numpy(arrays["continuation"]) if mode != "reference" else None
            return reference, continuation, meta.get("ref_text", "")
        if params.ref_audio is None:
            return None, None, ""
        mode = params.clone_mode
        reference = self.patches(params.ref_audio, at_start=False) if mode != "continuation" else None
        continuation = self.patches(params.ref_audio, at_start=True) if mode != "reference" else None
        return reference, continuation, params.ref_text or ""

    def patches(self, ref_audio: bytes, at_start: bool) -> torch.Tensor:
        """The recording's latent patches, padded at the start (a continuation prompt) or at
        the end (a reference), cached by content."""
        key = ("c" if at_start else "r") + hashlib.sha256(ref_audio).hexdigest()

        def encode() -> torch.Tensor:
            audio = reference_recording(ref_audio, self.vae.config.sample_rate, MIN_REF_SECONDS, MAX_REF_SECONDS)
            return encode_patches(self.vae, torch.from_numpy(audio), self.checkpoint.config.patch_size, at_start)

        return self.references.get(key, encode)

    def voice_fingerprint(self) -> str:
        return self.fingerprint

    def encode_voice(self, inputs: Inputs) -> bytes:
        """A voice for storing: the recording's reference patches, and with a transcript its
        continuation patches too (the transcript is stored with them)."""
        params = parse_voxcpm2_params(decode_params(inputs.scalar(PARAMS, "")))
        if params.ref_audio is None:
            raise InvalidRequest("a voice is stored from ref_audio (with ref_text to allow continuation)")
        arrays = {"reference": self.patches(params.ref_audio, at_start=False).numpy()}
        if params.ref_text is not None:
            arrays["continuation"] = self.patches(params.ref_audio, at_start=True).numpy()
        return pack_voice(FAMILY.name, self.fingerprint, arrays, ref_text=params.ref_text or "")


class VoxCPM2TalkerStage(VllmTalkerStage):
    """Patches from the vLLM talker, sent as chunks of latents with the left context the VAE
    stage needs to decode them exactly (the continuation prompt's last patches first, as
    upstream decodes them)."""

    shares_rows = True   # the model and this stage share PatchStreams

    def __init__(self, context: StageContext, checkpoint: VoxCPM2Checkpoint | None = None):
        from .vllm_model import prepare_vllm_talker, register

        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.talker_dir = prepare_vllm_talker(self.checkpoint)
        register()
        super().__init__(context)
        chunks = self.settings["chunks"]
        self.chunk_patches = int(chunks["patches"])
        self.first_chunk_patches = int(chunks["first_patches"])
        self.chunk_growth = chunks.get("growth")
        vae_config = AudioVAEConfig.from_dict(self.checkpoint.config.audio_vae or {})
        self.left_context_frames = int(chunks.get("left_context_frames") or decoder_context_frames(vae_config))
        c = self.checkpoint.config
        self.patch_size, self.feat_dim = c.patch_size, c.feat_dim

    def model_path(self) -> str:
        return str(self.talker_dir)

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        from ...engine.vllm_frames import register, release
        from .vllm_model import GO_ON, PatchStream, sampling_params

        stream_id, seed = int(inputs.scalar(STREAM_ID)), int(inputs.scalar("seed"))
        ids = torch.from_numpy(np.array(inputs.flat("ids"), np.int64))
        audio = torch.from_numpy(np.array(inputs.flat("audio_mask"), np.float32))
        feats = torch.from_numpy(np.array(inputs["feats"], np.float32))
        context = feats[feats.shape[0] - int(inputs.scalar("context_patches")):]
        prompt = TalkerPrompt(ids, audio, feats, context)
        steps = min(int(inputs.scalar("max_steps")), self.max_model_len - prompt.length)
        if steps < 1:
            raise InvalidRequest(f"the prompt needs {prompt.length} of the talker's {self.max_model_len} "
                                 "positions: shorten the text or the reference")
        overrides = sampling.decode(inputs.scalar(SAMPLING, ""))
        key = f"{stream_id}"
        stream = PatchStream(prompt, torch.Generator().manual_seed(seed),
                             int(overrides.get("inference_timesteps", DEFAULT_STEPS)),
                             float(overrides.get("cfg_value", DEFAULT_CFG)))
        register(key, stream)
        try:
            sizes = chunk_sizes(self.chunk_patches, self.first_chunk_patches, self.chunk_growth)
            sent, size = 0, next(sizes)
            patches = stream.patches    # the model appends as it makes them
            async for _ in self.generate([GO_ON] * prompt.length, sampling_params(key, steps, DEFAULT_MIN_LEN),
                                         key, inputs.cancelled):
                while len(patches) >= sent + size:
                    yield self.chunk(context, patches, sent, sent + size, final=False)
                    sent, size = sent + size, next(sizes)
            # No patch at all, or a stop on a chunk boundary: an empty final chunk.
            yield self.chunk(context, patches, sent, len(patches), final=True)
        finally:
            release(key)

    def chunk(self, context: torch.Tensor, patches: list, start: int, end: int, final: bool) -> dict[str, Any]:
        """Patches [start, end) as latent frames [n, D], after up to left_context_frames
        earlier frames (the continuation context's first). Patch u of the utterance is
        context[u] for u < len(context), else patches[u - len(context)]."""
        c, p = context.shape[0], self.patch_size
        begin = c + start                                   # first new patch, in the utterance
        first = max(0, begin - -(-self.left_context_frames // p))
        window = [context[u] if u < c else patches[u - c] for u in range(first, c + end)]
        if not window or end <= start:   # no patch at all, or a stop on a chunk boundary: no new audio
            return {"latents": np.zeros((1, self.feat_dim), np.float32), "left_context": 1, IS_FINAL: final}
        latents = torch.stack(window).reshape(-1, self.feat_dim)
        return {"latents": latents.numpy(), "left_context": (begin - first) * p, IS_FINAL: final}


class VoxCPM2AudioVAEStage(WindowDecoderStage):
    """A chunk's latent frames -> its audio at the VAE's output rate (48 kHz), stateless: the
    decoder is causal, so with its receptive field as left context a window decodes its new
    frames exactly as the whole utterance would (audio_vae.decoder_context_frames)."""

    window = "latents"

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: VoxCPM2Checkpoint | None = None):
        super().__init__(context)
        self.device = torch.device(context.device)
        self.vae = load_vae(checkpoint or context.open_checkpoint(FAMILY), self.device)
        self.samples_per_frame = self.vae.config.decode_hop
        self.sample_rate = self.vae.config.out_sample_rate

    def check_window(self, window: np.ndarray) -> None:
        if window.ndim != 2 or window.shape[1] != self.vae.config.latent_dim:
            raise InvalidRequest(f"latents must be [frames, {self.vae.config.latent_dim}], got {tuple(window.shape)}")

    @torch.no_grad()
    def decode_windows(self, windows: np.ndarray) -> np.ndarray:
        latents = torch.from_numpy(windows.astype(np.float32)).transpose(1, 2).to(self.device)
        return self.vae.decode(latents).float().cpu().numpy()
