"""Deployment profiles: the stage configs rewritten for the hardware they are served on.

    python -m tritontts.deploy.profiles gpu --out DIR                  # every stage + the ensembles
    python -m tritontts.deploy.profiles gpu --out DIR --stages piper_text,piper_vits,tritontts_cancel
    python -m tritontts.deploy.profiles gpu --out DIR --gpus 0,1        # instances on both GPUs

model_repository/ holds the CPU settings, the ones measured (docs/benchmarks.md). A profile
is a rewritten copy of those stage folders, so the committed configs stay the single
source of tensors and wiring and a profile only changes where and how wide each stage
runs; DIR is then a complete model repository (stages + ensembles) for tritonserver.
`python -m frontend --profile gpu` writes one into a temporary folder and serves from it.

  cpu   the committed configs, byte for byte
  gpu   each stage as its gpu.json says (beside its config.pbtxt): KIND_GPU instances
        with its counts and batch size, or kept on the CPU; `runtime`/`precision`
        parameters for the non-autoregressive networks; a vLLM stage's engine arguments
        for CUDA (dtype, CUDA graphs, and its share of the card, computed for the engines
        served together from their weights and KV cache)

No tritonserver, torch or vLLM needed (configs are read with tritonclient's protobufs):
tests and the launcher write profiles anywhere.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
from collections.abc import Mapping, MutableSequence
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from .repository import ENSEMBLE_REPOSITORY, STAGE_REPOSITORY, read_config

PROFILES = ("cpu", "gpu")


class ProfileError(ValueError):
    """The profile cannot be written as asked; the message says what to change."""


# What a stage needs on a GPU is declared beside its config, in <stage>/gpu.json (starting
# points for one H100/H200-class card, not measurements: docs/gpu.md):
#
#   device          "gpu" or "cpu" (a CPU stage: nothing it does per request would be
#                   faster on the card, and a CUDA context would cost memory the engines need)
#   why             the reason, in a sentence, written into the profiled config's header
#   instances       instances per listed GPU (default: the committed count)
#   max_batch_size  (default: the committed one)
#   one_instance    why the stage must stay one instance on the first listed GPU (it keeps
#                   per-stream state)
#   parameters      config parameters set for the GPU (runtime, precision)
#   engine          a vLLM stage: {weights_gib, kv_cache_gib, dtype, cuda_graphs}: its bf16
#                   weights and the least KV cache it should get
#
# vLLM's gpu_memory_utilization is per engine (weights + activations + KV cache), so the
# engines served on one card add up. The profile gives the engines actually served their
# weights and KV cache within ENGINE_BUDGET of the card, and shares what is left over among
# them by KV size (a family served alone gets more KV cache); the rest of the card is the
# flow, vocoder and codec stages' (weights, TensorRT workspaces, CUDA contexts).
GPU_SIZING_FILE = "gpu.json"
ENGINE_BUDGET = 0.8
DEFAULT_GPU_MEMORY_GIB = 80.0          # the smallest H100-class card


@dataclass(frozen=True)
class Engine:
    weights_gib: float
    kv_cache_gib: float
    dtype: str = "bfloat16"
    cuda_graphs: bool = True

    @property
    def need_gib(self) -> float:
        return self.weights_gib + self.kv_cache_gib


@dataclass(frozen=True)
class GpuSizing:
    device: str
    why: str
    instances: int | None = None
    max_batch_size: int | None = None
    one_instance: str | None = None
    parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    engine: Engine | None = None


def gpu_sizing(stage_dir: Path) -> GpuSizing:
    """The stage's gpu.json, checked; ProfileError naming the file and the field otherwise."""
    path = stage_dir / GPU_SIZING_FILE
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProfileError(f"{path}: every stage declares its GPU sizing here ({exc})") from None
    known = {f.name for f in dataclasses.fields(GpuSizing)}
    if not isinstance(raw, dict) or set(raw) - known or raw.get("device") not in ("gpu", "cpu") \
            or not isinstance(raw.get("why"), str):
        raise ProfileError(f"{path}: an object with device \"gpu\" or \"cpu\", why, and "
                           f"optionally {sorted(known - {'device', 'why'})}; got {raw!r}")
    engine = raw.pop("engine", None)
    try:
        sizing = GpuSizing(**raw, engine=None if engine is None else Engine(**engine))
    except TypeError as exc:
        raise ProfileError(f"{path}: {exc}") from None
    for name in ("instances", "max_batch_size"):
        value = getattr(sizing, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ProfileError(f"{path}: {name} must be a positive integer, got {value!r}")
    if sizing.engine is not None and (sizing.engine.weights_gib <= 0 or sizing.engine.kv_cache_gib <= 0):
        raise ProfileError(f"{path}: engine weights_gib and kv_cache_gib must be positive")
    return sizing


def engine_shares(engines: dict[str, Engine], counts: dict[str, int],
                  gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB) -> dict[str, float]:
    """Each engine stage's gpu_memory_utilization when `counts[stage]` engines of it (one per
    served checkpoint) share one card of `gpu_memory_gib`: its weights and KV cache, plus
    its part (by KV size) of what the budget leaves over. ProfileError if they do not fit."""
    budget = ENGINE_BUDGET * gpu_memory_gib
    need = sum(engines[s].need_gib * n for s, n in counts.items())
    if need > budget + 1e-9:
        listed = ", ".join(f"{s} x{n}" if n > 1 else s for s, n in sorted(counts.items()))
        raise ProfileError(
            f"the vLLM engines {listed} need {need:.1f} GiB together (weights + least KV cache, "
            f"from their gpu.json), over {ENGINE_BUDGET} of a {gpu_memory_gib:g} GiB card "
            f"({budget:.1f} GiB): serve fewer of them on one card, or give the card's memory "
            "with --gpu-memory-gib")
    kv = sum(engines[s].kv_cache_gib * n for s, n in counts.items())
    spare = budget - need
    return {s: round((engines[s].need_gib + spare * engines[s].kv_cache_gib / kv) / gpu_memory_gib, 4)
            for s in counts}


def stage_names(source: Path = STAGE_REPOSITORY) -> list[str]:
    return sorted(p.name for p in source.iterdir() if (p / "config.pbtxt").is_file())


def write_profile_repository(profile: str, stages: list[str] | None, out: Path,
                             source: Path = STAGE_REPOSITORY,
                             gpus: list[int] | None = None, engines: list[str] | None = None,
                             gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB) -> Path:
    """Copy the stage folders `stages` (default: all) from `source` into `out`, rewritten
    for `profile`; returns `out`. `gpus`: the GPU ids each GPU stage's instances go on.
    `engines`: the vLLM stages to size memory for, one entry per engine (a family served
    with two checkpoints runs two; default: each vLLM stage among `stages` once)."""
    if profile not in PROFILES:
        raise ProfileError(f"unknown profile {profile!r}; profiles: {', '.join(PROFILES)}")
    known = stage_names(source)
    stages = known if stages is None else list(stages)
    unknown = [s for s in stages if s not in known]
    if unknown:
        raise ProfileError(f"no stage {unknown} in {source}; stages: {', '.join(known)}")
    gpus = [0] if gpus is None else list(gpus)
    shares: dict[str, float] = {}
    if profile == "gpu":
        if not gpus or any(g < 0 for g in gpus):
            raise ProfileError(f"--gpus {gpus}: give one or more GPU ids (0, 1, ...)")
        shares = check_engines(stages if engines is None else engines, source, gpu_memory_gib)
    out.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        target = out / stage
        shutil.copytree(source / stage, target, dirs_exist_ok=True)
        if profile == "gpu":
            gpu_stage(target, source / stage, gpus, shares.get(stage), gpu_memory_gib)
    return out


def check_engines(stages: list[str], source: Path = STAGE_REPOSITORY,
                  gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB) -> dict[str, float]:
    """The gpu_memory_utilization of each vLLM stage among `stages` (one entry per engine),
    from their gpu.json; ProfileError if one declares no engine or they do not fit."""
    counts: dict[str, int] = {}
    engines: dict[str, Engine] = {}
    for stage in stages:
        if engine_settings_path(source / stage) is None:
            continue
        sizing = gpu_sizing(source / stage)
        if sizing.engine is None:
            raise ProfileError(f"{source / stage / GPU_SIZING_FILE}: {stage} runs a vLLM engine; "
                               "declare its \"engine\": {weights_gib, kv_cache_gib, dtype, cuda_graphs}")
        engines[stage] = sizing.engine
        counts[stage] = counts.get(stage, 0) + 1
    return engine_shares(engines, counts, gpu_memory_gib) if counts else {}


def copy_ensembles(out: Path, source: Path = ENSEMBLE_REPOSITORY) -> list[Path]:
    """The ensembles whose stages are all in `out`, unchanged: they name their stages, and
    a profile only raises batch sizes, so each ensemble's max_batch_size (the least of its
    stages') still fits. One with a stage missing would stop a server that loads every
    model, so it is left out."""
    copied = []
    for name in stage_names(source):
        steps = read_config(source / name / "config.pbtxt").ensemble_scheduling.step
        if all((out / step.model_name / "config.pbtxt").is_file() for step in steps):
            shutil.copytree(source / name, out / name, dirs_exist_ok=True)
            copied.append(out / name)
    return copied


def engine_settings_path(stage_dir: Path) -> Path | None:
    """The stage's vLLM settings (1/model.json with engine_args), if it runs a vLLM engine."""
    path = stage_dir / "1" / "model.json"
    if path.is_file() and "engine_args" in json.loads(path.read_text()):
        return path
    return None


def gpu_stage(target: Path, origin: Path, gpus: list[int], share: float | None,
              gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB) -> None:
    path = target / "config.pbtxt"
    original = path.read_text()
    config = read_config(path)
    sizing = gpu_sizing(origin)
    settings = engine_settings_path(target)
    notes = []
    if sizing.device == "cpu":
        notes.append(f"Kept on the CPU: {sizing.why}")
    else:
        # A talker's engine is built on the process's current CUDA device whatever its
        # instance's GPU (tritontts/engine/vllm_talker.py), so a second instance would land
        # on the first card and take a second share of it: talkers stay on the first GPU.
        # A one-instance stage likewise.
        placed = gpus[:1] if settings is not None or sizing.one_instance else gpus
        for group in config.instance_group:
            group.kind = mc.ModelInstanceGroup.Kind.KIND_GPU
            del group.gpus[:]
            group.gpus.extend(placed)
            if sizing.instances is not None:
                group.count = sizing.instances
        if sizing.max_batch_size is not None:
            config.max_batch_size = sizing.max_batch_size
        for key, value in sizing.parameters.items():
            # A map: assigning replaces a parameter of that key rather than repeating it.
            config.parameters[key].string_value = value
        notes.append(f"On the GPU (its gpu.json): {sizing.why}")
        if sizing.one_instance:
            notes.append(f"One instance: {sizing.one_instance}")
    if settings is not None:
        gpu_engine(settings, sizing.engine, share, gpu_memory_gib)
        notes.append(f"Engine arguments in 1/model.json rewritten for CUDA vLLM: "
                     f"gpu_memory_utilization {share} for the engines served together.")
    header = leading_comments(original) + [
        "# gpu profile (python -m tritontts.deploy.profiles), written from",
        f"# {origin.parent.name}/{origin.name}/config.pbtxt, whose comments explain each field."]
    header += [f"# {line}" for note in notes for line in textwrap.wrap(note, 88)]
    path.write_text("\n".join(header) + "\n" + config_text(config))


def gpu_engine(settings_path: Path, engine: Engine, share: float,
               gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB) -> None:
    settings = json.loads(settings_path.read_text())
    # The card the share is of: the stage checks at load that its checkpoint's weights and
    # --kv-requests full-length requests fit in it (tritontts.engine.kv_budget.size_gpu_share).
    settings["gpu_memory_gib"] = gpu_memory_gib
    args = settings["engine_args"]
    # A byte budget for the KV cache is the CPU backend's; on CUDA the share decides it.
    args.pop("kv_cache_memory_bytes", None)
    args["gpu_memory_utilization"] = share
    args["dtype"] = engine.dtype
    args["enforce_eager"] = not engine.cuda_graphs
    settings_path.write_text(json.dumps(settings, indent=2) + "\n")


def leading_comments(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


# Fields a reader looks for first; the rest follow in field-number order.
FIELD_ORDER = ("name", "backend", "platform", "max_batch_size", "model_transaction_policy",
               "dynamic_batching", "sequence_batching", "input", "output", "instance_group",
               "parameters")


def config_text(config: mc.ModelConfig) -> str:
    """Text format in the committed configs' layout: one line per tensor, instance group
    and parameter, so a profiled config reads like its source."""
    present = config.ListFields()
    present.sort(key=lambda item: (FIELD_ORDER.index(item[0].name) if item[0].name in FIELD_ORDER
                                   else len(FIELD_ORDER), item[0].number))
    one_line = dict(as_one_line=True, use_short_repeated_primitives=True)
    lines = []
    for field, value in present:
        if isinstance(value, Mapping):
            scalar = field.message_type.fields_by_name["value"].message_type is None
            for key in sorted(value):
                entry = mc.ModelConfig()
                if scalar:      # e.g. cc_model_filenames: string -> string
                    getattr(entry, field.name)[key] = value[key]
                else:
                    getattr(entry, field.name)[key].CopyFrom(value[key])
                lines.append(text_format.MessageToString(entry, **one_line))
        elif isinstance(value, MutableSequence) and field.message_type is not None:
            items = [f"  {{ {text_format.MessageToString(item, **one_line)} }}" for item in value]
            lines += [f"{field.name} [", ",\n".join(items), "]"]
        else:
            alone = mc.ModelConfig()
            alone.CopyFrom(config)
            for other, _ in present:
                if other is not field:
                    alone.ClearField(other.name)
            lines.append(text_format.MessageToString(
                alone, use_short_repeated_primitives=True).rstrip("\n"))
    return "\n".join(lines) + "\n"


def gpu_ids(value: str) -> list[int]:
    try:
        ids = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a list of GPU ids like 0,1") from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"{value!r} is not a list of GPU ids like 0,1")
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritontts.deploy.profiles", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", choices=PROFILES)
    parser.add_argument("--out", type=Path, required=True, help="the model repository to write")
    parser.add_argument("--stages", help="comma-separated stage models (default: all); an "
                        "ensemble is copied when all its stages are")
    parser.add_argument("--gpus", type=gpu_ids, default=[0], help="GPU ids (default: 0)")
    parser.add_argument("--gpu-memory-gib", type=float, default=DEFAULT_GPU_MEMORY_GIB,
                        help="memory of one card, which the vLLM engines' shares are of "
                             f"(default: {DEFAULT_GPU_MEMORY_GIB:g})")
    args = parser.parse_args(argv)
    stages = None if args.stages is None else [s.strip() for s in args.stages.split(",") if s.strip()]
    try:
        write_profile_repository(args.profile, stages, args.out, gpus=args.gpus,
                                 gpu_memory_gib=args.gpu_memory_gib)
    except ProfileError as exc:
        print(exc, file=sys.stderr)
        return 2
    copy_ensembles(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
