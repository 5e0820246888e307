"""The Qwen3-TTS stages (each a tritontts.serving.stage class named by its config.pbtxt):

  qwen3_tts_prompt    Qwen3TTSPromptStage    text, voice, params -> the talker's prompt
                                             embeddings, per-step text embeddings, and (Base)
                                             the reference codes; speaker / reference cached
  qwen3_tts_talker    Qwen3TTSTalkerStage    vLLM, code predictor inside each step; one
                                             response per chunk of 16-code frames
  qwen3_tts_code2wav  Qwen3TTSCode2WavStage  a chunk's codes (with left context) -> its audio

The checkpoint path comes from the launcher (`--checkpoint qwen3_tts=DIR`, passed to the
stages as TRITONTTS_QWEN3_TTS_CHECKPOINT); tests hand a checkpoint in directly.
"""
from __future__ import annotations

import hashlib
from typing import Any, AsyncIterator

import numpy as np
import torch

from ...audio import reference_recording
from ...serving.lru import LRU
from ...protocol import (
    AUDIO, at_least_one_row, IS_FINAL, PARAMS, SAMPLE_RATE, STREAM_ID, InvalidRequest,
    decode_params)
from ...serving.stage import PREPARES_REQUESTS, GroupedStage, Inputs, Stage, StageContext, begin_request
from ... import sampling
from ...sampling import SAMPLING
from ...engine.vllm_talker import VllmTalkerStage, chunk_sizes
from ...voice import EMBEDDING_MODE, checkpoint_fingerprint, pack_voice, unpack_voice

from .checkpoint import Qwen3TTSCheckpoint
from .family import FAMILY, ICL, XVEC
from .prompt import TextTokenizer, base_prompt, custom_voice_prompt, speaker_row_prompt, voice_design_prompt
from .request import CHECKPOINT_NAMES, Qwen3TTSParams, check_task, parse_qwen3_tts_params
from .talker import CONTROL_TAIL, load_talker

SAMPLE_RATE_HZ = 24000
CODE_GROUPS = 16
MIN_REF_SECONDS, MAX_REF_SECONDS = 1.0, 30.0


def export_graphs(checkpoint: Qwen3TTSCheckpoint) -> list:
    """The networks the code2wav stage may run on onnxruntime / TensorRT."""
    from .code2wav import code2wav_graphs, load_code2wav

    return list(code2wav_graphs(load_code2wav(checkpoint.path("speech_tokenizer"))))


