"""Reference recording + transcript -> what CosyVoice3 conditions on, cached by content.

speech tokens (speech_tokenizer_v3.onnx on a 16 kHz whisper log-mel), a 192-d CAM++ speaker
embedding (campplus.onnx on 16 kHz Kaldi fbank), and the prompt mel (24 kHz, 50 Hz); the
prompt mel is trimmed to exactly 2 frames per speech token, as upstream does.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ...audio import decode_audio, resample
from ...serving.lru import LRU
from ...nn.speaker import CampPlus
from ...nn.mel import whisper_log_mel
from ...protocol import InvalidRequest
from ...voice import checkpoint_fingerprint, pack_voice, unpack_voice
from .checkpoint import TEXT_MODEL_DIR, CosyVoice3Checkpoint
from .features import prompt_mel
from .tokenizer import CosyVoice3TextTokenizer

MIN_REF_SECONDS, MAX_REF_SECONDS = 1.0, 30.0
# What a stored voice's features depend on: the two encoders and the text tokenizer.
VOICE_FILES = ("speech_tokenizer_v3.onnx", "campplus.onnx", TEXT_MODEL_DIR)
VOICE_SPEC = {"text_ids": (np.int64, (None,)), "speech_tokens": (np.int32, (None,)),
              "embedding": (np.float32, (192,)), "mel": (np.float32, (None, 80))}


@dataclass(frozen=True)
class VoicePrompt:
    text_ids: list[int]          # instruction + <|endofprompt|> + transcript
    speech_tokens: np.ndarray    # int32 [N]
    embedding: np.ndarray        # float32 [192]
    mel: np.ndarray              # float32 [2N, 80]


class PromptExtractor:
    def __init__(self, checkpoint: CosyVoice3Checkpoint, cache_size: int = 64):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.tokenizer = CosyVoice3TextTokenizer(checkpoint.text_model_dir)
        self.speech_tokenizer = ort.InferenceSession(
            str(checkpoint.path("speech_tokenizer_v3.onnx")), options, providers=["CPUExecutionProvider"])
        self.campplus = CampPlus(checkpoint.path("campplus.onnx"))
        self.cache = LRU(cache_size)
        self.fingerprint = checkpoint_fingerprint(checkpoint.root, VOICE_FILES)

    def pack(self, prompt: VoicePrompt, ref_text: str) -> bytes:
        """A voice prompt as stored voice features (tritontts.voice)."""
        return pack_voice("cosyvoice3", self.fingerprint, {
            "text_ids": np.asarray(prompt.text_ids, np.int64), "speech_tokens": prompt.speech_tokens,
            "embedding": prompt.embedding, "mel": prompt.mel}, ref_text=ref_text)

    def unpack(self, blob: bytes) -> VoicePrompt:
        arrays, _ = unpack_voice(blob, "cosyvoice3", self.fingerprint, VOICE_SPEC)
        tokens = arrays["speech_tokens"]
        if arrays["mel"].shape[0] != 2 * tokens.size or not tokens.size or not arrays["text_ids"].size:
            raise InvalidRequest("voice_features are inconsistent (the prompt mel has 2 frames "
                                 "per speech token); upload the voice again")
        return VoicePrompt(arrays["text_ids"].tolist(), tokens, arrays["embedding"], arrays["mel"])

    def extract(self, ref_audio: bytes, ref_text: str) -> VoicePrompt:
        key = hashlib.sha256(ref_audio + b"\0" + ref_text.encode()).hexdigest()
        return self.cache.get(key, lambda: self._compute(ref_audio, ref_text))

    def _compute(self, ref_audio: bytes, ref_text: str) -> VoicePrompt:
        audio, rate = decode_audio(ref_audio, "ref_audio")
        seconds = audio.size / rate
        if not MIN_REF_SECONDS <= seconds <= MAX_REF_SECONDS:
            raise InvalidRequest(f"ref_audio is {seconds:.2f} s long; it must be between "
                                 f"{MIN_REF_SECONDS:g} and {MAX_REF_SECONDS:g} s")
        if float(np.abs(audio).max()) < 1e-4:
            raise InvalidRequest("ref_audio is silent")
        audio16k = resample(audio, rate, 16000)
        feats = whisper_log_mel(audio16k)[None]
        inputs = self.speech_tokenizer.get_inputs()
        tokens = self.speech_tokenizer.run(None, {
            inputs[0].name: feats.astype(np.float32),
            inputs[1].name: np.array([feats.shape[2]], dtype=np.int32)})[0].reshape(-1)
        embedding = self.campplus.embed(audio16k)
        mel = prompt_mel(resample(audio, rate, 24000))
        n = min(mel.shape[0] // 2, tokens.size)
        return VoicePrompt(self.tokenizer.prompt_text_ids(ref_text), tokens[:n].astype(np.int32),
                           embedding.astype(np.float32), mel[:2 * n].astype(np.float32))
