"""Piper VITS synthesis with onnxruntime, with per-request seeds.

Piper's exported graphs draw their noise with RandomNormalLike, whose generator lives in
the session: the same request gives different audio each time and a seed cannot be set per
request. At load we rewrite each RandomNormalLike(x) into "noise input tiled to x's shape",
and feed noise drawn from the request's seed, so synthesis is reproducible per request and
independent of what else the instance ran before.

Speed: piper-tts divides the length scale, and the graph rounds every phoneme's duration
up to a frame (Ceil), so the one-frame blanks between phonemes neither shrink nor grow:
speed 2 measured 1.25x the expected duration, speed 0.5 0.87x (tests/piper/test_piper_speed.py).
We divide the length scale too (the voice's own slow and fast speech), then rescale those
frames so the whole lasts the speed-1 duration / speed, to a frame (make_speed_exact). At
speed 1 the integers pass through unchanged.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

NOISE_INPUT = "tritontts_noise_{}"
SPEED_INPUT = "tritontts_speed"
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


def make_speed_exact(model: onnx.ModelProto) -> None:
    """After the graph's one Ceil (frames per phoneme at length scale / speed), a speed input
    and a rescaling to the target, the speed-1 frames (the Ceil of the durations x speed) /
    speed: every phoneme keeps one frame (unless the target is below one a phoneme, then all
    shrink alike) and the frames above one share what is left; cumulatively rounded
    (round(inclusive sum) - round(exclusive sum)), so the total is the target to a frame."""
    graph = model.graph
    ceils = [n for n in graph.node if n.op_type == "Ceil"]
    if len(ceils) != 1:
        raise ValueError(f"a Piper VITS graph has one Ceil (its phoneme durations); this one has {len(ceils)}")
    durations, frames = ceils[0].input[0], ceils[0].output[0]
    graph.input.append(helper.make_tensor_value_info(SPEED_INPUT, TensorProto.FLOAT, [1]))
    graph.initializer.extend([helper.make_tensor("tritontts_last_axis", TensorProto.INT64, [], [-1]),
                              helper.make_tensor("tritontts_one_f", TensorProto.FLOAT, [], [1.0]),
                              helper.make_tensor("tritontts_zero_f", TensorProto.FLOAT, [], [0.0])])
    p = "tritontts_speed_"
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == frames:
                node.input[i] = p + "frames"
    at = list(graph.node).index(ceils[0]) + 1
    for k, node in enumerate([
            helper.make_node("Mul", [durations, SPEED_INPUT], [p + "durations_1"]),
            helper.make_node("Ceil", [p + "durations_1"], [p + "frames_1"]),
            helper.make_node("ReduceSum", [p + "frames_1"], [p + "total_1"], keepdims=0),
            helper.make_node("Div", [p + "total_1", SPEED_INPUT], [p + "target"]),
            # every phoneme keeps a frame (while the target allows: else the frames shrink
            # alike); the frames above it take the residual
            helper.make_node("Min", [frames, "tritontts_one_f"], [p + "base"]),
            helper.make_node("Sub", [frames, p + "base"], [p + "extra"]),
            helper.make_node("ReduceSum", [p + "base"], [p + "base_total"], keepdims=0),
            helper.make_node("ReduceSum", [p + "extra"], [p + "extra_total"], keepdims=0),
            helper.make_node("Max", [p + "base_total", "tritontts_one_f"], [p + "base_total_1"]),
            helper.make_node("Div", [p + "target", p + "base_total_1"], [p + "base_share0"]),
            helper.make_node("Min", [p + "base_share0", "tritontts_one_f"], [p + "base_share"]),
            helper.make_node("Sub", [p + "target", p + "base_total"], [p + "extra_target"]),
            helper.make_node("Max", [p + "extra_total", "tritontts_one_f"], [p + "extra_total_1"]),
            helper.make_node("Div", [p + "extra_target", p + "extra_total_1"], [p + "extra_share0"]),
            helper.make_node("Max", [p + "extra_share0", "tritontts_zero_f"], [p + "extra_share"]),
            helper.make_node("Mul", [p + "base", p + "base_share"], [p + "base_scaled"]),
            helper.make_node("Mul", [p + "extra", p + "extra_share"], [p + "extra_scaled"]),
            helper.make_node("Add", [p + "base_scaled", p + "extra_scaled"], [p + "scaled"]),
            helper.make_node("CumSum", [p + "scaled", "tritontts_last_axis"], [p + "upto"]),
            helper.make_node("CumSum", [p + "scaled", "tritontts_last_axis"], [p + "before"], exclusive=1),
            helper.make_node("Round", [p + "upto"], [p + "upto_r"]),
            helper.make_node("Round", [p + "before"], [p + "before_r"]),
            helper.make_node("Sub", [p + "upto_r", p + "before_r"], [p + "frames"])]):
        graph.node.insert(at + k, node)


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
        make_speed_exact(model)
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
                   first_chunk: bool = True, alone: bool = True, speed: float = 1.0) -> np.ndarray:
        """Phoneme ids -> float32 mono audio in [-1, 1] (peak-normalized like piper-tts).

        `scales`: (noise, length, noise_w) as the voice's graph takes them; `speed` rescales
        the alignment they give (make_speed_exact). `seed` is anything numpy's default_rng
        takes (an int, or [request_seed, chunk]).
        """
        rng = np.random.default_rng(seed)
        feeds = {
            "input": np.asarray(phoneme_ids, dtype=np.int64).reshape(1, -1),
            "input_lengths": np.array([len(phoneme_ids)], dtype=np.int64),
            "scales": np.asarray(scales, dtype=np.float32),
            SPEED_INPUT: np.array([speed], dtype=np.float32),
        }
        if "sid" in self.input_names:
            feeds["sid"] = np.array([speaker_id or 0], dtype=np.int64)
        # scales carry length scale / speed: the rescaled frames are the speed-1 frames / speed
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
