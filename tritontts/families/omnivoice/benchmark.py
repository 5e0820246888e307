"""OmniVoice at released size (Qwen3-0.6B backbone, the released higgs-audio v2 codec) with
random weights, on this machine, in one run:

1. generator frames per second (the whole unmasking loop, classifier-free guidance on):
   ours (tritontts.families.omnivoice.generator, packed batch) vs the reference package's own
   _generate_iterative (omnivoice 0.2.1, padded batch) on the same weights, batch 1 and 8,
   same texts and target lengths, at equal CPU threads (each arm in a process of its own:
   tritontts/benchmark/arms.py). OmniVoice has no autoregressive talker: this is its
   counterpart of the talker comparison;
2. served through tritonserver + the front: time to first audio and real-time factor at
   concurrency 1 and 4 (streaming PCM, one-sentence texts, so one segment each: the first
   audio is that sentence's; the default 32 steps).

  .venv/bin/python -m tritontts.families.omnivoice.benchmark [--checkpoint DIR] [--frames 50] [--steps 8]
                                                 [--threads 2] [--rounds 2] [--skip-generator]
                                                 [--skip-serving]

Without --checkpoint a random released-size checkpoint is written to .cache/ once.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

import torch

from tritontts.benchmark.arms import enter_arm, report_arm, run_arm
from tritontts.benchmark.served import measure_served
from tritontts.testing.stack import REPO

TEXTS = ["Hello there, how are you today?", "The birch canoe slid on the smooth planks.",
         "Glue the sheet to the dark blue background.", "It's easy to tell the depth of a well.",
         "These days a chicken leg is a rare dish.", "Rice is often served in round bowls.",
         "The juice of lemons makes fine punch.", "The box was thrown beside the parked truck."]


def our_speed(checkpoint, frames: int, steps: int, batches=(1, 8)) -> dict[int, float]:
    from tritontts.families.omnivoice.generator import (
        UnmaskJob, UnmaskSettings, load_generator, unmask)
    from tritontts.families.omnivoice.prompt import TextTokenizer, build_sequence

    model = load_generator(checkpoint)
    tokenizer = TextTokenizer(checkpoint.root)
    cfg = checkpoint.config
    speed = {}
    for batch in batches:
        jobs = []
        for k in range(batch):
            seq = build_sequence(tokenizer, cfg.num_audio_codebook, cfg.audio_mask_id,
                                 TEXTS[k % len(TEXTS)], "en", None, None, None, frames=frames)
            jobs.append(UnmaskJob(torch.from_numpy(seq.ids), seq.audio_start, frames, k,
                                  UnmaskSettings(num_steps=steps)))
        start = time.perf_counter()
        unmask(model, jobs)
        wall = time.perf_counter() - start
        speed[batch] = batch * frames / wall
        print(f"ours, batch {batch}: {batch * frames} frames in {wall:.1f} s", flush=True)
    return speed


def reference_speed(checkpoint, frames: int, steps: int, batches=(1, 8)) -> dict[int, float]:
    import json

    from safetensors.torch import load_file

    from tritontts.families.omnivoice.prompt import TextTokenizer
    from tritontts.families.omnivoice.upstream import omnivoice_module

    with omnivoice_module("omnivoice.models.omnivoice") as module:
        config = module.OmniVoiceConfig(**json.loads((checkpoint.root / "config.json").read_text()))
        config.llm_config._attn_implementation = "sdpa"
        model = module.OmniVoice(config).eval()
        state = {k: v.float() if v.is_floating_point() else v
                 for k, v in load_file(str(checkpoint.path("model.safetensors"))).items()}
        model.load_state_dict(state, strict=True)
        model.float()
        model.text_tokenizer = TextTokenizer(checkpoint.root).tokenizer
        speed = {}
        for batch in batches:
            task = module.GenerationTask(
                batch_size=batch, texts=[TEXTS[k % len(TEXTS)] for k in range(batch)],
                target_lens=[frames] * batch, langs=["en"] * batch, instructs=[None] * batch,
                ref_texts=[None] * batch, ref_audio_tokens=[None] * batch, ref_rms=[None] * batch)
            torch.manual_seed(0)
            start = time.perf_counter()
            with torch.inference_mode():
                model._generate_iterative(task, module.OmniVoiceGenerationConfig(num_step=steps))
            wall = time.perf_counter() - start
            speed[batch] = batch * frames / wall
            print(f"reference, batch {batch}: {batch * frames} frames in {wall:.1f} s", flush=True)
        del model, state
    gc.collect()
    return speed


def serving(checkpoint_dir: Path) -> None:
    # A segment's audio comes whole after all its unmasking steps: minutes at this size on a
    # CPU, longer than the front's default 120 s without audio before it calls a stage hung.
    measure_served("omnivoice", checkpoint_dir, lambda k: {
        "input": TEXTS[k % len(TEXTS)], "seed": k, "language": "en"},
        stall_timeout=3600, warmup={"num_steps": 4})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--frames", type=int, default=50, help="target frames per request (25 a second)")
    parser.add_argument("--steps", type=int, default=8,
                        help="unmasking steps in the generator comparison (time scales with it)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each generator arm, alternating")
    parser.add_argument("--skip-generator", action="store_true")
    parser.add_argument("--skip-serving", action="store_true")
    parser.add_argument("--threads", default="2", help="CPU threads per generator arm (comma-separated)")
    parser.add_argument("--arm", choices=("ours", "reference"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    from tritontts.families.omnivoice.checkpoint import open_checkpoint

    if args.arm:                         # one arm, in a process of its own (arms.py)
        enter_arm()
        arm = our_speed if args.arm == "ours" else reference_speed
        report_arm(arm(open_checkpoint(args.checkpoint), args.frames, args.steps))
        return

    root = args.checkpoint
    if root is None:
        from tritontts.families.omnivoice.random_checkpoint import write_random_checkpoint

        root = REPO / ".cache" / "omnivoice-released"
        if not (root / "audio_tokenizer" / "model.safetensors").exists():
            write_random_checkpoint(root, size="released")
    if not args.skip_generator:
        print(f"generator, {args.frames} frames per request, {args.steps} steps, guidance 2")
        print("| threads | batch | ours frames/s | reference frames/s | ratio |")
        print("|---:|---:|---:|---:|---:|")
        for n in (int(v) for v in args.threads.split(",")):
            arm_args = ["--checkpoint", str(root), "--frames", str(args.frames), "--steps", str(args.steps)]
            # Arms alternate, `rounds` times each; the median per arm (this CPU is noisy).
            runs = {"ours": [], "reference": []}
            for _ in range(args.rounds):
                for arm in runs:
                    runs[arm].append(run_arm(Path(__file__), arm, n, arm_args))
            for batch in ("1", "8"):
                o = statistics.median(r[batch] for r in runs["ours"])
                r = statistics.median(r[batch] for r in runs["reference"])
                print(f"| {n} | {batch} | {o:.2f} | {r:.2f} | {o / r:.2f}× |", flush=True)
    if not args.skip_serving:
        serving(root)


if __name__ == "__main__":
    main()
