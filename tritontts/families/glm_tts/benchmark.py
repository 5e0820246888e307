"""GLM-TTS at released size (the 28-layer, 2048-wide Llama talker, the 18-layer DiT, the
512-channel HiFT) with random weights, on this machine, in one run:

1. talker tokens per second: the checkpoint's llm/ on stock vLLM with our RAS logits
   processor vs transformers' LlamaForCausalLM.generate (top-k 25 / top-p 0.8 sampling, the
   nearest its generate comes to RAS) on the same weights, batch 1 and 8 (the same prompt 8
   times), at equal CPU threads (each arm in a process of its own: tritontts/benchmark/arms.py).
   Every request makes exactly --tokens tokens (min = max), so the arms do equal work;
2. served through tritonserver + the front: time to first audio and real-time factor at
   concurrency 1 and 4 (streaming PCM), cloning a 3 s reference.

  .venv/bin/python -m tritontts.families.glm_tts.benchmark [--checkpoint DIR] [--tokens 100]
                                                [--threads 2] [--skip-talker] [--skip-serving]

Without --checkpoint a random released-size checkpoint is written to .cache/ once (the talker
in bf16, as released: 1.9 B parameters).
"""
from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import torch

from tritontts.benchmark.arms import TalkerBenchmark, talker_benchmark_main
from tritontts.benchmark.served import measure_served
from tritontts.family import synthetic_reference
from tritontts.testing.stack import REPO

TEXTS = ["The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background.",
         "It's easy to tell the depth of a well.", "These days a chicken leg is a rare dish."]


def prompt_ids(checkpoint) -> list[int]:
    """A real GLM-TTS prompt: transcript, text, <|begin_of_audio|>, 75 prompt speech tokens."""
    from tritontts.families.glm_tts.talker import History, segment_prompt
    from tritontts.families.glm_tts.tokenizer import GLMTextTokenizer

    tokenizer = GLMTextTokenizer(checkpoint.tokenizer_dir)
    return segment_prompt(tokenizer.encode("This is the reference voice. "), list(range(0, 7500, 100)),
                          tokenizer.encode(TEXTS[0]), History(), tokenizer.ids.boa, tokenizer.ids.ats)


def vllm_speed(checkpoint, tokens: int, batches=(1, 8)) -> dict[int, float]:
    # The engine core in this process: its own process would print after the arm's result.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams, TokensPrompt

    from tritontts.families.glm_tts.talker import RAS_DEFAULTS
    from tritontts.families.glm_tts.tokenizer import AUDIO_TOKENS, GLMTextTokenizer
    from tritontts.nn.ras import ras_extra_args
    from tritontts.engine.vllm_ras import RAS_LOGITS_PROCESSOR

    ids = GLMTextTokenizer(checkpoint.tokenizer_dir).ids
    prompt = prompt_ids(checkpoint)
    llm = LLM(model=str(checkpoint.llm_dir), skip_tokenizer_init=True, dtype=checkpoint.llm_dtype,
              enforce_eager=True, enable_prefix_caching=False, max_model_len=1024, max_num_seqs=8,
              seed=0, logits_processors=[RAS_LOGITS_PROCESSOR], kv_cache_memory_bytes=1 << 30)
    speed = {}
    for batch in batches:
        for warm in (True, False):
            n = 2 if warm else tokens
            params = [SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=k, detokenize=False,
                                     min_tokens=n, max_tokens=n, stop_token_ids=[ids.eoa],
                                     extra_args=ras_extra_args(ids.ats, AUDIO_TOKENS, RAS_DEFAULTS,
                                                               extra_ids=[ids.eoa], min_tokens=n,
                                                               stop_ids=[ids.eoa]))
                      for k in range(batch)]
            start = time.perf_counter()
            outs = llm.generate([TokensPrompt(prompt_token_ids=prompt)] * batch, params, use_tqdm=False)
            wall = time.perf_counter() - start
        made = sum(len(o.outputs[0].token_ids) for o in outs)
        speed[batch] = made / wall
        print(f"vLLM, batch {batch}: {made} tokens in {wall:.1f} s = {speed[batch]:.2f} tokens/s", flush=True)
    return speed


def reference_speed(checkpoint, tokens: int, batches=(1, 8)) -> dict[int, float]:
    from transformers import LlamaForCausalLM

    from tritontts.families.glm_tts.tokenizer import GLMTextTokenizer

    eoa = GLMTextTokenizer(checkpoint.tokenizer_dir).ids.eoa
    prompt = prompt_ids(checkpoint)
    model = LlamaForCausalLM.from_pretrained(str(checkpoint.llm_dir),
                                             dtype=getattr(torch, checkpoint.llm_dtype)).eval()
    speed = {}
    for batch in batches:
        input_ids = torch.tensor([prompt] * batch)
        kwargs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                      top_k=25, top_p=0.8, temperature=1.0, eos_token_id=eoa, pad_token_id=eoa)
        torch.manual_seed(0)
        with torch.no_grad():
            model.generate(min_new_tokens=2, max_new_tokens=2, **kwargs)     # warm-up
            start = time.perf_counter()
            out = model.generate(min_new_tokens=tokens, max_new_tokens=tokens, **kwargs)
            wall = time.perf_counter() - start
        made = (out.shape[1] - input_ids.shape[1]) * batch
        speed[batch] = made / wall
        print(f"transformers generate, batch {batch}: {made} tokens in {wall:.1f} s = "
              f"{speed[batch]:.2f} tokens/s", flush=True)
    del model
    gc.collect()
    return speed


def released() -> Path:
    from tritontts.families.glm_tts.random_checkpoint import write_random_checkpoint

    root = REPO / ".cache" / "glm-tts-released"
    if not (root / "frontend" / "campplus.onnx").exists():
        write_random_checkpoint(root, size="released")
    return root


def serving(root: Path, tokens: int) -> None:
    reference = synthetic_reference()
    measure_served("glm_tts", root, lambda k: {"input": TEXTS[k % len(TEXTS)], "seed": k, **reference},
                   stall_timeout=3600, request_timeout=7200)


def main() -> None:
    from tritontts.families.glm_tts.checkpoint import open_checkpoint

    talker_benchmark_main(TalkerBenchmark(
        script=Path(__file__), doc=__doc__, open_checkpoint=open_checkpoint,
        arms={"vllm": vllm_speed, "reference": reference_speed}, work="tokens", work_default=100,
        work_help="talker tokens per request (25 a second)", unit="tokens", released=released,
        serve=serving))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
