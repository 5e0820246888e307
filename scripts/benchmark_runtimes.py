"""onnxruntime vs PyTorch eager, per exportable network, at released sizes on this CPU.

  .venv/bin/python scripts/benchmark_runtimes.py [--threads 1 2] [--repeats 5] [--json OUT]

Builds each family's networks at the released sizes with random weights (timing does not
depend on the values), exports them (tritontts.nn.runtime, into a temporary cache unless
--cache), then times both runtimes on the shapes a streaming request feeds them, in
alternating order per repeat (this machine is noisy: ratios from the same run, medians).
The stages run one thread per instance (config torch_threads), so 1 thread is the row that
decides the CPU default; 2 threads shows how each scales.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritontts.nn.runtime import Graph, OnnxRuntimeRunner, TorchRunner, ensure_onnx  # noqa: E402

# Shapes a streaming request feeds each network (see each graph's docstring): CosyVoice3
# after a 3 s prompt (150 mel frames) at its first chunk (+50) and a later one (+450);
# Qwen3-TTS at a stream's first frame and a steady 25-frame chunk with its left context.
SHAPES = {
    "cosyvoice3_flow_velocity": [{"batch": 2, "frames": 200}, {"batch": 2, "frames": 600}],
    "cosyvoice3_hift_spectrum": [{"batch": 1, "mel_frames": 204}, {"batch": 1, "mel_frames": 604}],
    "qwen3_tts_code2wav_latents": [{"batch": 1, "frames": 1}, {"batch": 1, "frames": 605}],
    "qwen3_tts_code2wav_vocoder": [{"batch": 1, "frames": 1}, "opt"],
    # One two-sentence segment with guidance in one row; four requests' segments in 4 rows.
    "omnivoice_generator_logits": [{"rows": 1, "tokens": 200}, {"rows": 4, "tokens": 256}],
    # A 3 s segment and a 10 s one.
    "higgs_codec_decoder": [{"batch": 1, "frames": 75}, {"batch": 1, "frames": 250}],
}


def released_graphs() -> list[Graph]:
    from tritontts.weights.hyperpyyaml import load_hyperpyyaml
    from tritontts.families.cosyvoice3.flow import build_flow, velocity_graph
    from tritontts.nn.hift import HiFTGenerator, spectrum_graph
    from tritontts.families.cosyvoice3.random_checkpoint import write_config
    from tritontts.families.qwen3_tts.code2wav import (
        Code2WavConfig, Qwen3TTSCode2Wav, code2wav_graphs)
    from tritontts.nn.higgs_codec import (
        HiggsCodecConfig, HiggsCodecDecoder, decoder_graph)
    from tritontts.nn.higgs_codec.random import codec_config_dict
    from tritontts.families.omnivoice.checkpoint import parse_config
    from tritontts.families.omnivoice.generator import OmniVoiceGenerator, logits_graph
    from tritontts.families.omnivoice.random_checkpoint import config_dict
    from tritontts.families.qwen3_tts.random_checkpoint import speech_tokenizer_config

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        config = load_hyperpyyaml(write_config(Path(folder), "released"), {"qwen_pretrain_path": ""})
    flow = build_flow(config["flow"]).eval()
    hift = HiFTGenerator.from_config(config["hift"]).eval()
    codec_config = speech_tokenizer_config("0.6b")     # the codec is the same in every release
    codec = Qwen3TTSCode2Wav(Code2WavConfig.from_dict(codec_config["decoder_config"])).eval()
    generator = OmniVoiceGenerator(parse_config(config_dict("released"), Path("config.json"))).eval()
    higgs = HiggsCodecDecoder(HiggsCodecConfig.from_dict(codec_config_dict("released"))).eval()
    return [velocity_graph(flow.decoder.estimator), spectrum_graph(hift), *code2wav_graphs(codec),
            logits_graph(generator), decoder_graph(higgs)]


def time_call(fn, inputs, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.inference_mode():
            fn(*inputs)
        out.append(time.perf_counter() - start)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    cache = args.cache or Path(tempfile.mkdtemp(prefix="runtimes-"))
    rows = []
    for graph in released_graphs():
        start = time.perf_counter()
        onnx_path = ensure_onnx(graph, cache)
        export_s = time.perf_counter() - start
        params = sum(p.numel() for p in graph.module.parameters())
        print(f"{graph.name}: {params / 1e6:.1f} M parameters in its module, "
              f"export {export_s:.0f} s", file=sys.stderr)
        for threads in args.threads:
            torch.set_num_threads(threads)
            runners = {"torch": TorchRunner(graph),
                       "onnxruntime": OnnxRuntimeRunner(onnx_path, graph, threads=threads)}
            for shape in SHAPES[graph.name]:
                sizes = graph.sizes() if shape == "opt" else graph.sizes(shape)
                inputs = graph.example(sizes, seed=1)
                times = {name: [] for name in runners}
                for name, runner in runners.items():      # warm-up (first-shape setup)
                    time_call(runner, inputs, 1)
                for repeat in range(args.repeats):
                    order = list(runners) if repeat % 2 == 0 else list(reversed(runners))
                    for name in order:
                        times[name] += time_call(runners[name], inputs, 1)
                t_torch, t_ort = (statistics.median(times[n]) for n in ("torch", "onnxruntime"))
                row = {"network": graph.name, "threads": threads,
                       "shape": {k: v for k, v in sizes.items() if k != "batch" or v != 1},
                       "torch_ms": 1000 * t_torch, "onnxruntime_ms": 1000 * t_ort,
                       "torch_over_onnxruntime": t_torch / t_ort, "export_s": export_s}
                rows.append(row)
                print(f"{graph.name:28} threads {threads} {json.dumps(row['shape']):38} torch "
                      f"{row['torch_ms']:9.1f} ms  onnxruntime {row['onnxruntime_ms']:9.1f} ms  "
                      f"ratio {row['torch_over_onnxruntime']:.2f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"cpu": torch.backends.cpu.get_cpu_capability(),
                                         "torch": torch.__version__, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
