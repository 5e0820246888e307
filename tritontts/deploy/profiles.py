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
  gpu   KIND_GPU instances with the counts and batch sizes of GPU_STAGES (stages in
        CPU_STAGES stay on the CPU), `runtime`/`precision` parameters for the
        non-autoregressive networks, and the talkers' vLLM engine arguments for CUDA
        (TALKERS: each engine's share of the card, dtype, CUDA graphs)

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
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from .repository import ENSEMBLE_REPOSITORY, STAGE_REPOSITORY, read_config

PROFILES = ("cpu", "gpu")


class ProfileError(ValueError):
    """The profile cannot be written as asked; the message says what to change."""


@dataclass(frozen=True)
class GpuStage:
    count: int              # instances per listed GPU
    max_batch_size: int


# Starting points for one H100/H200-class card, not measurements (docs/gpu.md). Two
# instances per stage let one batch run on the card while the other instance is in Python
# (unpacking inputs, packing responses). The flow gets the smaller batch: its DiT runs 10
# CFG steps over every frame so far, where the vocoder and codec make one pass over a
# chunk. Stages not listed keep their counts and batch sizes (the talkers: one vLLM
# engine, which batches inside itself).
GPU_STAGES: dict[str, GpuStage] = {
    "cosyvoice3_flow": GpuStage(count=2, max_batch_size=8),
    "cosyvoice3_hift": GpuStage(count=2, max_batch_size=16),
    "qwen3_tts_code2wav": GpuStage(count=2, max_batch_size=16),
    # One instance (ONE_INSTANCE below); larger batches: every step is one backbone pass over
    # all of a batch's segments.
    "omnivoice_generator": GpuStage(count=1, max_batch_size=16),
    "omnivoice_decoder": GpuStage(count=2, max_batch_size=16),
    "higgs_audio_v2_decoder": GpuStage(count=2, max_batch_size=16),
    # Stateful per stream (ONE_INSTANCE below); PyTorch on the card, no exported graphs yet.
    "glm_tts_flow": GpuStage(count=1, max_batch_size=8),
    "glm_tts_vocoder": GpuStage(count=1, max_batch_size=16),
    # Stateless (left context), batched by window length; PyTorch on the card.
    "voxcpm2_audio_vae": GpuStage(count=2, max_batch_size=16),
    "voxtral_tts_codec": GpuStage(count=2, max_batch_size=16),
    # Stateful per stream (ONE_INSTANCE below): exact streaming with the decoder's state.
    "fish_s2_pro_codec": GpuStage(count=1, max_batch_size=16),
    # The piper stage picks its onnxruntime providers itself (tritontts/families/piper/vits.py): on
    # a GPU instance it gains only once that code asks for the CUDA provider.
    "piper_vits": GpuStage(count=2, max_batch_size=16),
    # AuK: the prompt stage runs the audio tower and the VAE encoder on clips; the DiT is
    # where AuK's time goes (steps x CFG rows x 30 blocks); the VAE decodes the chunks.
    "auk_prompt": GpuStage(count=1, max_batch_size=4),
    "auk_dit": GpuStage(count=1, max_batch_size=8),
    "auk_vae": GpuStage(count=2, max_batch_size=4),
}

# Stages that stay KIND_CPU in the gpu profile, and why: nothing they do per request
# would be faster on the card, and a CUDA context in their processes would cost memory
# the talkers need.
CPU_STAGES: dict[str, str] = {
    "tritontts_cancel": "it only writes cancel marks (tritontts/serving/cancellation.py)",
    "piper_text": "text normalization and espeak-ng phonemization are CPU code",
    "cosyvoice3_prompt": ("per request it only tokenizes text; its networks (speech "
                          "tokenizer, CAM++) run once per new reference, whose features "
                          "are cached by content"),
    "qwen3_tts_prompt": ("per request it only tokenizes and looks up text embeddings; its "
                         "encoders run once per new reference, whose features are cached "
                         "by content"),
    "omnivoice_prompt": ("per request it only tokenizes text and estimates durations; its "
                         "codec encoder runs once per new reference, whose codes are cached "
                         "by content"),
    "higgs_audio_v2_prompt": ("per request it only tokenizes text; its codec encoder runs "
                              "once per new reference, whose codes are cached by content"),
    "glm_tts_prompt": ("per request it only tokenizes text; its networks (WhisperVQ, CAM++) "
                       "run once per new reference, whose features are cached by content"),
    "voxcpm2_prompt": ("per request it only tokenizes text; its AudioVAE encoder runs once "
                       "per new reference, whose patches are cached by content"),
    "voxtral_tts_prompt": "it only tokenizes text (mistral-common)",
    "fish_s2_pro_prompt": ("per request it only tokenizes text; its codec encoder runs once "
                           "per new reference, whose codes are cached by content"),
}

# GPU stages that must stay one instance on the first listed GPU, and why.
ONE_INSTANCE: dict[str, str] = {
    "omnivoice_generator": "it keeps each stream's first-segment codes for the later segments",
    "glm_tts_flow": "it keeps each stream's ODE trajectory for the stream's next chunk",
    "glm_tts_vocoder": "it keeps each stream's send position and cross-fade tail",
    "fish_s2_pro_codec": "it keeps each stream's decoder state (transformer keys and values, conv context)",
}

# The non-autoregressive networks (tritontts/nn/runtime.py's stage_runner reads these):
# TensorRT first (an engine from build/export.py or built on first start), onnxruntime's
# CUDA provider next, PyTorch last. No `device` parameter: the stage takes its device from
# its instance's kind and GPU id.
GPU_PARAMETERS: dict[str, dict[str, str]] = {
    stage: {"runtime": "tensorrt,onnxruntime,torch", "precision": "fp16"}
    for stage in ("cosyvoice3_flow", "cosyvoice3_hift", "qwen3_tts_code2wav",
                  "omnivoice_generator", "omnivoice_decoder", "higgs_audio_v2_decoder")
}


@dataclass(frozen=True)
class Talker:
    share: float            # vLLM gpu_memory_utilization: this engine's part of the card
    dtype: str = "bfloat16"
    cuda_graphs: bool = True


# vLLM's gpu_memory_utilization is per engine (weights + activations + KV cache), so the
# shares of the talkers served together add up. Every talker has its share here, whether
# or not it is served, and all of them together stay within TALKER_BUDGET: any set of
# families fits on one card, leaving the rest to the flow, vocoder and codec stages (their
# weights, TensorRT workspaces, CUDA contexts). A family added later takes its share from
# this table, lowering others' if the sum would pass the budget (a test checks it).
TALKER_BUDGET = 0.8
TALKERS: dict[str, Talker] = {
    # A stock Qwen2 decoder (its logits processor runs after the forward): CUDA graphs
    # can capture the forward.
    # 0.1 since Voxtral TTS came, 0.07 since Fish Speech S2 Pro: its 0.5 B weights are 1 GB,
    # the rest of 5.6 GB is KV cache.
    "cosyvoice3_talker": Talker(share=0.05),
    # Stays eager: its forward runs per-row Python every step (tritontts/engine/vllm_frames.py
    # reads which request each row is, builds frame embeddings, runs the code predictor),
    # which a captured CUDA graph would replay without running.
    # 0.2 since VoxCPM2 came, 0.15 since Voxtral TTS, 0.1 since Fish Speech S2 Pro (1.7 B:
    # 3.4 GB of bf16 weights, the rest of 8 GB KV cache).
    "qwen3_tts_talker": Talker(share=0.08, cuda_graphs=False),
    # The same per-row Python (it samples the 8 codebooks inside compute_logits). DualFFN
    # makes the "3B" 5.8 B parameters: 11.5 GB of bf16 weights, the rest of its share KV
    # cache (28 layers x 8 KV heads x 128: 112 KiB per token in bf16). 0.17 since Fish
    # Speech S2 Pro: 2.1 GB of KV cache, 19 000 tokens.
    "higgs_audio_v2_talker": Talker(share=0.17, cuda_graphs=False),
    # A stock Llama with the RAS logits processor, like CosyVoice3's: CUDA graphs capture
    # the forward. 1.9 B parameters: 3.8 GB of bf16 weights, the rest KV cache (28 layers x
    # 4 KV heads x 128: 56 KiB per token in bf16). CosyVoice3's 0.5 B talker gave up 0.1
    # for it (its weights are 1 GB). 0.08 since Gepard (2.6 GB of KV cache, 47 000 tokens).
    "glm_tts_talker": Talker(share=0.07),
    # Eager like Qwen3-TTS's: per-row Python every step (tritontts/families/voxcpm2/vllm_model.py
    # runs the local DiT and encoder inside the forward). About 2 B parameters (both LMs,
    # LocEnc, LocDiT): 4.6 GB of bf16 weights, the rest KV cache (28 + 8 layers x 2 KV
    # heads x 128: 36 KiB per token in bf16). Qwen3-TTS's talker gave up 0.1 for it.
    # 0.08 since Gepard (1.8 GB of KV cache, 50 000 tokens).
    "voxcpm2_talker": Talker(share=0.07, cuda_graphs=False),
    # Eager (the acoustic transformer runs per row in compute_logits). The 3.4 B backbone and
    # its acoustic transformer: about 8 GB of bf16 weights, so 0.12 (9.6 GB of 80, since Fish
    # Speech S2 Pro; 0.15 before) leaves 1.6 GB of KV cache (26 layers x 8 KV heads x 128:
    # 104 KiB per token, 16 000 tokens).
    "voxtral_tts_talker": Talker(share=0.11, cuda_graphs=False),
    # Eager (the main-token draw and the fast AR run per row in compute_logits). 4.6 B
    # parameters (the 36-layer slow AR with its 155776-row table, the 4-layer fast AR, the
    # codebook tables): 9.1 GB of bf16 weights, so 0.14 (11.2 GB) leaves 2 GB of KV cache
    # (36 layers x 8 KV heads x 128: 144 KiB per token, 14 000 tokens).
    "fish_s2_pro_talker": Talker(share=0.13, cuda_graphs=False),
    # Eager (the 32 heads and the stop head draw per row in compute_logits). About 0.5 B
    # parameters in use (lm_head is not built): 1 GB of bf16 weights; 0.04 (3.2 GB, from
    # GLM-TTS and VoxCPM2) leaves 2 GB for the hybrid cache: 3 full-attention layers x 2 KV
    # heads x 256 (6 KiB per token) and each sequence's Gated-DeltaNet states (11 layers x
    # 16 heads x 128 x 128, about 6 MB).
    "gepard_talker": Talker(share=0.03, cuda_graphs=False),
    # AuK's condition encoder: the Qwen2.5-Omni-3B thinker's language model, prefill only
    # (one forced token), eager (its forward fuses every layer's output and reads per-row
    # state). 3.1 B parameters: 6.2 GB of bf16 weights; 0.09 (7.2 GB) leaves 1 GB of KV
    # (36 layers x 2 KV heads x 128: 36 KiB per token, 28 000 tokens), which only live
    # prompts hold. Its share came from CosyVoice3 (0.07 -> 0.05: 3 GB of KV left), Qwen3-TTS
    # (0.1 -> 0.08: 3 GB), GLM-TTS, VoxCPM2, Voxtral, Fish Speech S2 Pro and Gepard (0.01
    # each: 1.8, 1, 0.8, 1.3 and 1.4 GB of KV left).
    "auk_encoder": Talker(share=0.09, cuda_graphs=False),
}


def stage_names(source: Path = STAGE_REPOSITORY) -> list[str]:
    return sorted(p.name for p in source.iterdir() if (p / "config.pbtxt").is_file())


def write_profile_repository(profile: str, stages: list[str] | None, out: Path,
                             source: Path = STAGE_REPOSITORY,
                             gpus: list[int] | None = None) -> Path:
    """Copy the stage folders `stages` (default: all) from `source` into `out`, rewritten
    for `profile`; returns `out`. `gpus`: the GPU ids each GPU stage's instances go on."""
    if profile not in PROFILES:
        raise ProfileError(f"unknown profile {profile!r}; profiles: {', '.join(PROFILES)}")
    known = stage_names(source)
    stages = known if stages is None else list(stages)
    unknown = [s for s in stages if s not in known]
    if unknown:
        raise ProfileError(f"no stage {unknown} in {source}; stages: {', '.join(known)}")
    gpus = [0] if gpus is None else list(gpus)
    if profile == "gpu":
        check_talker_shares([s for s in stages if talker_settings_path(source / s) is not None])
        if not gpus or any(g < 0 for g in gpus):
            raise ProfileError(f"--gpus {gpus}: give one or more GPU ids (0, 1, ...)")
    out.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        target = out / stage
        shutil.copytree(source / stage, target, dirs_exist_ok=True)
        if profile == "gpu":
            gpu_stage(target, source / stage, gpus)
    return out


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


def talker_settings_path(stage_dir: Path) -> Path | None:
    """The stage's vLLM settings (1/model.json with engine_args), if it is a talker."""
    path = stage_dir / "1" / "model.json"
    if path.is_file() and "engine_args" in json.loads(path.read_text()):
        return path
    return None


def check_talker_shares(talkers: list[str]) -> None:
    """ProfileError unless the talker stages `talkers` (one entry per engine: a family
    served with two checkpoints is listed twice) fit the budget together."""
    missing = [t for t in talkers if t not in TALKERS]
    if missing:
        raise ProfileError(f"talker(s) {missing} have no GPU memory share: add them to "
                           "TALKERS in tritontts/deploy/profiles.py")
    total = sum(TALKERS[t].share for t in talkers)
    if total > TALKER_BUDGET + 1e-9:
        raise ProfileError(f"talkers {talkers} would take {total:.2f} of the card, over the "
                           f"budget of {TALKER_BUDGET}: serve fewer of them on one card, or "
                           "lower their shares in TALKERS (tritontts/deploy/profiles.py)")


def gpu_stage(target: Path, origin: Path, gpus: list[int]) -> None:
    path = target / "config.pbtxt"
    original = path.read_text()
    config = read_config(path)
    name = config.name
    settings = talker_settings_path(target)
    notes = []
    if name in CPU_STAGES:
        notes.append(f"Kept on the CPU: {CPU_STAGES[name]}.")
    else:
        sizing = GPU_STAGES.get(name)
        # A talker's engine is built on the process's current CUDA device whatever its
        # instance's GPU (tritontts/engine/vllm_talker.py), so a second instance would land on
        # the first card and take a second share of it: talkers stay on the first GPU.
        # A one-instance stage (ONE_INSTANCE) likewise.
        placed = gpus[:1] if settings is not None or name in ONE_INSTANCE else gpus
        for group in config.instance_group:
            group.kind = mc.ModelInstanceGroup.Kind.KIND_GPU
            del group.gpus[:]
            group.gpus.extend(placed)
            if sizing is not None:
                group.count = sizing.count
        if sizing is not None:
            config.max_batch_size = sizing.max_batch_size
        for key, value in GPU_PARAMETERS.get(name, {}).items():
            # A map: assigning replaces a parameter of that key rather than repeating it.
            config.parameters[key].string_value = value
        notes.append("On the GPU: instance_group, max_batch_size and parameters from the "
                     "gpu profile's tables.")
    if settings is not None:
        gpu_talker(name, settings)
        notes.append("Engine arguments in 1/model.json rewritten for CUDA vLLM (TALKERS).")
    header = leading_comments(original) + [
        "# gpu profile (python -m tritontts.deploy.profiles), written from",
        f"# {origin.parent.name}/{origin.name}/config.pbtxt, whose comments explain each field."]
    header += [f"# {line}" for note in notes for line in textwrap.wrap(note, 88)]
    path.write_text("\n".join(header) + "\n" + config_text(config))


def gpu_talker(stage: str, settings_path: Path) -> None:
    talker = TALKERS[stage]
    settings = json.loads(settings_path.read_text())
    args = settings["engine_args"]
    # A byte budget for the KV cache is the CPU backend's; on CUDA the share decides it.
    args.pop("kv_cache_memory_bytes", None)
    args["gpu_memory_utilization"] = talker.share
    args["dtype"] = talker.dtype
    args["enforce_eager"] = not talker.cuda_graphs
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
    args = parser.parse_args(argv)
    stages = None if args.stages is None else [s.strip() for s in args.stages.split(",") if s.strip()]
    try:
        write_profile_repository(args.profile, stages, args.out, gpus=args.gpus)
    except ProfileError as exc:
        print(exc, file=sys.stderr)
        return 2
    copy_ensembles(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
