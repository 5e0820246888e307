"""CAM++ speaker embeddings (`campplus.onnx`, shipped by CosyVoice3 and GLM-TTS alike): a
192-d x-vector of a 16 kHz recording, from its 80-bin Kaldi fbank with the mean over time
removed (upstream's `_extract_spk_embedding` in both families)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


class CampPlus:
    def __init__(self, path: str | Path):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def embed(self, audio16k: np.ndarray) -> np.ndarray:
        """float32 [192]."""
        from .cosyvoice3.features import kaldi_fbank

        fbank = kaldi_fbank(audio16k)
        fbank = fbank - fbank.mean(axis=0, keepdims=True)
        return self.session.run(None, {self.input_name: fbank[None]})[0].reshape(-1).astype(np.float32)
