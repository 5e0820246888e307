"""Export a family's non-autoregressive networks to ONNX (and TensorRT engines), checked.

  .venv/bin/python build/export.py --family cosyvoice3 --checkpoint DIR
  .venv/bin/python build/export.py --family qwen3_tts --checkpoint DIR --tensorrt --fp16

Each network (Family.graphs: the CosyVoice3 DiT velocity and HiFT spectrum, the
Qwen3-TTS Code2Wav latents and vocoder) is exported with dynamic batch and frame axes into
the cache the stages read ($TRITONTTS_CACHE/engines/<network>/<weights hash>/, or --cache),
so a server started afterwards finds them instead of exporting on first start. With
--tensorrt (a CUDA GPU and the tensorrt package: pip install .[gpu]) an engine is built
beside each ONNX file with one optimization profile over the streaming chunk shapes.
Every result is run against PyTorch on the same inputs and the max-abs-diff printed.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritontts.families import FAMILIES  # noqa: E402
from tritontts.nn.runtime import compare, engine_dir, select_runner  # noqa: E402


def main(argv=None) -> int:
    exportable = [name for name, f in FAMILIES.items() if f.graphs]
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", required=True, choices=exportable)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--cache", type=Path, help="engines folder (default $TRITONTTS_CACHE/engines)")
    parser.add_argument("--tensorrt", action="store_true", help="also build TensorRT engines (GPU)")
    parser.add_argument("--fp16", action="store_true", help="TensorRT engines in fp16")
    parser.add_argument("--device", default="cuda:0", help="GPU for --tensorrt (default cuda:0)")
    args = parser.parse_args(argv)

    graphs = FAMILIES[args.family].export_graphs(args.checkpoint)
    failed = False
    print(f"{'network':32} {'runtime':34} {'seconds':>8} {'max-abs-diff':>13} {'scale':>8}")
    for graph in graphs:
        wanted = ["tensorrt"] if args.tensorrt else ["onnxruntime"]
        device = args.device if args.tensorrt else "cpu"
        if args.tensorrt:
            graph.module.to(device)
        start = time.perf_counter()
        runner = select_runner(graph, wanted, device=device, root=args.cache,
                               precision="fp16" if args.fp16 else "fp32",
                               report=lambda line: print("  " + line, file=sys.stderr))
        took = time.perf_counter() - start
        if runner.runtime != wanted[0]:
            failed = True
        diff, scale = compare(graph, runner)
        print(f"{graph.name:32} {runner.describe():34} {took:8.1f} {diff:13.2e} {scale:8.2f}")
    print(f"exports under {engine_dir(graphs[0], args.cache).parent.parent}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
