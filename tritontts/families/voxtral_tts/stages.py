"""The Voxtral TTS stages (each a tritontts.serving.stage class named by its config.pbtxt):

  voxtral_tts_prompt  VoxtralTTSPromptStage  text + preset voice -> mistral-common's speech
                                             request ids ([AUDIO] placeholders for the voice)
  voxtral_tts_talker  VoxtralTTSTalkerStage  vLLM: the backbone, the acoustic transformer in
                                             every step; one response per chunk of frames
                                             (5, then 25), with 25 frames of left context
  voxtral_tts_codec   VoxtralTTSCodecStage   a chunk's codes -> 24 kHz audio, stateless,
                                             windows of equal length decoded as one batch

The checkpoint path comes from the launcher (`--checkpoint voxtral_tts=DIR`, passed to the
stages as TRITONTTS_VOXTRAL_TTS_CHECKPOINT); tests hand a checkpoint in directly.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import numpy as np
import torch

from ... import sampling
from ...sampling import SAMPLING
from ...protocol import STREAM_ID, InvalidRequest
from ...serving.stage import PREPARES_REQUESTS, Inputs, Stage, StageContext, begin_request
from ...serving.window_decoder import WindowDecoderStage
from ...engine.vllm_talker import FrameChunkTalkerStage
from .acoustic import END_AUDIO, SPECIAL_CODES
from .checkpoint import TOKENIZER_FILE, WEIGHTS_FILE, VoxtralTTSCheckpoint
from .family import FAMILY
from .request import parse_voxtral_tts_params

DEFAULT_CFG = 1.2
DEFAULT_MAX_FRAMES = 2048     # vLLM-Omni's stage default (max_tokens)


class VoxtralTTSPromptStage(Stage):
    one_by_one = PREPARES_REQUESTS

    def __init__(self, context: StageContext, checkpoint: VoxtralTTSCheckpoint | None = None):
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

        super().__init__(context)
        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.tokenizer = MistralTokenizer.from_file(str(self.checkpoint.path(TOKENIZER_FILE)))

    def voice(self, name: str) -> str:
        voices = self.checkpoint.config.voices
        if name in ("", "default"):
            return voices[0]
        match = [v for v in voices if v.lower() == name.lower()]
        if not match:
            raise InvalidRequest(f"unknown voice {name!r}; this checkpoint's voices: {', '.join(voices)} "
                                 "(or default)")
        return match[0]

    def run(self, inputs: Inputs) -> dict[str, Any]:
        from mistral_common.protocol.speech.request import SpeechRequest

        start = begin_request(inputs, parse_voxtral_tts_params)
        voice = self.voice(start.voice)
        ids = self.tokenizer.instruct_tokenizer.encode_speech_request(
            SpeechRequest(input=start.text, voice=voice)).tokens
        return {"ids": np.asarray(ids, np.int64), "voice_name": voice,
                "max_frames": start.params.max_new_tokens or DEFAULT_MAX_FRAMES, "seed": start.seed,
                SAMPLING: sampling.encode(start.params.sampling), STREAM_ID: start.stream_id}


class VoxtralTTSTalkerStage(FrameChunkTalkerStage):
    """Frames from the vLLM talker, sent as chunks of codec codes (0-based) after up to
    left_context_frames earlier ones; the END_AUDIO frame ends the stream and is not audio."""

    def __init__(self, context: StageContext, checkpoint: VoxtralTTSCheckpoint | None = None):
        from .vllm_model import prepare_vllm_talker, register

        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.talker_dir = prepare_vllm_talker(self.checkpoint)
        register()
        super().__init__(context, self.checkpoint.config.codec.context_frames())
        self.voices = {v: self.checkpoint.voice_embedding(v) for v in self.checkpoint.config.voices}

    def model_path(self) -> str:
        return str(self.talker_dir)

    def is_end(self, frame) -> bool:
        return int(frame[0]) == END_AUDIO

    def window_codes(self, frames):
        return (frames - SPECIAL_CODES).numpy().astype(np.int32)

    async def run(self, inputs: Inputs) -> AsyncIterator[dict[str, Any]]:
        from .vllm_model import EOS, VoiceStream

        stream_id, seed = int(inputs.scalar(STREAM_ID)), int(inputs.scalar("seed"))
        ids = torch.from_numpy(np.array(inputs.flat("ids"), np.int64))
        voice = self.voices.get(str(inputs.scalar("voice_name")))
        if voice is None:
            raise InvalidRequest(f"unknown voice {inputs.scalar('voice_name')!r}")
        max_frames = self.frame_budget(ids.shape[0], int(inputs.scalar("max_frames")))
        overrides = sampling.decode(inputs.scalar(SAMPLING, ""))
        stream = VoiceStream(ids, voice, torch.Generator().manual_seed(seed),
                             float(overrides.get("cfg_value", DEFAULT_CFG)))
        async for chunk in self.stream_frames(ids.tolist(), stream, f"{stream_id}", max_frames, EOS,
                                              inputs.cancelled):
            yield chunk


class VoxtralTTSCodecStage(WindowDecoderStage):
    """A chunk's codes -> its 24 kHz audio, stateless: the left context frames (at least the
    codec's receptive field, 21) make it equal to decoding the whole utterance."""

    window = "codes"

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: VoxtralTTSCheckpoint | None = None):
        from ...weights.checkpoint import read_tensors
        from .codec import PREFIX, load_codec

        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        path = checkpoint.path(WEIGHTS_FILE)
        # Only the codec's tensors are read (the file also holds the whole talker).
        self.codec = load_codec(read_tensors(path, PREFIX, strip=False), checkpoint.config.codec, str(path),
                                self.device)
        self.samples_per_frame = checkpoint.config.codec.samples_per_frame
        self.sample_rate = checkpoint.config.codec.sampling_rate

    def check_window(self, window: np.ndarray) -> None:
        if window.ndim != 2 or window.shape[1] != 37:
            raise InvalidRequest(f"codes must be [frames, 37], got {tuple(window.shape)}")

    @torch.no_grad()
    def decode_windows(self, windows: np.ndarray) -> np.ndarray:
        codes = torch.from_numpy(windows.astype(np.int64)).transpose(1, 2).to(self.device)
        # The codec has no output squashing (no tanh): a waveform is clipped to [-1, 1].
        return np.clip(self.codec.decode(codes).float().cpu().numpy(), -1.0, 1.0)
