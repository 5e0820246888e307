"""CAM++ speaker embeddings (`campplus.onnx`, shipped by CosyVoice3 and GLM-TTS alike): a
192-d x-vector of a 16 kHz recording, from its 80-bin Kaldi fbank with the mean over time
removed (upstream's `_extract_spk_embedding` in both families)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .mel import kaldi_fbank


class CampPlus:
    def __init__(self, path: str | Path):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def embed(self, audio16k: np.ndarray) -> np.ndarray:
        """float32 [192]."""
        fbank = kaldi_fbank(audio16k)
        fbank = fbank - fbank.mean(axis=0, keepdims=True)
        return self.session.run(None, {self.input_name: fbank[None]})[0].reshape(-1).astype(np.float32)


def write_random_campplus(path: Path, rng: np.random.Generator) -> None:
    """A tiny random campplus.onnx with the released one's I/O: fbank [B, T, 80] -> 192-d embedding: mean over time, then a random projection."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((80, 192)).astype(np.float32) * 0.1, "w")
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),
         helper.make_node("MatMul", ["pooled", "w"], ["output"])],
        "campplus_tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["B", "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", 192])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
