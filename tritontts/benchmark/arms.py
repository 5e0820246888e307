"""Talker benchmarks at equal CPU threads: each arm (vLLM, the reference's generate) runs in
a fresh process of its own with the same thread count.

Why a process each: vLLM's CPU worker picks its own threads. By default it reserves one
core for its scheduler and pins its compute threads to the rest (on 2 cores: 1 thread on
core 0, whatever OMP_NUM_THREADS says), and it makes torch.set_num_threads a no-op in its
process, so an arm run after it in the same process gets whatever vLLM left. An arm's
process gets OMP_NUM_THREADS=n and VLLM_CPU_OMP_THREADS_BIND=0-(n-1) (vLLM binds exactly
those cores), calls `enter_arm()` (torch's threads for a non-vLLM arm) and prints one JSON
line, which includes the threads torch really ran with.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


def arm_environment(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads),
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}"}


def enter_arm() -> int:
    """In an arm's process, before any work: torch's intra-op threads = OMP_NUM_THREADS."""
    import torch

    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    return threads


def report_arm(result: dict[str, Any]) -> None:
    """An arm's last output line: its numbers plus the threads torch ran with."""
    import torch

    print(json.dumps({**{str(k): v for k, v in result.items()},
                      "torch_threads": torch.get_num_threads()}), flush=True)


def arm_command(script: Path) -> list[str]:
    """How to run a benchmark again in a process of its own: a module of this package (a
    family's benchmark.py) with -m, so its folder does not become sys.path[0]."""
    path = Path(script).resolve()
    package = Path(__file__).resolve().parents[1]
    if path.is_relative_to(package):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        return [sys.executable, "-m", module]
    return [sys.executable, str(path)]


def run_arm(script: Path, arm: str, threads: int, args: list[str]) -> dict[str, Any]:
    """`python script --arm ARM *args` at `threads` threads; its JSON line."""
    out = subprocess.run([*arm_command(script), "--arm", arm, *args],
                         env=arm_environment(threads), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{arm} arm failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["torch_threads"] != threads:
        raise RuntimeError(f"{arm} ran with {result['torch_threads']} threads, not {threads}")
    return result


def compare_talker_arms(script: Path, arm_args: list[str], threads: str, unit: str) -> None:
    """The talker table every family benchmark prints: for each thread count, the vLLM arm
    and the reference arm (`script --arm vllm|reference *arm_args`), batch 1 and 8."""
    print(f"| threads | batch | vLLM {unit}/s | reference {unit}/s | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for n in (int(v) for v in threads.split(",")):
        got = {arm: run_arm(script, arm, n, arm_args) for arm in ("vllm", "reference")}
        for batch in ("1", "8"):
            v, r = got["vllm"][batch], got["reference"][batch]
            print(f"| {n} | {batch} | {v:.2f} | {r:.2f} | {v / r:.2f}× |", flush=True)


@dataclass(frozen=True)
class TalkerBenchmark:
    """What a family's talker benchmark script (tritontts/families/<family>/benchmark.py) differs in; the
    command line, the arms in processes of their own, the table and the serving run are
    `talker_benchmark_main`'s."""
    script: Path                                  # the script itself (arms re-run it)
    doc: str
    open_checkpoint: Callable[[Path], Any]
    arms: dict[str, Callable[[Any, int], dict]]    # "vllm" / "reference": (checkpoint, work) -> {batch: rate}
    work: str                                     # the per-request work option: "tokens", "frames"
    work_default: int
    work_help: str
    unit: str                                     # the table's rate unit
    released: Callable[[], Path]                  # the released-size random checkpoint, written once
    serve: Callable[[Path, int], None]            # (checkpoint, work) -> the served measurement
    threads: str = "2"
    # Other measurements the script offers: option name -> (help, run(checkpoint root)).
    modes: dict[str, tuple[str, Callable[[Path], None]]] = field(default_factory=dict)


def talker_benchmark_main(bench: TalkerBenchmark) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=bench.doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument(f"--{bench.work}", type=int, default=bench.work_default, help=bench.work_help)
    parser.add_argument("--skip-talker", action="store_true")
    parser.add_argument("--skip-serving", action="store_true")
    parser.add_argument("--threads", default=bench.threads, help="CPU threads per talker arm (comma-separated)")
    parser.add_argument("--arm", choices=tuple(bench.arms), help=argparse.SUPPRESS)
    for name, (text, _) in bench.modes.items():
        parser.add_argument(f"--{name}", action="store_true", help=text)
    args = parser.parse_args()
    work = getattr(args, bench.work)
    for name, (_, run) in bench.modes.items():
        if getattr(args, name.replace("-", "_")):
            run(args.checkpoint or bench.released())
            return
    if args.arm:                         # one arm, in a process of its own
        enter_arm()
        report_arm(bench.arms[args.arm](bench.open_checkpoint(args.checkpoint), work))
        return
    root = args.checkpoint or bench.released()
    if not args.skip_talker:
        print(f"talker, {work} {bench.work} per request")
        compare_talker_arms(bench.script, ["--checkpoint", str(root), f"--{bench.work}", str(work)],
                            args.threads, bench.unit)
    if not args.skip_serving:
        bench.serve(root, work)


def vllm_frame_speed(model_dir: Path, prompt_ids: list[int], new_stream: Callable[[int], Any],
                     audio_frames: Callable[[list], int], stop_token: int, frames: int, batches=(1, 8),
                     dtype: str = "float32", kv_cache_bytes: int = 1 << 30) -> dict[int, float]:
    """The vLLM arm of a per-frame talker (tritontts.engine.vllm_frames): an in-process engine on the
    talker's folder; per batch size, a 2-frame warm-up, then `batch` requests of `frames`
    frames together (request k's stream from `new_stream(k)`, registered under its key);
    frames/s counts `audio_frames(stream.frames)` of each (an end frame is not audio)."""
    import time

    # The engine core in this process: the model and the benchmark share the streams.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams, TokensPrompt

    from ..engine.vllm_frames import FRAMES_ARG, ROW_TRACKER, register, release

    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, enforce_eager=True,
              enable_prefix_caching=False, max_model_len=512, max_num_seqs=8, seed=0,
              logits_processors=[ROW_TRACKER], kv_cache_memory_bytes=kv_cache_bytes)
    speed = {}
    for batch in batches:
        for warm in (True, False):
            keys = [f"{batch}-{warm}-{k}" for k in range(batch)]
            for k, key in enumerate(keys):
                register(key, new_stream(k))
            params = [SamplingParams(temperature=0.0, max_tokens=2 if warm else frames, stop_token_ids=[stop_token],
                                     detokenize=False, extra_args={FRAMES_ARG: key}) for key in keys]
            start = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)] * batch, params, use_tqdm=False)
            wall = time.perf_counter() - start
            made = sum(audio_frames(release(key).frames) for key in keys)
        speed[batch] = made / wall
        print(f"vLLM, batch {batch}: {made} frames in {wall:.1f} s = {speed[batch]:.2f} frames/s", flush=True)
    return speed