class Qwen3TTSPromptStage(Stage):
    one_by_one = PREPARES_REQUESTS

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: Qwen3TTSCheckpoint | None = None):
        super().__init__(context)
        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.tokenizer = TextTokenizer(self.checkpoint)
        # The prompt needs the talker's text and codec tables (the backbone comes along).
        self.talker = load_talker(self.checkpoint)
        with torch.no_grad():   # the same for every request
            self.pad_embed = self.talker.tts_embeds()[2].float().numpy()
        self.speaker_encoder = self.speech_encoder = None
        if self.checkpoint.kind == "base":
            from .speaker_encoder import load_speaker_encoder
            from .speech_encoder import load_speech_encoder

            self.speaker_encoder = load_speaker_encoder(self.checkpoint.root)
            self.speech_encoder = load_speech_encoder(self.checkpoint.root)
        # Speaker embeddings and reference codes by content (a voice is cloned many times).
        self.references = LRU(64)
        # What a stored voice's features depend on: the encoders' weights and the tokenizer.
        root = self.checkpoint.root
        self.fingerprint = checkpoint_fingerprint(root, [
            name for name in ("model.safetensors", "speech_tokenizer", "tokenizer.json", "vocab.json",
                              "merges.txt", "tokenizer_config.json") if (root / name).exists()])
        # A stored voice's vector is one speaker row of the prompt: the x-vector (Base, whose
        # enc_dim is the talker's width) or a CustomVoice row (e.g. a blend of presets).
        self.row_dim = self.checkpoint.config.talker.hidden_size
        self.voice_spec = {"embedding": (np.float32, (self.row_dim,)),
                           "codes": (np.int64, (None, CODE_GROUPS)), "ref_ids": (np.int64, (None,))}

    @torch.no_grad()
    def run(self, inputs: Inputs) -> dict[str, Any]:
        start = begin_request(inputs, parse_qwen3_tts_params)
        prompt, ref_codes = self.prompt(start.text, start.voice, start.params)
        max_frames = start.params.max_new_tokens or self.checkpoint.generation.max_new_tokens
        return {
            "prompt_embeds": prompt.embeds.float().numpy(),
            "step_embeds": at_least_one_row(prompt.trailing_text.float().numpy()),
            "step_count": prompt.trailing_text.shape[0],
            "pad_embed": self.pad_embed,
            "ref_codes": at_least_one_row(ref_codes),
            "ref_frames": ref_codes.shape[0],
            "max_frames": max_frames,
            "first_chunk_frames": start.params.initial_codec_chunk_frames or 0,
            "seed": start.seed,
            SAMPLING: sampling.encode(start.params.sampling),
            STREAM_ID: start.stream_id,
        }

    @torch.no_grad()
    def prompt(self, text: str, voice: str, params: Qwen3TTSParams):
        """(TalkerPrompt, reference codes [R, 16] int32: empty unless in-context cloning)."""
        ckpt = self.checkpoint
        task = check_task(params, ckpt.kind, languages=ckpt.languages,
                          speaker_embedding_dim=ckpt.config.speaker_embedding_dim,
                          model_size=ckpt.config.model_size)
        ids = self.tokenizer.assistant_ids(text)
        no_codes = np.zeros((0, CODE_GROUPS), np.int32)
        if task == "CustomVoice":
            instruct = self.tokenizer.instruct_ids(params.instructions) if params.instructions else None
            if params.voice_features is not None:
                if voice not in ("", "default"):
                    raise InvalidRequest(f"voice {voice!r} and a stored voice (voice_features): the stored "
                                         "voice replaces the preset speaker; use voice 'default'")
                return speaker_row_prompt(self.talker, ids, self.stored_row(params.voice_features),
                                          params.language, instruct,
                                          non_streaming=params.non_streaming_mode), no_codes
            speaker = self.speaker(voice)
            return custom_voice_prompt(self.talker, ids, speaker, params.language, instruct,
                                       non_streaming=params.non_streaming_mode), no_codes
        self.require_default_voice(voice, task)
        if task == "VoiceDesign":
            return voice_design_prompt(self.talker, ids, self.tokenizer.instruct_ids(params.instructions),
                                       params.language, non_streaming=params.non_streaming_mode), no_codes
        embedding, codes, ref_ids = self.reference(params)
        if codes is None:
            return base_prompt(self.talker, ids, embedding, params.language,
                               non_streaming=params.non_streaming_mode), no_codes
        prompt = base_prompt(self.talker, ids, embedding, params.language, ref_ids=ref_ids,
                             ref_codes=codes, non_streaming=params.non_streaming_mode)
        return prompt, codes.numpy().astype(np.int32)

    def reference(self, params: Qwen3TTSParams):
        """The voice Base clones: (x-vector [H], and for in-context cloning the reference's
        codes [R, 16] and transcript ids; else None, None)."""
        if params.voice_features is not None:
            arrays = self.stored(params.voice_features)
            embedding = torch.from_numpy(arrays["embedding"])
            if params.x_vector_only_mode or "codes" not in arrays:
                return embedding, None, None
            return embedding, torch.from_numpy(arrays["codes"]), arrays["ref_ids"].tolist()
        if params.speaker_embedding is not None:
            return torch.tensor(params.speaker_embedding, dtype=torch.float32), None, None
        audio = self.reference_audio(params.ref_audio)
        key = hashlib.sha256(audio.tobytes()).hexdigest()
        embedding = self.references.get("x" + key, lambda: self.speaker_encoder.embed(audio))
        if params.x_vector_only_mode:
            return embedding, None, None
        codes = self.references.get("c" + key, lambda: self.speech_encoder.encode(audio))
        return embedding, codes, self.tokenizer.ref_ids(params.ref_text)

    def voice_fingerprint(self) -> str:
        return self.fingerprint

    def stored(self, blob: bytes) -> dict[str, np.ndarray]:
        """A stored voice's arrays, checked: its `mode` metadata (absent in voices stored
        before it was written) agrees with whether it holds reference codes."""
        arrays, meta = unpack_voice(blob, FAMILY.name, self.fingerprint, self.voice_spec,
                                    optional=("codes", "ref_ids"))
        if ("codes" in arrays) != ("ref_ids" in arrays):
            raise InvalidRequest("voice_features hold reference codes without their "
                                 "transcript ids (or the other way round); upload the voice again")
        mode = meta.get("mode")
        if mode is not None and (mode == ICL.name) != ("codes" in arrays):
            raise InvalidRequest(f"voice_features say mode {mode!r} but hold "
                                 f"{'reference codes' if 'codes' in arrays else 'no reference codes'}; "
                                 "upload the voice again")
        return arrays

    def stored_row(self, blob: bytes) -> torch.Tensor:
        """The speaker row of a voice a CustomVoice checkpoint speaks: one stored from a
        speaker embedding (a voice cloned in context needs a base checkpoint)."""
        arrays = self.stored(blob)
        if "codes" in arrays:
            raise InvalidRequest(f"this stored voice clones in context (mode {ICL.name}), which needs a base "
                                 f"checkpoint ({CHECKPOINT_NAMES['base']}); the loaded checkpoint is "
                                 f"{self.checkpoint.kind}")
        return torch.from_numpy(arrays["embedding"])

    @torch.no_grad()
    def encode_voice(self, inputs: Inputs) -> bytes:
        """A voice for storing, its `mode` in the metadata. Base: the x-vector, plus the
        reference's codes and transcript ids when it has a transcript (icl); the x-vector
        alone without one or with x_vector_only_mode (xvec); a speaker_embedding as given
        (embedding). CustomVoice: a speaker_embedding (embedding), spoken as the speaker row
        in place of a preset's (e.g. a blend of presets, tritontts-voice blend)."""
        params = parse_qwen3_tts_params(decode_params(inputs.scalar(PARAMS, "")))
        if params.task_type != "Base" or params.voice_features is not None:
            raise InvalidRequest("a Qwen3-TTS voice is stored from ref_audio (with ref_text for "
                                 "in-context cloning) or from speaker_embedding")
        if self.checkpoint.kind == "custom_voice":
            if params.speaker_embedding is None:
                raise InvalidRequest("a custom_voice checkpoint stores a voice from speaker_embedding only (a "
                                     "speaker row, e.g. a blend of its presets); cloning a recording needs a "
                                     f"base checkpoint ({CHECKPOINT_NAMES['base']})")
            if len(params.speaker_embedding) != self.row_dim:
                raise InvalidRequest(f"speaker_embedding has {len(params.speaker_embedding)} values; "
                                     f"this checkpoint's speaker rows have {self.row_dim}")
            row = np.asarray(params.speaker_embedding, np.float32)
            return pack_voice(FAMILY.name, self.fingerprint, {"embedding": row}, ref_text="",
                              mode=EMBEDDING_MODE)
        check_task(params, self.checkpoint.kind,
                   speaker_embedding_dim=self.checkpoint.config.speaker_embedding_dim)
        embedding, codes, ref_ids = self.reference(params)
        arrays = {"embedding": embedding.float().numpy()}
        if codes is not None:
            arrays["codes"] = codes.numpy().astype(np.int64)
            arrays["ref_ids"] = np.asarray(ref_ids, np.int64)
        mode = (EMBEDDING_MODE if params.speaker_embedding is not None else
                ICL.name if codes is not None else XVEC.name)
        return pack_voice(FAMILY.name, self.fingerprint, arrays, ref_text=params.ref_text or "", mode=mode)

    def speaker(self, voice: str) -> str:
        speakers = self.checkpoint.speakers
        if voice in ("", "default"):
            return speakers[0]
        match = [s for s in speakers if s.lower() == voice.lower()]
        if not match:
            raise InvalidRequest(f"unknown voice {voice!r}; this checkpoint's speakers: "
                                 f"{', '.join(speakers)} (or default)")
        return match[0]

    @staticmethod
    def require_default_voice(voice: str, task: str) -> None:
        if voice not in ("", "default"):
            how = "describe it in instructions" if task == "VoiceDesign" else "send ref_audio"
            raise InvalidRequest(f"unknown voice {voice!r}: {task} has no preset speakers "
                                 f"({how}); use voice 'default'")

    @staticmethod
    def reference_audio(data: bytes) -> np.ndarray:
        return reference_recording(data, SAMPLE_RATE_HZ, MIN_REF_SECONDS, MAX_REF_SECONDS)


