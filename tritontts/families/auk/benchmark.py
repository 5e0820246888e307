"""AuK at released size (Qwen2.5-Omni-3B's thinker, the 10 + 20-block DiT, the VAE) with random
weights, on this machine, each measurement side by side with its reference in one run:

1. the condition encoder, prompt tokens per second: our vLLM engine (Qwen2 layers, every
   layer fused in the forward, requests batched) vs transformers' Qwen2.5-Omni thinker with
   output_hidden_states and the upstream fusion (one request at a time: batch 8 is 8 in
   turn), fp32 both, batch 1 and 8, equal CPU threads (each arm in a process of its own);
2. served through tritonserver + the front: time to first audio and real-time factor at
   concurrency 1 and 4 (streaming PCM), AuK-Flash (4 steps, no CFG: the base recipe's 32
   steps x 2 CFG rows take minutes per request on this CPU), 2 s of audio per request;
3. --dit: seconds per Euler step per request for a 5 s target (250 frames, 60 text tokens),
   our DiT batched (1 and 4 requests) vs vLLM-Omni 0.30's AuKTransformer + sample_latents
   (one request at a time), with CFG (2 rows per request) and without;
4. --vae: decoding 5 s (250 frames): our VAE whole and in the stage's chunks (10, then
   doubling to 200, each with its context), vs vLLM-Omni 0.30's AuKVAE.decode.

  .venv/bin/python -m tritontts.families.auk.benchmark [--checkpoint DIR] [--tokens 80] [--threads 2]
                                            [--skip-talker] [--skip-serving]
  .venv/bin/python -m tritontts.families.auk.benchmark --dit | --vae [--checkpoint DIR]

Without --checkpoint a random released-size AuK-Flash checkpoint (vLLM-Omni's layout) is
written to .cache/ once (bf16, as released: about 11 GB; no vision tower).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from tritontts.benchmark.arms import TalkerBenchmark, in_turn_speed, talker_benchmark_main
from tritontts.benchmark.served import measure_served
from tritontts.testing.stack import REPO

INSTRUCTION = ('Generate speech based on the following description: "A warm, low voice, unhurried.". '
               'The content to speak is: "The birch canoe slid on the smooth planks. Glue the sheet to the '
               'dark blue background. It is easy to tell the depth of a well."')
SOUNDS = ["A dog barks twice, then a door closes.", "Rain on a tin roof, distant thunder.",
          "A crowd cheers in a stadium.", "Birds sing at dawn by a river."]


def prompt(checkpoint, tokens: int) -> list[int]:
    """The instruction's prompt ids, cut or repeated to `tokens` (the work per request)."""
    from tritontts.families.auk.prompt import PromptBuilder

    ids = PromptBuilder(checkpoint.thinker_root)(INSTRUCTION).ids
    return (ids * (tokens // len(ids) + 1))[:tokens]


def vllm_speed(checkpoint, tokens: int, batches=(1, 8)) -> dict[int, float]:
    from vllm import SamplingParams, TokensPrompt

    from tritontts.families.auk.prompt import IM_END, PromptBuilder
    from tritontts.families.auk.vllm_model import EncoderRequest, prepare_vllm_encoder, register
    from tritontts.testing.engine import frames_engine
    from tritontts.engine.vllm_frames import FRAMES_ARG, register as register_request, release

    register()
    folder = prepare_vllm_encoder(checkpoint, PromptBuilder(checkpoint.thinker_root).special[IM_END],
                                  REPO / ".cache")
    llm = frames_engine(folder, 256 << 20, max_model_len=1024, max_num_batched_tokens=8192)
    ids = prompt(checkpoint, tokens)

    def run(n: int, tag: str) -> float:
        params = []
        for k in range(n):
            register_request(f"{tag}{k}", EncoderRequest(len(ids)))
            params.append(SamplingParams(max_tokens=1, detokenize=False, extra_args={FRAMES_ARG: f"{tag}{k}"}))
        start = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=ids)] * n, params, use_tqdm=False)
        wall = time.perf_counter() - start
        for k in range(n):
            release(f"{tag}{k}")
        return n * len(ids) / wall

    run(1, "warm")
    return {b: run(b, f"b{b}-") for b in batches}


