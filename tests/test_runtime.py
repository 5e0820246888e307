"""tritontts.nn.runtime on the tiny random checkpoints: every exportable network of every
family, exported to ONNX, matches PyTorch (fp32, max-abs-diff <= 1e-4) at its smallest,
typical and an odd shape, while a perturbed weight does not (the negative control); the
stages' streaming paths give the same audio on onnxruntime as on PyTorch; the runtime
choice falls back in order with the reason.

Exports go to the test run's shared cache, where the served stacks find them (same
weights, same key), so each network is exported once per run.
"""
from __future__ import annotations

import copy
import importlib.util
from types import SimpleNamespace

import pytest
import torch

from tritontts.nn import runtime
from tritontts.families import FAMILIES
from tritontts.nn.runtime import (
    Axis, Graph, Method, TensorSpec, engine_dir, ensure_onnx, parse_preference, profile_shapes,
    select_runner, stage_runner)

TOLERANCE = 1e-4
FAMILIES_WITH_GRAPHS = [name for name, f in FAMILIES.items() if f.graphs]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engines(caches):
    # The served stacks' TRITONTTS_CACHE is caches/tritontts (tritontts.testing.stack).
    return caches / "tritontts" / "engines"


@pytest.fixture(scope="module")
def graphs(random_checkpoints) -> dict[str, Graph]:
    out = {}
    for family in FAMILIES_WITH_GRAPHS:
        for graph in FAMILIES[family].export_graphs(random_checkpoints[family]):
            out[graph.name] = graph
    return out


GRAPH_NAMES = ["cosyvoice3_flow_velocity", "cosyvoice3_hift_spectrum",
               "qwen3_tts_code2wav_latents", "qwen3_tts_code2wav_vocoder",
               "omnivoice_generator_logits", "higgs_codec_decoder"]