class Qwen3TTSTalkerStage(VllmTalkerStage):
    """Frames from the vLLM talker, sent as chunks of codes with the left context the codec
    stage needs to decode them exactly (reference codes first, when cloning in context)."""

    shares_rows = True   # the model and this stage share FrameStreams

    def __init__(self, context: StageContext, checkpoint: Qwen3TTSCheckpoint | None = None):
        from .vllm_model import prepare_vllm_talker, register

        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.talker_dir = prepare_vllm_talker(self.checkpoint)
        register()
        super().__init__(context)
        chunks = self.settings["chunks"]
        self.chunk_frames = int(chunks["frames"])
        self.first_chunk_frames = int(chunks["first_frames"])
        # Chunks grow from the first by this factor up to `frames`: a 1-frame first chunk
        # (80 ms of audio) followed at once by 25 frames made every stream run dry while
        # those were made (the benchmark's underruns); growing ones keep the buffer ahead.
        self.chunk_growth = chunks.get("growth")
        self.left_context_frames = int(chunks["left_context_frames"])
        t = self.checkpoint.config.talker
        self.eos = t.codec_eos_token_id
        self.allowed_ids = list(range(t.vocab_size - CONTROL_TAIL)) + [self.eos]
        self.placeholder_id = t.codec_pad_id   # never sampled, never embedded

    def model_path(self) -> str:
        return str(self.talker_dir)

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        from vllm import SamplingParams

        from ...engine.vllm_frames import FRAMES_ARG, FrameStream, register, release

        stream_id, seed = int(inputs.scalar(STREAM_ID)), int(inputs.scalar("seed"))
        prompt = torch.from_numpy(np.array(inputs["prompt_embeds"], np.float32))
        steps = torch.from_numpy(np.array(inputs["step_embeds"], np.float32))[:int(inputs.scalar("step_count"))]
        ref = np.array(inputs["ref_codes"], np.int32)[:int(inputs.scalar("ref_frames"))]
        max_frames = int(inputs.scalar("max_frames"))
        if prompt.shape[0] + max_frames + 1 > self.max_model_len:
            max_frames = self.max_model_len - prompt.shape[0] - 1
            if max_frames < 2:
                raise InvalidRequest(f"the prompt needs {prompt.shape[0]} of the talker's "
                                     f"{self.max_model_len} positions: shorten the text or reference")
        g = self.checkpoint.generation
        overrides = sampling.decode(inputs.scalar(SAMPLING, ""))
        key = f"{stream_id}"
        stream = FrameStream(
            prompt, steps, torch.from_numpy(np.array(inputs["pad_embed"], np.float32)),
            torch.Generator().manual_seed(seed),
            {"do_sample": g.subtalker_dosample, **sampling.apply(
                {"temperature": g.subtalker_temperature, "top_k": g.subtalker_top_k,
                 "top_p": g.subtalker_top_p}, overrides, "subtalker_")})
        register(key, stream)
        main = sampling.apply({"temperature": g.temperature if g.do_sample else 0.0,
                               "top_k": g.top_k if g.do_sample else 0, "top_p": g.top_p,
                               "repetition_penalty": g.repetition_penalty}, overrides)
        params = SamplingParams(
            temperature=main["temperature"], top_k=main["top_k"], top_p=main["top_p"],
            repetition_penalty=main["repetition_penalty"], seed=seed,
            max_tokens=max_frames + 1, min_tokens=2, stop_token_ids=[self.eos],
            allowed_token_ids=self.allowed_ids, detokenize=False, extra_args={FRAMES_ARG: key})
        first = int(inputs.scalar("first_chunk_frames")) or self.first_chunk_frames
        try:
            sizes = chunk_sizes(self.chunk_frames, first, self.chunk_growth)
            sent, size = 0, next(sizes)
            # The model appends to stream.frames as it completes them (tritontts.engine.vllm_frames).
            frames = stream.frames
            async for _ in self.generate([self.placeholder_id] * prompt.shape[0], params, key,
                                         inputs.cancelled):
                while len(frames) >= sent + size:
                    yield self.chunk(ref, frames, sent, sent + size, final=False)
                    sent, size = sent + size, next(sizes)
            frames = frames[:max_frames]
            if sent < len(frames):
                yield self.chunk(ref, frames, sent, len(frames), final=True)
            else:    # ended at the first frame or on a chunk boundary: close it with no audio
                yield self.chunk(ref, frames, len(frames), len(frames), final=True)
        finally:
            release(key)

    def chunk(self, ref: np.ndarray, frames: list, start: int, end: int, final: bool) -> dict[str, Any]:
        """Frames [start, end) with up to left_context_frames earlier codes (reference first).
        Only the window's frames are stacked: a long stream's earlier frames are not copied."""
        begin = ref.shape[0] + start
        window_start = max(0, begin - self.left_context_frames)
        first_frame = max(0, window_start - ref.shape[0])
        parts = [ref[window_start:]] if window_start < ref.shape[0] else []
        if end > first_frame:
            parts.append(torch.stack(frames[first_frame:end]).numpy().astype(np.int32))
        window = np.concatenate(parts) if parts else np.zeros((0, CODE_GROUPS), np.int32)
        if window.shape[0] == 0:
            window = np.zeros((1, CODE_GROUPS), np.int32)   # nothing to decode (see stage)
            context = 1
        else:
            context = begin - window_start
        return {"codes": window, "left_context": context, IS_FINAL: final}


