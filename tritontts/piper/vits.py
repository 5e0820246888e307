"""Piper VITS synthesis with onnxruntime, with per-request seeds.

Piper's exported graphs draw their noise with RandomNormalLike, whose generator lives in
the session: the same request gives different audio each time and a seed cannot be set per
request. At load we rewrite each RandomNormalLike(x) into "noise input tiled to x's shape",
and feed noise drawn from the request's seed, so synthesis is reproducible per request and
independent of what else the instance ran before.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

NOISE_INPUT = "tritontts_noise_{}"
# Noise drawn per request; longer tensors tile it (this is > 20 s of latent frames).
NOISE_LEN = 1 << 19


def make_seedable(model: onnx.ModelProto) -> int:
    """Replace RandomNormalLike nodes by a tiled external noise input; returns their count."""
    graph = model.graph
    new_nodes, count = [], 0
    one = helper.make_tensor("tritontts_one", TensorProto.INT64, [1], [1])
    zero = helper.make_tensor("tritontts_zero", TensorProto.INT64, [1], [0])
    graph.initializer.extend([one, zero])
    for node in graph.node:
        if node.op_type != "RandomNormalLike":
            new_nodes.append(node)
            continue
        x, y, k = node.input[0], node.output[0], count
        name = NOISE_INPUT.format(k)
        graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n"]))
        p = f"tritontts_noise{k}_"
        new_nodes += [
            helper.make_node("Shape", [x], [p + "shape"]),
            helper.make_node("Size", [x], [p + "size0"]),
            helper.make_node("Reshape", [p + "size0", "tritontts_one"], [p + "size"]),
            helper.make_node("Shape", [name], [p + "len"]),
            # reps = (size - 1) // len + 1
            helper.make_node("Sub", [p + "size", "tritontts_one"], [p + "sm1"]),
            helper.make_node("Div", [p + "sm1", p + "len"], [p + "q"]),
            helper.make_node("Add", [p + "q", "tritontts_one"], [p + "reps"]),
            helper.make_node("Tile", [name, p + "reps"], [p + "tiled"]),
            helper.make_node("Slice", [p + "tiled", "tritontts_zero", p + "size"], [p + "flat"]),
            helper.make_node("Reshape", [p + "flat", p + "shape"], [y]),
        ]
        count += 1
    del graph.node[:]
    graph.node.extend(new_nodes)
    return count


class PiperVits:
    """One voice's VITS graph in onnxruntime; thread-compatible, one call at a time."""

    def __init__(self, model_path, sample_rate: int, intra_op_threads: int = 0):
        model = onnx.load(str(model_path))
        self.noise_inputs = make_seedable(model)
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        # Instances share two cores: idle threads must sleep, not spin.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(model.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.sample_rate = sample_rate

    def synthesize(self, phoneme_ids, scales, seed,
                   speaker_id: int | None = None) -> np.ndarray:
        """Phoneme ids -> float32 mono audio in [-1, 1] (peak-normalized like piper-tts).

        `seed` is anything numpy's default_rng takes (an int, or [request_seed, chunk]).
        """
        rng = np.random.default_rng(seed)
        feeds = {
            "input": np.asarray(phoneme_ids, dtype=np.int64).reshape(1, -1),
            "input_lengths": np.array([len(phoneme_ids)], dtype=np.int64),
            "scales": np.asarray(scales, dtype=np.float32),
        }
        if "sid" in self.input_names:
            feeds["sid"] = np.array([speaker_id or 0], dtype=np.int64)
        for k in range(self.noise_inputs):
            feeds[NOISE_INPUT.format(k)] = rng.standard_normal(NOISE_LEN, dtype=np.float32)
        audio = self.session.run(None, feeds)[0].reshape(-1)
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0
        # Same loudness handling as piper-tts's own synthesize(): peak-normalize per sentence.
        audio = audio / peak if peak > 1e-8 else np.zeros_like(audio)
        return np.clip(audio, -1.0, 1.0).astype(np.float32)
