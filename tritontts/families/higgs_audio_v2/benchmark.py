"""higgs-audio v2 at released size (Llama-3.2-3B talker, the released codec) with random
weights, on this machine, in one run:

1. talker steps per second (one step = one frame of 8 codebooks): our vLLM talker
   (in-process engine, tritontts.families.higgs_audio_v2.vllm_model) vs transformers' own
   HiggsAudioV2ForConditionalGeneration.generate on the same weights, batch 1 and 8 (the
   same prompt 8 times: transformers' batch needs no padding then), sampling as served, at
   equal CPU threads (each arm in a process of its own: tritontts/benchmark/arms.py). A
   request may sample the stream end early: each arm counts the steps it really made;
2. served through tritonserver + the front: time to first audio and real-time factor at
   concurrency 1 and 4 (streaming PCM).

  .venv/bin/python -m tritontts.families.higgs_audio_v2.benchmark [--checkpoint DIR] [--frames 40]
                                                      [--threads 2] [--skip-talker] [--skip-serving]

Without --checkpoint a random released-size checkpoint is written to .cache/ once. DualFFN
makes the "3B" talker 5.8 B parameters: 11.5 GB in bf16, as released, and 23 GB in fp32,
more than this machine's memory, so both arms run the weights' own dtype (bf16; this CPU
has AMX-BF16), one after the other.
"""
from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import torch

from tritontts.benchmark.arms import TalkerBenchmark, talker_benchmark_main
from tritontts.benchmark.served import measure_served
from tritontts.testing.stack import REPO

TEXT = "The birch canoe slid on the smooth planks."
TEXTS = [TEXT, "Glue the sheet to the dark blue background.", "It's easy to tell the depth of a well.",
         "These days a chicken leg is a rare dish."]


def prompt_ids(checkpoint) -> list[int]:
    from tritontts.families.higgs_audio_v2.prompt import TextTokenizer, build_prompt

    return build_prompt(TextTokenizer(checkpoint), TEXT, checkpoint.config.num_codebooks)


def vllm_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams, TokensPrompt

    from tritontts.families.higgs_audio_v2.talker import AudioCodeSampler, AudioSampling
    from tritontts.families.higgs_audio_v2.vllm_model import (
        AudioStream, prepare_vllm_talker, register)
    from tritontts.engine.vllm_frames import FRAMES_ARG, ROW_TRACKER, release
    from tritontts.engine.vllm_frames import register as register_stream

    ids = prompt_ids(checkpoint)
    register()
    llm = LLM(model=str(prepare_vllm_talker(checkpoint, REPO / ".cache")), skip_tokenizer_init=True,
              dtype=checkpoint.config.dtype, enforce_eager=True, enable_prefix_caching=False, max_model_len=512,
              max_num_seqs=8, seed=0, logits_processors=[ROW_TRACKER], kv_cache_memory_bytes=1 << 30)
    cfg = checkpoint.config
    speed = {}
    for batch in batches:
        for warm in (True, False):
            inputs, params, keys = [], [], []
            for k in range(batch):
                key = f"b{batch}-{k}-{warm}"
                register_stream(key, AudioStream(torch.tensor(ids), torch.zeros((0, 8), dtype=torch.int64),
                                                 AudioCodeSampler(cfg, AudioSampling(), torch.Generator().manual_seed(k))))
                inputs.append(TokensPrompt(prompt_token_ids=ids))
                params.append(SamplingParams(temperature=0.0, max_tokens=2 if warm else frames,
                                             stop_token_ids=[cfg.eos_token_id], detokenize=False,
                                             extra_args={FRAMES_ARG: key}))
                keys.append(key)
            start = time.perf_counter()
            llm.generate(inputs, params, use_tqdm=False)
            wall = time.perf_counter() - start
            steps = sum(len(release(key).steps) for key in keys)
        speed[batch] = steps / wall
        print(f"vLLM, batch {batch}: {steps} steps in {wall:.1f} s = {speed[batch]:.2f} steps/s", flush=True)
    return speed


def reference_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    from transformers import HiggsAudioV2ForConditionalGeneration

    ids = prompt_ids(checkpoint)
    g = checkpoint.generation
    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(
        str(checkpoint.root), dtype=getattr(torch, checkpoint.config.dtype)).eval()
    model.generation_config.ras_win_len = g.ras_win_len
    model.generation_config.ras_win_max_num_repeat = g.ras_win_max_num_repeat
    speed = {}
    for batch in batches:
        input_ids = torch.tensor([ids] * batch)
        kwargs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                      temperature=g.temperature, top_k=g.top_k, top_p=g.top_p)
        torch.manual_seed(0)
        with torch.no_grad():
            model.generate(max_new_tokens=2, **kwargs)   # warm-up
            start = time.perf_counter()
            out = model.generate(max_new_tokens=frames, **kwargs)
            wall = time.perf_counter() - start
        # Rows that ended early are padded with stream ends after their last real step.
        ended = (out == checkpoint.config.audio_stream_eos_id).all(dim=2)
        steps = int((~ended).sum()) + int(ended.any(dim=1).sum())
        speed[batch] = steps / wall
        print(f"transformers generate, batch {batch}: {steps} steps in {wall:.1f} s = "
              f"{speed[batch]:.2f} steps/s", flush=True)
    del model
    gc.collect()
    return speed


def serving(checkpoint_dir: Path, frames: int) -> None:
    # A chunk leaves after its 10 frames of codec context: many seconds per chunk at this
    # size on a CPU; the front's stall timeout is raised past that.
    measure_served("higgs_audio_v2", checkpoint_dir, lambda k: {
        "input": TEXTS[k % len(TEXTS)], "seed": k, "max_new_tokens": frames}, stall_timeout=3600)


def released() -> Path:
    from tritontts.families.higgs_audio_v2.random_checkpoint import write_random_checkpoint

    root = REPO / ".cache" / "higgs-audio-v2-released"
    if not (root / "audio_tokenizer" / "model.safetensors").exists():
        write_random_checkpoint(root, size="released")
    return root


def main() -> None:
    from tritontts.families.higgs_audio_v2.checkpoint import open_checkpoint

    talker_benchmark_main(TalkerBenchmark(
        script=Path(__file__), doc=__doc__, open_checkpoint=open_checkpoint,
        arms={"vllm": vllm_speed, "reference": reference_speed}, work="frames", work_default=40,
        work_help="steps per request (25 a second)", unit="steps", released=released,
        serve=serving))


if __name__ == "__main__":
    main()