class Qwen3TTSCode2WavStage(GroupedStage):
    """A chunk's codes -> its 24 kHz audio, stateless: the left context frames make it equal
    to decoding the whole utterance (tritontts.families.qwen3_tts.code2wav.decode_chunk)."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: Qwen3TTSCheckpoint | None = None):
        from ...nn.runtime import stage_runner
        from .code2wav import code2wav_graphs, load_code2wav

        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        self.codec = load_code2wav(checkpoint.path("speech_tokenizer"), self.device)
        latents, vocoder = code2wav_graphs(self.codec)
        self.codec.latents_runner = stage_runner(latents, context)
        self.codec.vocode_runner = stage_runner(vocoder, context)

    @staticmethod
    def batch_key(inputs: Inputs) -> tuple[int, int]:
        """Chunks of equal length and left context, from any streams, decode as one batch
        (the network has no mask: its convolutions and windowed attention see only the
        chunk, so equal shapes are exact)."""
        codes, context = inputs["codes"], int(inputs.scalar("left_context"))
        if codes.ndim != 2 or not 0 <= context <= codes.shape[0]:
            raise InvalidRequest(f"codes [frames, codebooks] with left_context within its frames, got "
                                 f"{list(codes.shape)} and {context}")
        return codes.shape[0], context

    @torch.no_grad()
    def run_group(self, members: list[Inputs]) -> list[dict[str, Any]]:
        from .code2wav import decode_chunk

        codes = torch.from_numpy(np.stack([np.asarray(m["codes"], np.int64) for m in members])) \
            .transpose(1, 2).to(self.device)
        audio = decode_chunk(self.codec, codes, int(members[0].scalar("left_context"))).float().cpu().numpy()
        return [{AUDIO: row, SAMPLE_RATE: SAMPLE_RATE_HZ} for row in audio]
