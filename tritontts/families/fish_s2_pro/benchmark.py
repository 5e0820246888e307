"""Fish Speech S2 Pro at released size (the 36-layer slow AR, the 4-layer fast AR, the 391 M
codec; special-token ids partly inferred, see tritontts/families/fish_s2_pro/random_checkpoint.py) with
random weights, on this machine, in one run:

1. talker frames per second: our vLLM talker (paged attention; the main-token draw and the
   fast AR inside each step, batched across requests) vs upstream's own decoding loop
   (mizuoto-fishspeech 0.2.3's Decoder, an op-by-op port of fish-speech's: a KV cache, one
   request at a time, so its batch of 8 is 8 requests in turn), batch 1 and 8, at equal CPU
   threads (each arm in a process of its own: tritontts/benchmark/arms.py). Both arms in
   bfloat16, the weights' own dtype: 4.6 B parameters are 18 GB in float32, too close to this
   machine's memory for an arm and its loader. A request ends early only if it draws
   <|im_end|>: each arm counts the frames it really made;
2. served through tritonserver + the front: time to first audio and real-time factor at
   concurrency 1 and 4 (streaming PCM), zero-shot, the talker in bfloat16 (--engine-arg);
3. --codec-context: the codec's chunked decode (4 frames, then 25, with N frames of left
   context) against one whole decode of the same frames, for several N, at released size:
   the error the stage's 25-frame context costs, and what more context would buy.

  .venv/bin/python -m tritontts.families.fish_s2_pro.benchmark [--checkpoint DIR] [--frames 30]
                                                    [--threads 2] [--skip-talker] [--skip-serving]
  .venv/bin/python -m tritontts.families.fish_s2_pro.benchmark --codec-context [--checkpoint DIR]

Without --checkpoint a random released-size checkpoint is written to .cache/ once (bf16, as
released).
"""
from __future__ import annotations

from pathlib import Path

import torch

from tritontts.benchmark.arms import (TalkerBenchmark, codec_context_table, in_turn_speed, talker_benchmark_main,
                                      vllm_frame_speed)
from tritontts.benchmark.served import measure_served
from tritontts.testing.stack import REPO

TEXTS = ["The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background.",
         "It's easy to tell the depth of a well.", "These days a chicken leg is a rare dish."]


def prompt_of(checkpoint) -> torch.Tensor:
    from tritontts.families.fish_s2_pro.prompt import FishPromptBuilder

    return FishPromptBuilder(checkpoint.root, checkpoint.config)(TEXTS[0])


def made(frames: torch.Tensor, im_end: int) -> int:
    """Frames [n, 1 + K] -> how many come before the first <|im_end|>."""
    ended = (frames[:, 0] == im_end).nonzero()
    return int(ended[0]) if len(ended) else int(frames.shape[0])


def vllm_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    from tritontts.families.fish_s2_pro.dual_ar import FrameSampler
    from tritontts.families.fish_s2_pro.vllm_model import FishStream, prepare_vllm_talker, register

    c = checkpoint.config
    prompt = prompt_of(checkpoint)
    register()
    return vllm_frame_speed(prepare_vllm_talker(checkpoint, REPO / ".cache"), prompt[0].tolist(),
                            lambda k: FishStream(prompt, FrameSampler(torch.Generator().manual_seed(k))),
                            lambda got: made(torch.stack(got), c.im_end_id) if got else 0,
                            c.im_end_id, frames, batches, dtype="bfloat16")


def reference_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    import json

    from mizuoto_fishspeech.generate import Decoder, Sampling
    from mizuoto_fishspeech.model import DualARTransformer, ModelArgs, remap_keys
    from safetensors import safe_open

    c = checkpoint.config
    # Built in bfloat16 with uninitialised parameters (upstream's torch.empty: no pages are
    # touched), then the file's tensors assigned in their place: the weights are in memory
    # once.
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = DualARTransformer(ModelArgs.from_config(json.loads(checkpoint.path("config.json").read_text())))
    finally:
        torch.set_default_dtype(torch.float32)
    state = {}
    for path in checkpoint.weight_files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            state.update({k: f.get_tensor(k) for k in f.keys()})
    model.load_state_dict(remap_keys(state), strict=True, assign=True)
    del state
    model = model.eval()
    prompt = prompt_of(checkpoint)
    decoder = Decoder(model, c.im_end_id)

    def run(n: int, seed: int) -> int:
        decoder.start(Sampling(max_new_tokens=n), torch.Generator().manual_seed(seed), lambda: None)
        with torch.inference_mode():
            y = decoder.generate(prompt)
        return made(y[:, prompt.shape[1]:].T, c.im_end_id)

    return in_turn_speed(run, frames, "mizuoto Decoder", batches=batches)
    # each arm runs in a process of its own: the model goes with it


def released() -> Path:
    from tritontts.families.fish_s2_pro.random_checkpoint import write_random_checkpoint

    root = REPO / ".cache" / "fish-s2-pro-released"
    if not (root / "codec.pth").exists():
        write_random_checkpoint(root, size="released")
    return root


def serving(root: Path, frames: int) -> None:
    # bfloat16 as the talker arms (18 GB of fp32 weights would not fit beside the codec
    # stages); 1 GiB of KV cache: one 4096-position request needs 0.6 GiB in bf16.
    measure_served("fish_s2_pro", root, lambda k: {"input": TEXTS[k % len(TEXTS)], "seed": k,
                                                   "max_new_tokens": frames},
                   stall_timeout=3600, request_timeout=7200,
                   engine_args={"fish_s2_pro_talker.dtype": "bfloat16",
                                "fish_s2_pro_talker.kv_cache_memory_bytes": 1 << 30})


def codec_context(root: Path, frames: int = 120, contexts=(25, 50, 100, 200)) -> None:
    """Chunked vs whole decode of random codes at released size, for each left context."""
    from tritontts.families.fish_s2_pro.checkpoint import open_checkpoint
    from tritontts.families.fish_s2_pro.stages import load_served_codec

    codec = load_served_codec(open_checkpoint(root))
    c = codec.config
    gen = torch.Generator().manual_seed(0)
    codes = torch.cat([torch.randint(0, c.semantic_codebook_size, (1, 1, frames), generator=gen),
                       torch.randint(0, c.codebook_size, (1, c.n_codebooks, frames), generator=gen)], dim=1)
    torch.set_num_threads(2)
    codec_context_table(lambda: codec.decode(codes)[0, 0],
                        lambda first, begin, end: codec.decode(codes[..., first:end], first)[0, 0, (begin - first) * c.hop:],
                        frames, contexts, 4, 25)


def main() -> None:
    from tritontts.families.fish_s2_pro.checkpoint import open_checkpoint

    talker_benchmark_main(TalkerBenchmark(
        script=Path(__file__), doc=__doc__, open_checkpoint=open_checkpoint,
        arms={"vllm": vllm_speed, "reference": reference_speed}, work="frames", work_default=30,
        work_help="frames per request (21.5 a second)", unit="frames", released=released, serve=serving,
        modes={"codec-context": ("the stateless codec's error per left context (no talker, no serving)",
                                 codec_context)}))


if __name__ == "__main__":
    main()