def reference_speed(checkpoint, tokens: int, batches=(1, 8)) -> dict[int, float]:
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

    from safetensors import safe_open

    from tritontts.families.auk.random_checkpoint import VISION_TINY
    from tritontts.families.auk.upstream import auk_fused_condition

    # The vision tower is never run here: a tiny one keeps 2.7 GB out of this arm's memory.
    # Tensors are copied in one at a time (fp32 model + one bf16 tensor, not two models).
    config = Qwen2_5OmniThinkerConfig(**{**checkpoint.thinker_config, "vision_config": VISION_TINY})
    model = Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
    params = dict(model.state_dict())
    with torch.no_grad():
        for f in checkpoint.thinker_files:
            with safe_open(str(f), framework="pt") as handle:
                for key in handle.keys():
                    name = key[len("thinker."):]
                    if key.startswith("thinker.") and not name.startswith("visual.") and name in params:
                        params[name].copy_(handle.get_tensor(key))
    fusion = checkpoint.read_fusion()
    ids = torch.tensor([prompt(checkpoint, tokens)])

    def one(_n: int, _k: int) -> int:
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
            fused = auk_fused_condition(hidden, *fusion)
        return int(fused.shape[0])

    return in_turn_speed(one, tokens, "transformers thinker", unit="tokens", batches=batches)


def released() -> Path:
    from tritontts.families.auk.random_checkpoint import write_random_checkpoint

    root = REPO / ".cache" / "auk-flash-released"
    if not (root / "auk.safetensors").exists():
        write_random_checkpoint(root, size="released", variant="flash")
    return root


def serving(root: Path, tokens: int) -> None:
    del tokens
    measure_served("auk", root, lambda k: {"input": "", "instructions": SOUNDS[k % len(SOUNDS)], "seed": k,
                                           "extra_params": {"duration_seconds": 2.0}},
                   stall_timeout=3600, request_timeout=7200,
                   # The thinker in bf16 (6.2 GB, vLLM's CPU bf16 kernels): in fp32 (12.4 GB) beside
                   # the fp32 DiT (6 GB) the stack would not fit this machine's 24 GB.
                   engine_args={"auk_encoder.dtype": "bfloat16"})


def dit_steps(root: Path, frames: int = 250, text_tokens: int = 60) -> None:
    """Seconds per Euler step per request: ours batched vs vLLM-Omni's one at a time."""
    from tritontts.families.auk.checkpoint import open_checkpoint
    from tritontts.families.auk.dit import SampleRequest, load_transformer, sample_latents
    from tritontts.families.auk.upstream import auk_module

    torch.set_num_threads(2)
    ckpt = open_checkpoint(root)
    tensors = {k: v.float() for k, v in ckpt.read_weights().items()}
    text = torch.randn(text_tokens, ckpt.dit["text_hidden_dim"], generator=torch.Generator().manual_seed(0))
    grid = torch.tensor([0.0, 0.5, 1.0])
    print("| DiT, 250 frames, 60 text tokens | CFG | s per step per request | ratio to the reference |")
    print("|---|---:|---:|---:|")
    ours = load_transformer(tensors, ckpt.dit)
    reqs = [SampleRequest(text, torch.zeros(0, 64), frames, k) for k in range(4)]
    sample_latents(ours, reqs[:1], torch.tensor([0.0, 1.0]), 0.0)          # warm-up (one step)
    timings = {}
    for cfg in (2.0, 0.0):
        for n in (1, 4):
            start = time.perf_counter()
            sample_latents(ours, reqs[:n], grid, cfg)
            timings[cfg, n] = (time.perf_counter() - start) / 2 / n
    del ours
    with auk_module("auk_transformer") as ref_module:
        ref = ref_module.AuKTransformer(**ckpt.dit).eval()
        ref.load_state_dict(ref_module.dit_state_dict(tensors), strict=True)

        def reference(cfg: float, nfe: int) -> float:
            start = time.perf_counter()
            ref_module.sample_latents(ref, text=text[None], c_mask=torch.ones(1, text_tokens, dtype=torch.bool),
                                      ref=torch.zeros(1, 0, 64), ref_mask=torch.ones(1, 0, dtype=torch.bool),
                                      gen_frames=frames, nfe=nfe, cfg_strength=cfg, sway_sampling_coef=None,
                                      generator=torch.Generator().manual_seed(0), latent_dim=64, device="cpu",
                                      dtype=torch.float32)
            return (time.perf_counter() - start) / nfe

        reference(0.0, 1)                                                    # warm-up (one step)
        references = {cfg: reference(cfg, 2) for cfg in (2.0, 0.0)}
    for cfg in (2.0, 0.0):
        per = {n: timings[cfg, n] for n in (1, 4)}
        reference_s = references[cfg]
        for n in (1, 4):
            print(f"| ours, batch {n} | {cfg:g} | {per[n]:.2f} | {reference_s / per[n]:.2f}× |", flush=True)
        print(f"| vLLM-Omni 0.30, one request | {cfg:g} | {reference_s:.2f} | 1.00× |", flush=True)


