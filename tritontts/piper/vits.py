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
# Noise drawn per chunk, sized to the sentence: enough for 8 latent frames (192 channels)
# per phoneme at length scale 1 (speech takes ~4), at most NOISE_LEN (> 20 s of frames).
# A longer tensor tiles it. Drawing a fixed 2 x 2**19 took ~15 ms, 8 % of a short sentence.
NOISE_PER_PHONEME = 8 * 192
NOISE_LEN = 1 << 19


def noise_length(phonemes: int, length_scale: float) -> int:
    return int(min(NOISE_LEN, max(4096, phonemes * NOISE_PER_PHONEME * max(1.0, length_scale))))


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
    """One voice's VITS graph in onnxruntime; thread-safe. Two sessions when the thread
    counts differ: `intra_op_threads` for a chunk that runs alone on the machine (it may
    use every core: earliest first audio), `shared_intra_op_threads` for one that runs
    beside others (each its own core: most audio per second under load)."""

    def __init__(self, model_path, sample_rate: int, intra_op_threads: int = 0,
                 shared_intra_op_threads: int | None = None):
        model = onnx.load(str(model_path))
        self.noise_inputs = make_seedable(model)
        graph = model.SerializeToString()
        shared = shared_intra_op_threads or intra_op_threads
        self.shared_session = self._session(graph, shared, spin=False)
        # Alone on the machine, its threads may spin between operators: nothing else wants
        # the cores, and a sleeping thread's wake-up costs ~15 % of a short sentence's time.
        self.alone_session = (self.shared_session if shared == intra_op_threads
                              else self._session(graph, intra_op_threads, spin=True))
        self.input_names = {i.name for i in self.alone_session.get_inputs()}
        self.sample_rate = sample_rate

    @staticmethod
    def _session(graph: bytes, threads: int, spin: bool) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Sharing the cores with other work, idle threads must sleep, not spin.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])

    def synthesize(self, phoneme_ids, scales, seed, speaker_id: int | None = None,
                   alone: bool = True) -> np.ndarray:
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
        size = noise_length(len(phoneme_ids), float(feeds["scales"][1]))
        for k in range(self.noise_inputs):
            feeds[NOISE_INPUT.format(k)] = rng.standard_normal(size, dtype=np.float32)
        session = self.alone_session if alone else self.shared_session
        audio = session.run(None, feeds)[0].reshape(-1)
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0
        # Same loudness handling as piper-tts's own synthesize(): peak-normalize per sentence.
        audio = audio / peak if peak > 1e-8 else np.zeros_like(audio)
        return np.clip(audio, -1.0, 1.0).astype(np.float32)
