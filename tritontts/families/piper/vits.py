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
    """One voice's VITS graph in onnxruntime; thread-safe.

    A stream's first chunk runs with `first_chunk_intra_op_threads` (every core: earliest
    first audio), later chunks with `intra_op_threads` (one core each, so chunks of several
    streams run side by side). The thread count follows the chunk, never the load:
    onnxruntime's results differ in the last bits between thread counts (5.7e-6 measured on
    a sentence), and a seeded request must give the same bytes whatever else the server
    runs. A first chunk alone on the machine uses a spinning copy of its session: same
    threads, same results, ~15 % faster (a sleeping thread's wake-up is costly), while under
    load idle threads must sleep rather than take cores from other chunks."""

    def __init__(self, model_path, sample_rate: int, intra_op_threads: int = 0,
                 first_chunk_intra_op_threads: int | None = None, device: str = "cpu"):
        model = onnx.load(str(model_path))
        self.noise_inputs = make_seedable(model)
        graph = model.SerializeToString()
        first = first_chunk_intra_op_threads or intra_op_threads
        self.device = device
        self.sessions = {(threads, spin): self._session(graph, threads, spin, device)
                         for threads, spin in {(intra_op_threads, False), (first, False),
                                               (first, first > 1)}}
        self.threads, self.first_chunk_threads = intra_op_threads, first
        self.input_names = {i.name for i in self.sessions[(first, False)].get_inputs()}
        self.sample_rate = sample_rate

    @staticmethod
    def _session(graph: bytes, threads: int, spin: bool, device: str) -> ort.InferenceSession:
        from ...nn.devices import onnxruntime_providers

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        return ort.InferenceSession(graph, options, providers=onnxruntime_providers(device))

    def synthesize(self, phoneme_ids, scales, seed, speaker_id: int | None = None,
                   first_chunk: bool = True, alone: bool = True) -> np.ndarray:
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
        threads = self.first_chunk_threads if first_chunk else self.threads
        session = self.sessions[(threads, first_chunk and alone and threads > 1)]
        audio = session.run(None, feeds)[0].reshape(-1)
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0
        # Same loudness handling as piper-tts's own synthesize(): peak-normalize per sentence.
        audio = audio / peak if peak > 1e-8 else np.zeros_like(audio)
        return np.clip(audio, -1.0, 1.0).astype(np.float32)