def vae_decode(root: Path, frames: int = 250) -> None:
    """5 s of latents decoded: ours whole, ours in the stage's chunks, vLLM-Omni's whole."""
    from tritontts.families.auk.checkpoint import open_checkpoint
    from tritontts.families.auk.vae import chunk_bounds, load_vae
    from tritontts.families.auk.upstream import auk_module

    torch.set_num_threads(2)
    ckpt = open_checkpoint(root)
    latents = torch.randn(1, frames, 64, generator=torch.Generator().manual_seed(0))
    vae = load_vae(ckpt.vae_file, ckpt.vae)
    bounds = list(chunk_bounds(frames))
    vae.decode(latents[:, :20])                                  # warm-up
    start = time.perf_counter()
    whole = vae.decode(latents)
    t_whole = time.perf_counter() - start
    start = time.perf_counter()
    first_at = None
    pieces = []
    for s, e in bounds:
        pieces.append(vae.decode_range(latents, s, e))
        first_at = first_at or time.perf_counter() - start
    t_chunks = time.perf_counter() - start
    diff = float((torch.cat(pieces, dim=1) - whole).abs().max())
    with auk_module("auk_vae") as ref_module:
        ref = ref_module.AuKVAE.from_config(ckpt.vae)
        ref.load_weights(str(ckpt.vae_file))
        ref.eval()
        with torch.no_grad():
            ref.decode(latents[:, :20])                          # warm-up
            start = time.perf_counter()
            ref.decode(latents)
        t_ref = time.perf_counter() - start
    seconds = frames / ckpt.frame_rate
    print(f"| VAE, {seconds:g} s of audio | wall s | RTF |")
    print("|---|---:|---:|")
    print(f"| ours, whole | {t_whole:.2f} | {t_whole / seconds:.2f} |")
    print(f"| ours, chunks {[e - s for s, e in bounds]} (first chunk after {first_at:.2f} s; "
          f"max-abs-diff to whole {diff:.1e}) | {t_chunks:.2f} | {t_chunks / seconds:.2f} |")
    print(f"| vLLM-Omni 0.30, whole | {t_ref:.2f} | {t_ref / seconds:.2f} |")


def main() -> None:
    from tritontts.families.auk.checkpoint import open_checkpoint

    talker_benchmark_main(TalkerBenchmark(
        script=Path(__file__), doc=__doc__, open_checkpoint=open_checkpoint,
        arms={"vllm": vllm_speed, "reference": reference_speed}, work="tokens", work_default=80,
        work_help="prompt tokens per request", unit="prompt tokens", released=released, serve=serving,
        modes={"dit": ("the DiT's seconds per step, ours batched vs vLLM-Omni's (no encoder, no serving)",
                       dit_steps),
               "vae": ("the VAE's decode, whole and chunked, vs vLLM-Omni's (no encoder, no serving)",
                       vae_decode)}))


if __name__ == "__main__":
    main()
