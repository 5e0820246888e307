"""Gepard-1.0 at released size (the 14-layer x 1024 Qwen3.5 backbone, the 32 heads, the
NanoCodec decoder; sizes partly inferred, see tritontts/families/gepard/random_checkpoint.py) with
random weights, on this machine, in one run:

1. talker frames per second: our vLLM talker (paged attention + the hybrid cache, our fp32
   gated-delta core, the heads inside each step, batched across requests, each request's
   own generator) vs the reference loop (tritontts.families.gepard.upstream.gepard_upstream_frames:
   transformers' Qwen3_5ForCausalLM with its cache + vLLM-Omni 0.30's heads, one request at
   a time: batch 8 is 8 requests in turn), fp32 both (or bf16 both: TRITONTTS_BENCH_DTYPE=bfloat16),
   batch 1 and 8, equal CPU threads (each
   arm in a process of its own: tritontts/benchmark/arms.py). The random stop head never
   fires at this size: every request makes its frames;
2. served through tritonserver + the front: time to first audio and real-time factor at
   concurrency 1 and 4 (streaming PCM).

  .venv/bin/python -m tritontts.families.gepard.benchmark [--checkpoint DIR] [--frames 30]
                                               [--threads 2] [--skip-talker] [--skip-serving]
  .venv/bin/python -m tritontts.families.gepard.benchmark --codec-context [--checkpoint DIR]

Without --checkpoint a random released-size checkpoint is written to .cache/ once (bf16, as
released would be: 1.6 GB, and the 250 MB codec archive).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from tritontts.benchmark.arms import (TalkerBenchmark, codec_context_table, in_turn_speed, talker_benchmark_main,
                                      vllm_frame_speed)
from tritontts.benchmark.served import measure_served
from tritontts.testing.stack import REPO

# Both talker arms' dtype: float32 (default), or bfloat16 (TRITONTTS_BENCH_DTYPE=bfloat16):
# vLLM's CPU matmuls and Gated-DeltaNet kernels are built for bf16 (AMX), its fp32 path is not.
DTYPE = os.environ.get("TRITONTTS_BENCH_DTYPE", "float32")
TEXTS = ["The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background.",
         "It's easy to tell the depth of a well.", "These days a chicken leg is a rare dish."]


def prompt_ids(checkpoint) -> list[int]:
    from tritontts.families.gepard.prompt import GepardPromptBuilder

    return GepardPromptBuilder(checkpoint.root, checkpoint.config)(TEXTS[0])


def vllm_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    from tritontts.families.gepard.vllm_model import (
        STOP, GepardStream, prepare_vllm_talker, register)

    register()
    ids = prompt_ids(checkpoint)
    return vllm_frame_speed(prepare_vllm_talker(checkpoint, REPO / ".cache"), ids,
                            lambda k: GepardStream(torch.tensor(ids), torch.Generator().manual_seed(k)),
                            lambda made: sum(1 for f in made if not int(f[STOP])),
                            checkpoint.config.end_of_speech, frames, batches, dtype=DTYPE)


def reference_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    from tritontts.families.gepard.upstream import gepard_upstream_frames, gepard_upstream_talker

    backbone, omni = gepard_upstream_talker(checkpoint)
    backbone, omni = backbone.to(getattr(torch, DTYPE)), omni.to(getattr(torch, DTYPE))
    ids = prompt_ids(checkpoint)
    return in_turn_speed(lambda n, k: gepard_upstream_frames(backbone, omni, checkpoint.config, ids, k, n).shape[0],
                         frames, "reference loop", batches=batches)
    # each arm runs in a process of its own: the model goes with it


def released() -> Path:
    from tritontts.families.gepard.random_checkpoint import write_random_checkpoint

    root = REPO / ".cache" / "gepard-released"
    if not (root / "model.safetensors").exists() or not list(root.glob("*.nemo")):
        write_random_checkpoint(root, size="released")
    return root


def serving(root: Path, frames: int) -> None:
    measure_served("gepard", root, lambda k: {"input": TEXTS[k % len(TEXTS)], "seed": k, "max_new_tokens": frames},
                   stall_timeout=3600, request_timeout=7200)


def codec_context(root: Path, frames: int = 120, contexts=(8, 25)) -> None:
    """The talker's chunk plan (10 frames, then 86) decoded with each left context vs one
    whole decode of random codes at released size: vLLM-Omni's 8-frame lookback and the
    decoder's receptive field (25)."""
    from tritontts.families.gepard.checkpoint import open_checkpoint
    from tritontts.families.gepard.stages import load_served_codec

    codec = load_served_codec(open_checkpoint(root))
    levels = torch.tensor(codec.config.code_levels)
    codes = (torch.rand(1, levels.shape[0], frames, generator=torch.Generator().manual_seed(0))
             * levels[None, :, None]).long()
    torch.set_num_threads(2)
    codec_context_table(lambda: codec.decode_codes(codes)[0],
                        lambda first, begin, end: codec.decode_window(codes[:, :, first:end], begin - first)[0],
                        frames, contexts, 10, 86)


def main() -> None:
    from tritontts.families.gepard.checkpoint import open_checkpoint

    talker_benchmark_main(TalkerBenchmark(
        script=Path(__file__), doc=__doc__, open_checkpoint=open_checkpoint,
        arms={"vllm": vllm_speed, "reference": reference_speed}, work="frames", work_default=30,
        work_help="frames per request (21.5 a second)", unit="frames", released=released, serve=serving,
        modes={"codec-context": ("the chunked codec's error with vLLM-Omni's 8-frame lookback and with the "
                                 "receptive field, 25 (no talker, no serving)", codec_context)}))


if __name__ == "__main__":
    main()