def in_turn_speed(run: Callable[[int, int], int], frames: int, label: str, unit: str = "frames",
                  batches=(1, 8)) -> dict[int, float]:
    """A reference arm that generates one request at a time: `run(work, k)` generates request
    k (seed k) and returns the work it made; batch b is b requests in turn. One warm-up."""
    import time

    run(2, 0)
    speed = {}
    for batch in batches:
        start = time.perf_counter()
        made = sum(run(frames, k) for k in range(batch))
        wall = time.perf_counter() - start
        speed[batch] = made / wall
        print(f"{label}, {batch} request(s) in turn: {made} {unit} in {wall:.1f} s = {speed[batch]:.2f} {unit}/s",
              flush=True)
    return speed


def codec_context_table(whole: Callable[[], Any], window: Callable[[int, int, int], Any], frames: int,
                        contexts, first_chunk: int, chunk: int) -> None:
    """A stateless chunked decode vs one whole decode, per left context: `whole()` -> the
    utterance's audio; `window(first, begin, end)` -> the audio of frames begin..end decoded
    from frame `first` (its context). Chunks of first_chunk frames, then chunk. Prints a
    table: the error, relative to the peak, and the chunks' decode time vs the whole's."""
    import time

    import torch

    with torch.inference_mode():
        whole()                                   # warm-up: the first call pays one-time costs
        start = time.perf_counter()
        reference = whole()
        whole_s = time.perf_counter() - start
        peak = float(reference.abs().max())
        print(f"whole decode of {frames} frames: {whole_s:.1f} s, peak {peak:.3f}")
        print("| left context (frames) | max-abs-diff vs whole | relative to peak | decode time vs whole |")
        print("|---:|---:|---:|---:|")
        for context in contexts:
            pieces, begin, size = [], 0, first_chunk
            start = time.perf_counter()
            while begin < frames:
                end = min(begin + size, frames)
                pieces.append(window(max(0, begin - context), begin, end))
                begin, size = end, chunk
            spent = time.perf_counter() - start
            diff = float((torch.cat(pieces) - reference).abs().max())
            print(f"| {context} | {diff:.2e} | {diff / peak:.2e} | {spent / whole_s:.2f}× |", flush=True)
