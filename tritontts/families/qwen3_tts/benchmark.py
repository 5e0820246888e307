"""Qwen3-TTS at released (0.6B) size with random weights, on this machine, in one run:

1. talker frames per second (backbone + code predictor, 16 codes a frame): our vLLM talker
   (in-process engine, tritontts.families.qwen3_tts.vllm_model) vs the reference's own generate
   (qwen-tts-compat, transformers) on the same weights, batch 1 and 8, same prompts, at
   equal CPU threads (--threads; each arm in a process of its own:
   tritontts/benchmark/arms.py);
2. served through tritonserver + the front: time to first audio and real-time factor at
   concurrency 1 and 4 (streaming PCM).

  .venv/bin/python -m tritontts.families.qwen3_tts.benchmark [--checkpoint DIR] [--frames 32] [--threads 1,2]
                                                 [--skip-talker] [--skip-serving]

Without --checkpoint a random 0.6B CustomVoice checkpoint is written to .cache/ once.
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

TEXTS = ["Hello there, how are you today?", "The birch canoe slid on the smooth planks.",
         "Glue the sheet to the dark blue background.", "It's easy to tell the depth of a well.",
         "These days a chicken leg is a rare dish.", "Rice is often served in round bowls.",
         "The juice of lemons makes fine punch.", "The box was thrown beside the parked truck."]


def prompts(checkpoint, n: int):
    from tritontts.families.qwen3_tts.prompt import TextTokenizer, custom_voice_prompt
    from tritontts.families.qwen3_tts.talker import load_talker

    talker = load_talker(checkpoint)
    tokenizer = TextTokenizer(checkpoint)
    speaker = checkpoint.speakers[0]
    with torch.no_grad():
        built = [custom_voice_prompt(talker, tokenizer.assistant_ids(TEXTS[k % len(TEXTS)]), speaker)
                 for k in range(n)]
        pad = talker.tts_embeds()[2].detach()
    ids = [tokenizer.assistant_ids(TEXTS[k % len(TEXTS)]) for k in range(n)]
    del talker
    gc.collect()
    return built, pad, ids, speaker


def vllm_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams, TokensPrompt

    from tritontts.families.qwen3_tts.talker import CONTROL_TAIL
    from tritontts.families.qwen3_tts.vllm_model import prepare_vllm_talker, register
    from tritontts.engine.vllm_frames import FRAMES_ARG, ROW_TRACKER, FrameStream, release
    from tritontts.engine.vllm_frames import register as register_stream

    built, pad, _, _ = prompts(checkpoint, max(batches))
    register()
    llm = LLM(model=str(prepare_vllm_talker(checkpoint, REPO / ".cache")), skip_tokenizer_init=True,
              dtype="float32", enforce_eager=True, enable_prefix_caching=False, max_model_len=1024,
              max_num_seqs=8, seed=0, logits_processors=[ROW_TRACKER],
              kv_cache_memory_bytes=1 << 30)
    t = checkpoint.config.talker
    allowed = list(range(t.vocab_size - CONTROL_TAIL))   # no EOS: every request runs `frames`
    speed = {}
    for batch in batches:
        for warm in (True, False):
            inputs, params, keys = [], [], []
            for k in range(batch):
                key = f"b{batch}-{k}-{warm}"
                register_stream(key, FrameStream(built[k].embeds, built[k].trailing_text, pad,
                                                 torch.Generator().manual_seed(k),
                                                 {"do_sample": True, "temperature": 0.9, "top_k": 50}))
                inputs.append(TokensPrompt(prompt_token_ids=[t.codec_pad_id] * built[k].embeds.shape[0]))
                params.append(SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=k,
                                             max_tokens=(2 if warm else frames) + 1,
                                             allowed_token_ids=allowed, detokenize=False,
                                             extra_args={FRAMES_ARG: key}))
                keys.append(key)
            start = time.perf_counter()
            llm.generate(inputs, params, use_tqdm=False)
            wall = time.perf_counter() - start
            made = sum(len(release(key).frames) for key in keys)
        speed[batch] = made / wall
        print(f"vLLM talker, batch {batch}: {made} frames in {wall:.1f} s = {speed[batch]:.2f} frames/s",
              flush=True)
    del llm
    gc.collect()
    return speed


def reference_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    from safetensors.torch import load_file

    from tritontts.families.qwen3_tts.upstream import qwen_tts_module

    _, _, ids, speaker = prompts(checkpoint, max(batches))
    speed = {}
    with qwen_tts_module("qwen_tts.core.models.modeling_qwen3_tts") as ref:
        model = ref.Qwen3TTSForConditionalGeneration(
            ref.Qwen3TTSConfig.from_pretrained(str(checkpoint.root))).eval()
        state = {k: v.float() for k, v in load_file(str(checkpoint.path("model.safetensors"))).items()}
        model.load_state_dict(state, strict=False)
        model = model.float()
        for batch in batches:
            input_ids = [torch.tensor([ids[k]]) for k in range(batch)]
            kwargs = dict(input_ids=input_ids, languages=["auto"] * batch, speakers=[speaker] * batch,
                          do_sample=True, subtalker_dosample=True,
                          # an id codebook 0 never samples: every request runs `frames` frames
                          eos_token_id=checkpoint.config.talker.codec_pad_id)
            with torch.no_grad():
                model.generate(max_new_tokens=3, **kwargs)   # warm-up
                start = time.perf_counter()
                model.generate(max_new_tokens=frames + 1, **kwargs)
                wall = time.perf_counter() - start
            speed[batch] = batch * frames / wall
            print(f"reference generate, batch {batch}: {batch * frames} frames in {wall:.1f} s = "
                  f"{speed[batch]:.2f} frames/s", flush=True)
        del model, state
    gc.collect()
    return speed


def serving(checkpoint_dir: Path, frames: int) -> None:
    measure_served("qwen3_tts", checkpoint_dir, lambda k: {
        "input": TEXTS[k % len(TEXTS)], "seed": k, "max_new_tokens": frames})


def released() -> Path:
    from tritontts.families.qwen3_tts.random_checkpoint import write_random_checkpoint

    root = REPO / ".cache" / "qwen3-tts-0.6b-custom-voice"
    if not (root / "speech_tokenizer" / "model.safetensors").exists():
        write_random_checkpoint(root, kind="custom_voice", size="0.6b")
    return root


def main() -> None:
    from tritontts.families.qwen3_tts.checkpoint import open_checkpoint

    talker_benchmark_main(TalkerBenchmark(
        script=Path(__file__), doc=__doc__, open_checkpoint=open_checkpoint,
        arms={"vllm": vllm_speed, "reference": reference_speed}, work="frames", work_default=32,
        work_help="frames per request", unit="frames", released=released, serve=serving,
        threads="1,2"))


if __name__ == "__main__":
    main()
