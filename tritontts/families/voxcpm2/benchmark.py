"""VoxCPM2 at released size (the 28-layer MiniCPM4 base LM, the 8-layer residual LM, the
12-layer local encoder and DiT, the 2048-channel AudioVAE decoder; sizes partly inferred, see
tritontts/families/voxcpm2/random_checkpoint.py) with random weights, on this machine, in one run:

1. talker patches per second: our vLLM talker (both LMs on paged attention, the local DiT
   inside each step, batched across requests) vs upstream's own loop (voxcpm 2.0.3
   VoxCPM2Model._inference: static KV caches, one request at a time, so its batch of 8 is 8
   requests in turn), fp32 both, batch 1 and 8, equal CPU threads (each arm in a process of
   its own: tritontts/benchmark/arms.py). Every request makes exactly --patches patches (the
   stop decision refused until then), so the arms do equal work;
2. served through tritonserver + the front: time to first audio and real-time factor at
   concurrency 1 and 4 (streaming PCM), zero-shot.

  .venv/bin/python -m tritontts.families.voxcpm2.benchmark [--checkpoint DIR] [--patches 30]
                                                [--threads 2] [--skip-talker] [--skip-serving]

Without --checkpoint a random released-size checkpoint is written to .cache/ once (bf16, as
released).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from tritontts.benchmark.arms import TalkerBenchmark, talker_benchmark_main
from tritontts.benchmark.served import measure_served
from tritontts.testing.stack import REPO

TEXTS = ["The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background.",
         "It's easy to tell the depth of a well.", "These days a chicken leg is a rare dish."]


def build_prompt_of(checkpoint):
    from tritontts.families.voxcpm2.prompt import TextTokenizer, build_prompt

    c = checkpoint.config
    return build_prompt(TextTokenizer(checkpoint.root)(TEXTS[0]), c.patch_size, c.feat_dim)


def vllm_speed(checkpoint, patches: int, batches=(1, 8)) -> dict[int, float]:
    # The engine core in this process: the model and the benchmark share PatchStreams.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, TokensPrompt

    from tritontts.engine.vllm_frames import ROW_TRACKER, register, release
    from tritontts.families.voxcpm2.vllm_model import (
        GO_ON, PatchStream, prepare_vllm_talker, sampling_params)
    from tritontts.families.voxcpm2.vllm_model import register as register_model

    register_model()
    prompt = build_prompt_of(checkpoint)
    llm = LLM(model=str(prepare_vllm_talker(checkpoint)), skip_tokenizer_init=True, dtype="float32",
              enforce_eager=True, enable_prefix_caching=False, max_model_len=1024, max_num_seqs=8,
              seed=0, logits_processors=[ROW_TRACKER], kv_cache_memory_bytes=1 << 30)
    speed = {}
    for batch in batches:
        for warm in (True, False):
            n = 2 if warm else patches
            keys = [f"{batch}-{warm}-{k}" for k in range(batch)]
            for k, key in enumerate(keys):
                register(key, PatchStream(prompt, torch.Generator().manual_seed(k), 10, 2.0))
            # min_len n - 1: the stop decision is refused for all n steps.
            params = [sampling_params(key, n, n - 1) for key in keys]
            start = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=[GO_ON] * prompt.length)] * batch, params, use_tqdm=False)
            wall = time.perf_counter() - start
            made = sum(len(release(key).patches) for key in keys)
        speed[batch] = made / wall
        print(f"vLLM, batch {batch}: {made} patches in {wall:.1f} s = {speed[batch]:.2f} patches/s", flush=True)
    return speed


def reference_speed(checkpoint, patches: int, batches=(1, 8)) -> dict[int, float]:
    from tritontts.families.voxcpm2.upstream import voxcpm2_upstream_model

    model = voxcpm2_upstream_model(checkpoint.root, audio_vae=False)
    prompt = build_prompt_of(checkpoint)
    args = (prompt.ids[None].int(), prompt.text_mask[None].int(), prompt.feats[None], prompt.audio_mask[None].int())

    def run(n: int) -> int:
        # max_len n and min_len n: the loop never breaks early (upstream stops at i > min_len).
        *_, (latents, generated, _) = model._inference(*args, min_len=n, max_len=n)
        return generated.shape[0]

    speed = {}
    torch.manual_seed(0)
    with torch.inference_mode():
        run(2)                                           # warm-up
        for batch in batches:
            start = time.perf_counter()
            made = sum(run(patches) for _ in range(batch))
            wall = time.perf_counter() - start
            speed[batch] = made / wall
            print(f"voxcpm _inference, {batch} request(s) in turn: {made} patches in {wall:.1f} s = "
                  f"{speed[batch]:.2f} patches/s", flush=True)
    return speed  # each arm runs in a process of its own: the model goes with it


def released() -> Path:
    from tritontts.families.voxcpm2.random_checkpoint import write_random_checkpoint

    root = REPO / ".cache" / "voxcpm2-released"
    if not (root / "audiovae.safetensors").exists():
        write_random_checkpoint(root, size="released")
    return root


def serving(root: Path, patches: int) -> None:
    measure_served("voxcpm2", root, lambda k: {"input": TEXTS[k % len(TEXTS)], "seed": k,
                                               "max_new_tokens": patches},
                   stall_timeout=3600, request_timeout=7200)


def main() -> None:
    from tritontts.families.voxcpm2.checkpoint import open_checkpoint

    talker_benchmark_main(TalkerBenchmark(
        script=Path(__file__), doc=__doc__, open_checkpoint=open_checkpoint,
        arms={"vllm": vllm_speed, "reference": reference_speed}, work="patches", work_default=30,
        work_help="talker patches per request (6.25 a second)", unit="patches", released=released,
        serve=serving))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
