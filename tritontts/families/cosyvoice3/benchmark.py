"""CosyVoice3 at the released network sizes with random weights, on this machine.

1. Talker decode speed: vLLM (the served engine, converted checkpoint) vs plain
   transformers `generate` on the same weights, batch 1 and 8, tokens per second, at equal
   CPU threads (--threads; each arm in a process of its own: tritontts/benchmark/arms.py).
2. The served pipeline (tritonserver + front, streaming): time to first audio and
   real-time factor (wall time / audio seconds) per request.

  .venv/bin/python -m tritontts.families.cosyvoice3.benchmark [--checkpoint DIR] [--threads 1,2]
                                                   [--skip-talker] [--skip-serving]

Without --checkpoint it writes a random released-size checkpoint into .cache/ first (3.4 GB).
"""
from __future__ import annotations

import argparse
import base64
import io
import os
import time
from pathlib import Path

import numpy as np


from tritontts.testing.stack import REPO
from tritontts.benchmark.arms import enter_arm, report_arm, run_arm  # noqa: E402

NEW_TOKENS = 64


def talker_arm(ckpt_dir: Path, arm: str) -> dict[int, float]:
    """One arm in this (fresh) process: tokens per second at batch 1 and 8."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch

    from tritontts.families.cosyvoice3.checkpoint import open_checkpoint
    from tritontts.families.cosyvoice3.talker import ensure_talker_checkpoint, load_talker_vocab

    enter_arm()
    talker_dir = ensure_talker_checkpoint(open_checkpoint(ckpt_dir), REPO / ".cache")
    vocab = load_talker_vocab(talker_dir)
    rng = np.random.default_rng(0)
    prompts = [vocab.prompt_ids(rng.integers(0, 1000, 40).tolist(), rng.integers(0, 6561, 60).tolist())
               for _ in range(8)]
    rates = {}
    if arm == "vllm":
        from vllm import LLM, SamplingParams, TokensPrompt

        llm = LLM(model=str(talker_dir), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                  max_model_len=2048, enable_prefix_caching=False, gpu_memory_utilization=0.3, seed=0)
        params = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, ignore_eos=True, seed=0,
                                allowed_token_ids=vocab.allowed_ids, detokenize=False)
        llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params, use_tqdm=False)  # warm-up
        for batch in (1, 8):
            start = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[:batch]], params, use_tqdm=False)
            rates[batch] = batch * NEW_TOKENS / (time.perf_counter() - start)
    else:
        from transformers import Qwen2ForCausalLM

        model = Qwen2ForCausalLM.from_pretrained(str(talker_dir), torch_dtype=torch.float32).eval()
        with torch.inference_mode():
            model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, min_new_tokens=4, do_sample=True)
            for batch in (1, 8):
                ids = torch.tensor(prompts[:batch])  # same length: no padding needed
                start = time.perf_counter()
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                               min_new_tokens=NEW_TOKENS, do_sample=True, top_k=0, pad_token_id=0)
                rates[batch] = batch * NEW_TOKENS / (time.perf_counter() - start)
    return rates


def talker_speed(ckpt_dir: Path, threads: list[int]):
    print("| threads | batch | vLLM tokens/s | transformers tokens/s | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for n in threads:
        got = {arm: run_arm(Path(__file__), arm, n, ["--checkpoint", str(ckpt_dir)])
               for arm in ("vllm", "transformers")}
        for batch in ("1", "8"):
            v, t = got["vllm"][batch], got["transformers"][batch]
            print(f"| {n} | {batch} | {v:.1f} | {t:.1f} | {v / t:.2f}× |", flush=True)


def serving(ckpt_dir: Path, requests: int):
    import httpx
    import soundfile as sf

    from tritontts.testing.stack import Stack

    tmp = REPO / ".cache" / "bench-cosyvoice3"
    tmp.mkdir(parents=True, exist_ok=True)
    stack = Stack(tmp, ("cosyvoice3",), {"cosyvoice3": ckpt_dir}).start(timeout=1200)
    try:
        rate = 24000
        t = np.arange(rate * 3) / rate
        buf = io.BytesIO()
        sf.write(buf, (0.3 * np.sin(2 * np.pi * 140 * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32),
                 rate, format="WAV")
        body = {"model": "cosyvoice3", "input": "Hello there, how are you today?", "stream_format": "audio",
                "response_format": "pcm", "ref_audio": base64.b64encode(buf.getvalue()).decode(),
                "ref_text": "This is the reference recording."}
        for i in range(requests):
            start = time.perf_counter()
            first, size, chunks = None, 0, 0
            with httpx.stream("POST", stack.url + "/v1/audio/speech", json={**body, "seed": i},
                              timeout=3600) as r:
                r.raise_for_status()
                for piece in r.iter_bytes():
                    first = first or time.perf_counter() - start
                    size += len(piece)
                    chunks += 1
            wall = time.perf_counter() - start
            seconds = size / 2 / rate
            print(f"request {i}: time to first audio {first:.1f} s, {seconds:.2f} s of audio in "
                  f"{wall:.1f} s (RTF {wall / seconds:.1f}), {chunks} pieces", flush=True)
    finally:
        stack.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--skip-talker", action="store_true")
    parser.add_argument("--skip-serving", action="store_true")
    parser.add_argument("--threads", default="1,2", help="CPU threads per talker arm (comma-separated)")
    parser.add_argument("--arm", choices=("vllm", "transformers"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:                         # one arm, in the process talker_speed started
        report_arm(talker_arm(args.checkpoint, args.arm))
        return
    ckpt = args.checkpoint
    if ckpt is None:
        from tritontts.families.cosyvoice3.random_checkpoint import write_random_checkpoint

        ckpt = REPO / ".cache" / "cosyvoice3-released"
        if not (ckpt / "flow.pt").exists():
            write_random_checkpoint(ckpt, size="released")
    if not args.skip_talker:
        talker_speed(ckpt, [int(n) for n in args.threads.split(",")])
    if not args.skip_serving:
        serving(ckpt, args.requests)


if __name__ == "__main__":
    main()