def test_every_family_with_a_non_autoregressive_network_declares_its_graphs(graphs):
    assert sorted(graphs) == sorted(GRAPH_NAMES)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def odd_sizes(graph: Graph) -> dict[str, int]:
    """Between min and opt, not a round number: catches a shape baked in at export."""
    return {name: max(axis.min, min(axis.max, (axis.min + axis.opt) // 2 + 3))
            for name, axis in graph.axes.items()}


@pytest.mark.parametrize("name", GRAPH_NAMES)
def test_onnxruntime_matches_torch_within_1e4_at_min_opt_and_odd_shapes_and_perturbed_weights_do_not(
        graphs, engines, name):
    graph = graphs[name]
    runner = select_runner(graph, "onnxruntime", root=engines)
    assert runner.runtime == "onnxruntime"
    perturbed = copy.deepcopy(graph.module)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():      # every weight off by ~1% (the graph may use a part of them)
        for weight in perturbed.parameters():
            if weight.dtype == torch.float32:
                weight.mul_(1 + 0.01 * torch.randn(weight.shape, generator=generator))
    for sizes in ({name: a.min for name, a in graph.axes.items()}, None, odd_sizes(graph)):
        inputs = graph.example(sizes, seed=2)
        with torch.inference_mode():
            expected = graph.torch_call(*inputs)
            control = perturbed(*inputs)
        got = runner(*inputs)
        assert [t.shape for t in got] == [t.shape for t in expected]
        diff = max(max_diff(a, b) for a, b in zip(got, expected))
        scale = max(float(t.abs().max()) for t in expected)
        print(f"{name} {graph.sizes(sizes)}: max-abs-diff {diff:.2e} (output scale {scale:.2f})")
        assert diff <= TOLERANCE
        assert scale > 1e-2, "a silent output would make the comparison meaningless"
        control = control if isinstance(control, tuple) else (control,)
        assert max(max_diff(a, b) for a, b in zip(got, control)) > 10 * TOLERANCE


def test_flow_streaming_mel_on_onnxruntime_equals_torch(random_checkpoints, engines):
    from tritontts.families.cosyvoice3.checkpoint import open_checkpoint
    from tritontts.families.cosyvoice3.flow import velocity_graph
    from tritontts.families.cosyvoice3.stages import load_flow

    flow = load_flow(open_checkpoint(random_checkpoints["cosyvoice3"]))
    dit = flow.decoder.estimator
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 6561, (1, 30), generator=generator)
    prompt = torch.randint(0, 6561, (1, 6), generator=generator)
    feat = torch.randn(1, 12, 80, generator=generator)
    embedding = torch.randn(1, 192, generator=generator)

    def mel(upto: int, finalize: bool) -> torch.Tensor:
        out, _ = flow.inference(token=tokens[:, :upto], token_len=torch.tensor([upto]),
                                prompt_token=prompt, prompt_token_len=torch.tensor([6]),
                                prompt_feat=feat, prompt_feat_len=torch.tensor([12]),
                                embedding=embedding, streaming=True, finalize=finalize)
        return out

    chunks = [(12, False), (24, False), (30, True)]
    expected = [mel(n, f) for n, f in chunks]
    dit.velocity_runner = select_runner(velocity_graph(dit), "onnxruntime", root=engines)
    try:
        got = [mel(n, f) for n, f in chunks]
    finally:
        dit.velocity_runner = None
    diffs = [max_diff(a, b) for a, b in zip(got, expected)]
    print(f"flow mel per chunk, onnxruntime vs torch: {diffs}")
    assert max(diffs) <= TOLERANCE


def test_hift_streamed_audio_on_onnxruntime_equals_torch(random_checkpoints, engines):
    from tritontts.families.cosyvoice3.checkpoint import open_checkpoint
    from tritontts.nn.hift import spectrum_graph, stream_hift
    from tritontts.families.cosyvoice3.stages import load_hift

    hift = load_hift(open_checkpoint(random_checkpoints["cosyvoice3"]))
    mel = torch.randn(1, 80, 60, generator=torch.Generator().manual_seed(6))

    def streamed() -> torch.Tensor:
        pieces, sent = [], 0
        for end, final in ((20, False), (40, False), (60, True)):
            audio, sent = stream_hift(hift, mel[:, :, :end], sent, final)
            pieces.append(audio)
        return torch.cat(pieces, dim=1)

    expected = streamed()
    hift.spectrum_runner = select_runner(spectrum_graph(hift), "onnxruntime", root=engines)
    try:
        got = streamed()
    finally:
        hift.spectrum_runner = None
    print(f"hift streamed audio, onnxruntime vs torch: {max_diff(got, expected):.2e}")
    assert got.shape == expected.shape == (1, 60 * hift.samples_per_mel)
    assert max_diff(got, expected) <= TOLERANCE


def test_code2wav_streamed_audio_on_onnxruntime_equals_torch_and_whole(random_checkpoints, engines):
    from tritontts.families.qwen3_tts.code2wav import (
        code2wav_graphs, decode_streaming, load_code2wav)

    codec = load_code2wav(random_checkpoints["qwen3_tts"] / "speech_tokenizer")
    codes = torch.randint(0, codec.cfg.codebook_size, (1, codec.cfg.num_quantizers, 40),
                          generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        whole = codec(codes)
    expected = decode_streaming(codec, codes, chunk_frames=25, initial_chunk_frames=1, growth=2)
    latents, vocoder = code2wav_graphs(codec)
    codec.latents_runner = select_runner(latents, "onnxruntime", root=engines)
    codec.vocode_runner = select_runner(vocoder, "onnxruntime", root=engines)
    try:
        got = decode_streaming(codec, codes, chunk_frames=25, initial_chunk_frames=1, growth=2)
    finally:
        codec.latents_runner = codec.vocode_runner = None
    print(f"code2wav streamed, onnxruntime vs torch {max_diff(got, expected):.2e}, "
          f"vs whole {max_diff(got, whole):.2e}")
    assert max_diff(got, expected) <= TOLERANCE
    assert max_diff(got, whole) <= TOLERANCE


# ------------------------------------------------------------------ selection and caching

class _Doubler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return x * self.scale


def small_graph(module: torch.nn.Module | None = None, name: str = "doubler") -> Graph:
    return Graph(name=name, module=module or _Doubler(),
                 inputs=(TensorSpec("x", torch.float32, ("batch", "frames")),),
                 outputs=("y",), axes={"batch": Axis(1, 1, 4), "frames": Axis(1, 8, 64)})


def test_preference_parsing_orders_names_appends_torch_and_rejects_unknown_names():
    assert parse_preference("tensorrt, onnxruntime") == ("tensorrt", "onnxruntime", "torch")
    assert parse_preference(["torch", "onnxruntime"]) == ("torch", "onnxruntime")
    assert parse_preference("") == ("torch",)
    with pytest.raises(ValueError, match="unknown runtime.*'tensorflow'.*choose from"):
        parse_preference("tensorflow,torch")


def test_without_cuda_tensorrt_is_skipped_with_its_reason_in_one_line(tmp_path):
    lines = []
    runner = select_runner(small_graph(), "tensorrt,onnxruntime,torch", root=tmp_path,
                           report=lines.append)
    assert runner.runtime == "onnxruntime"
    assert len(lines) == 1
    assert "doubler: running on onnxruntime (CPUExecutionProvider)" in lines[0]
    assert "tensorrt: RuntimeError: needs a CUDA device" in lines[0]
    assert torch.equal(runner(torch.ones(2, 5))[0], torch.full((2, 5), 2.0))


def test_missing_onnxruntime_and_unexportable_graph_fall_back_to_torch_saying_why(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(runtime.importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    lines = []
    runner = select_runner(small_graph(), "onnxruntime", root=tmp_path, report=lines.append)
    assert runner.runtime == "torch"
    assert "onnxruntime: RuntimeError: onnxruntime is not installed" in lines[0]
    monkeypatch.undo()

    class DataDependent(torch.nn.Module):
        def forward(self, x):        # Python control flow on a value: torch.export refuses
            return x * 2 if float(x.sum()) > 0 else x

    lines = []
    runner = select_runner(small_graph(DataDependent(), "data_dependent"), "onnxruntime",
                           root=tmp_path, report=lines.append)
    assert runner.runtime == "torch"
    assert lines[0].startswith("data_dependent: running on torch (eager) (skipped onnxruntime: ")
    assert "\n" not in lines[0]
    assert not engine_dir(small_graph(DataDependent(), "data_dependent"), tmp_path).exists()


def test_export_is_cached_by_weights_a_restart_reuses_it_new_weights_export_anew(tmp_path):
    graph = small_graph()
    first = ensure_onnx(graph, tmp_path)
    stamp = first.stat().st_mtime_ns
    assert ensure_onnx(small_graph(copy.deepcopy(graph.module)), tmp_path) == first
    assert first.stat().st_mtime_ns == stamp
    changed = copy.deepcopy(graph.module)
    with torch.no_grad():
        changed.scale.fill_(3.0)
    other = ensure_onnx(small_graph(changed), tmp_path)
    assert other != first and other.is_file()
    assert (first.parent / "graph.json").is_file()


def test_stage_runner_reads_runtime_threads_and_precision_from_the_stage_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONTTS_CACHE", str(tmp_path))
    context = SimpleNamespace(name="s", device="cpu",
                              parameters={"runtime": "onnxruntime", "torch_threads": "1"})
    assert stage_runner(small_graph(), context).runtime == "onnxruntime"
    assert (tmp_path / "engines" / "doubler").is_dir()
    context.parameters = {"runtime": "torch,onnxruntime"}
    assert stage_runner(small_graph(), context).runtime == "torch"
    context.parameters = {"precision": "int4"}
    with pytest.raises(ValueError, match="precision must be fp32 or fp16"):
        stage_runner(small_graph(), context)


def test_tensorrt_profile_spans_each_axis_min_opt_max_with_derived_axes_following(graphs):
    shapes = profile_shapes(graphs["cosyvoice3_hift_spectrum"])
    axes = graphs["cosyvoice3_hift_spectrum"].axes
    low, best, high = shapes["mel_ahead"]
    assert (low[2], best[2], high[2]) == (axes["mel_frames"].min, axes["mel_frames"].opt,
                                          axes["mel_frames"].max)
    # stft frames = decoded mel frames (without the 4 look-ahead) * 120 hops + 1
    assert [s[2] for s in shapes["spec"]] == [(m[2] - 4) * 120 + 1 for m in (low, best, high)]
    assert shapes["spec"][0][1] == 18


def test_method_graph_exports_one_method_of_a_larger_module(tmp_path):
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)

        def first(self, x):
            return (self.a(x),)

    module = Two()
    graph = Graph(name="two_first", module=Method(module, "first"),
                  inputs=(TensorSpec("x", torch.float32, ("batch", 3)),), outputs=("y",),
                  axes={"batch": Axis(1, 2, 8)})
    runner = select_runner(graph, "onnxruntime", root=tmp_path)
    x = torch.randn(5, 3)
    assert max_diff(runner(x)[0], module.first(x)[0]) <= 1e-6


def test_tensorrt_runner_sends_shapes_outside_its_profile_to_torch():
    """The engine itself needs a GPU; its profile guard does not."""
    from tritontts.nn.runtime import TensorRTRunner

    graph = small_graph()
    runner = TensorRTRunner.__new__(TensorRTRunner)     # no engine: only the guard runs
    runner.graph, runner.warned = graph, False
    runner.bounds = {name: (s[0], s[2]) for name, s in profile_shapes(graph).items()}
    assert runner.fits([torch.ones(1, 1)]) and runner.fits([torch.ones(4, 64)])
    assert not runner.fits([torch.ones(5, 8)]) and not runner.fits([torch.ones(1, 65)])
    x = torch.ones(2, 100)
    assert torch.equal(runner(x)[0], 2 * x)
    assert runner.warned
