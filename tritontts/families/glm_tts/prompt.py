"""Reference recording + transcript -> what GLM-TTS conditions on, cached by content.

  speech tokens   WhisperVQ (speech_tokenizer/) on the 16 kHz reference: the talker's prompt
                  speech and the flow's prompt tokens
  embedding       192-d CAM++ x-vector (frontend/campplus.onnx on 16 kHz Kaldi fbank, mean
                  removed), as CosyVoice3's
  mel             80-bin log-mel of the reference at the vocoder's rate and 50 Hz (n_fft 4
                  hops, Slaney mels up to 8 kHz): the flow's prompt mel
  text ids        the normalised transcript and a trailing space, tokenized (upstream adds
                  the space so the synthesis text starts a new word)
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from ...audio import reference_recording, resample
from ...serving.lru import LRU
from ...nn.mel import matcha_log_mel
from ...nn.speaker import CampPlus
from ...protocol import InvalidRequest
from ...text import normalize
from ...voice import checkpoint_fingerprint, pack_voice, unpack_voice
from .checkpoint import TOKENIZER_DIR, GLMTTSCheckpoint
from .tokenizer import GLMTextTokenizer

MIN_REF_SECONDS, MAX_REF_SECONDS = 3.0, 10.0
# What a stored voice's features depend on: the encoders, the tokenizer, the vocoder rate.
VOICE_FILES = ("speech_tokenizer", "frontend/campplus.onnx", TOKENIZER_DIR)
VOICE_SPEC = {"text_ids": (np.int64, (None,)), "speech_tokens": (np.int32, (None,)),
              "embedding": (np.float32, (192,)), "mel": (np.float32, (None, 80))}


@dataclass(frozen=True)
class VoicePrompt:
    text_ids: list[int]          # transcript + " "
    speech_tokens: np.ndarray    # int32 [N], 25 Hz
    embedding: np.ndarray        # float32 [192]
    mel: np.ndarray              # float32 [frames, 80], 50 Hz


def prompt_mel(audio: np.ndarray, rate: int) -> np.ndarray:
    """[frames, 80] at 50 Hz: upstream's feat_extractor (24 kHz: n_fft 1920, hop 480; 32 kHz:
    2560, 640), Matcha-style log-mel with an 8 kHz ceiling."""
    hop = rate // 50
    return matcha_log_mel(torch.from_numpy(np.ascontiguousarray(audio, np.float32)), rate,
                          4 * hop, hop, 80, fmax=8000).numpy()


class PromptExtractor:
    def __init__(self, checkpoint: GLMTTSCheckpoint, cache_size: int = 64):
        from .speech_tokenizer import WhisperVQSpeechTokenizer

        self.sample_rate = checkpoint.sample_rate
        self.tokenizer = GLMTextTokenizer(checkpoint.tokenizer_dir)
        self.speech_tokenizer = WhisperVQSpeechTokenizer(checkpoint.path("speech_tokenizer"))
        self.campplus = CampPlus(checkpoint.path("frontend/campplus.onnx"))
        self.cache = LRU(cache_size)
        self.fingerprint = checkpoint_fingerprint(checkpoint.root, VOICE_FILES) + f":{self.sample_rate}"

    def text_ids(self, ref_text: str) -> list[int]:
        return self.tokenizer.encode(normalize(ref_text) + " ")

    def extract(self, ref_audio: bytes, ref_text: str) -> VoicePrompt:
        key = hashlib.sha256(ref_audio + b"\0" + ref_text.encode()).hexdigest()
        return self.cache.get(key, lambda: self._compute(ref_audio, ref_text))

    def _compute(self, ref_audio: bytes, ref_text: str) -> VoicePrompt:
        audio = reference_recording(ref_audio, self.sample_rate, MIN_REF_SECONDS, MAX_REF_SECONDS)
        audio16k = resample(audio, self.sample_rate, 16000).astype(np.float32)
        tokens = np.asarray(self.speech_tokenizer.tokens(audio16k), np.int32)
        if tokens.size == 0:
            raise InvalidRequest("ref_audio gave no speech tokens; send a 3-10 s recording of speech")
        return VoicePrompt(self.text_ids(ref_text), tokens, self.campplus.embed(audio16k),
                           prompt_mel(audio, self.sample_rate).astype(np.float32))

    def pack(self, prompt: VoicePrompt, ref_text: str) -> bytes:
        """A voice prompt as stored voice features (tritontts.voice)."""
        return pack_voice("glm_tts", self.fingerprint, {
            "text_ids": np.asarray(prompt.text_ids, np.int64), "speech_tokens": prompt.speech_tokens,
            "embedding": prompt.embedding, "mel": prompt.mel}, ref_text=ref_text)

    def unpack(self, blob: bytes) -> VoicePrompt:
        arrays, _ = unpack_voice(blob, "glm_tts", self.fingerprint, VOICE_SPEC)
        if not arrays["speech_tokens"].size or not arrays["text_ids"].size or not arrays["mel"].shape[0]:
            raise InvalidRequest("voice_features are empty; upload the voice again")
        return VoicePrompt(arrays["text_ids"].tolist(), arrays["speech_tokens"], arrays["embedding"],
                           arrays["mel"])
