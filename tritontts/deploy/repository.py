"""Ensembles generated from the stage configs, and the wiring checked.

    python -m tritontts.deploy.repository            # write ensembles/<family>/config.pbtxt for all
    python -m tritontts.deploy.repository --check    # fail if a committed ensemble differs

A family's ensemble is its stages in order (Family.stages). Each step input is wired to the
latest earlier step output of the same name, or to an ensemble input (text, voice, params);
the ensemble outputs (audio, sample_rate, chunk_index, is_final) come from the last step
that produces them. Triton's rule for decoupled steps is enforced here, before a server
ever sees the file: a step after a decoupled step may read only what came through that
step, so a decoupled stage must forward (as an output of the same name) whatever later
stages need from before it.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..family import Family
from ..protocol import ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS, STREAM_ID, WORDS, WORDS_REQUEST

REPO_ROOT = Path(__file__).resolve().parents[2]
STAGE_REPOSITORY = REPO_ROOT / "model_repository"
ENSEMBLE_REPOSITORY = REPO_ROOT / "ensembles"

# The stage convention's tensor types (tritontts/serving/stage.py documents their meaning).
CONVENTION_TYPES = {"text": "TYPE_STRING", "voice": "TYPE_STRING", "params": "TYPE_STRING",
                    "audio": "TYPE_FP32", "sample_rate": "TYPE_INT32",
                    "chunk_index": "TYPE_INT32", "is_final": "TYPE_BOOL",
                    "stream_id": "TYPE_INT64", "voice_features": "TYPE_STRING",
                    "words_request": "TYPE_STRING", "words": "TYPE_STRING"}
WORD_ALIGNER = "word_aligner"


class WiringError(ValueError):
    """The stages cannot form a valid ensemble; the message says which tensor and why."""


def model_folder(name: str, repositories: tuple[Path, ...]) -> Path | None:
    """The folder of model `name` in the first of `repositories` that has it (None: none)."""
    return next((repo / name for repo in repositories if (repo / name / "config.pbtxt").is_file()), None)


def read_config(path: Path) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(path.read_text(), config)
    return config


def dtype(tensor) -> str:
    return mc.DataType.Name(tensor.data_type)


def decoupled(config: mc.ModelConfig) -> bool:
    return config.model_transaction_policy.decoupled


@dataclass(frozen=True)
class Source:
    step: int | None        # None: an ensemble input
    name: str               # the producing tensor's name
    type: str


def wire(stages: list[mc.ModelConfig], ensemble_outputs: tuple[str, ...] = ENSEMBLE_OUTPUTS
         ) -> tuple[list[dict[str, Source]], dict[str, Source]]:
    """For each step, its inputs' sources; and the ensemble outputs' sources."""
    def source(name: str, before: int, what: str) -> Source:
        # The latest decoupled step before `before` is the barrier nothing may be read across.
        barrier = max((k for k in range(before) if decoupled(stages[k])), default=None)
        for k in range(before - 1, -1, -1):
            out = next((o for o in stages[k].output if o.name == name), None)
            if out is None:
                continue
            if barrier is not None and k < barrier:
                raise WiringError(
                    f"{what} reads {name!r} from {stages[k].name}, across decoupled "
                    f"{stages[barrier].name}: add {name!r} to {stages[barrier].name}'s inputs and "
                    "outputs so it is forwarded")
            return Source(k, name, dtype(out))
        if name in ENSEMBLE_INPUTS:
            if barrier is not None:
                raise WiringError(f"{what} reads ensemble input {name!r} across decoupled "
                                  f"{stages[barrier].name}: forward it through that stage")
            return Source(None, name, CONVENTION_TYPES[name])
        raise WiringError(f"{what} needs {name!r}, which no earlier stage produces")

    inputs = []
    for i, config in enumerate(stages):
        wired = {}
        for tensor in config.input:
            src = source(tensor.name, i, f"{config.name} input")
            if src.type != dtype(tensor):
                raise WiringError(f"{config.name} input {tensor.name!r} is {dtype(tensor)} but "
                                  f"its source is {src.type}")
            wired[tensor.name] = src
        inputs.append(wired)
    outputs = {name: source(name, len(stages), "ensemble output") for name in ensemble_outputs}
    return inputs, outputs


def check_convention(family: Family, stages: list[mc.ModelConfig]) -> None:
    first = stages[0]
    if [t.name for t in first.input] != list(ENSEMBLE_INPUTS):
        raise WiringError(f"{first.name}: the first stage takes exactly {list(ENSEMBLE_INPUTS)}")
    for config in stages:
        if config.backend != "tritontts":
            raise WiringError(f'{config.name}: stages run on backend "tritontts"')
        if config.max_batch_size < 1:
            raise WiringError(f"{config.name}: every stage has a batch dimension")
        for tensor in [*config.input, *config.output]:
            want = CONVENTION_TYPES.get(tensor.name)
            if want and dtype(tensor) != want:
                raise WiringError(f"{config.name}: {tensor.name!r} is {want} by convention, "
                                  f"not {dtype(tensor)}")
    if "stream_id" not in [t.name for t in first.output]:
        raise WiringError(f"{first.name}: the first stage sets stream_id for later stages")
    if family.voice_encoder is not None:
        encoder = next((c for c in stages if c.name.endswith(family.voice_encoder[len(family.name):])), None)
        if encoder is None or "voice_features" not in [t.name for t in encoder.output]:
            raise WiringError(f"{family.name}: voice_encoder {family.voice_encoder} must be one of its "
                              "stages with a voice_features output")
    if not any(decoupled(c) for c in stages):
        raise WiringError(f"{family.name}: no decoupled stage, so the ensemble cannot stream")


def tensor_name(stages: list[mc.ModelConfig], src: Source, model: str) -> str:
    if src.step is None:
        return src.name
    return f"{stages[src.step].name.removeprefix(model + '_')}.{src.name}"


def served_model_stage(model: str, family: Family, stage: str) -> str:
    """A stage's model name for a served model: the family's own, or renamed for another
    checkpoint (qwen3_tts_talker -> qwen3_tts-base_talker)."""
    return model + stage[len(family.name):]


def committed_stage(name: str) -> str:
    """The committed stage (model_repository/<stage>) a served stage name is a copy of: itself,
    or for another checkpoint's renamed stage (qwen3_tts-base_talker) the family's own
    (qwen3_tts_talker)."""
    from ..families import FAMILIES, family_of

    for family in FAMILIES.values():
        for stage in family.stages:
            model = name[:-len(stage) + len(family.name)] if name.endswith(stage[len(family.name):]) else ""
            if model != family.name and family_of(model) is family:
                return stage
    return name


def write_served_model(model: str, family: Family, checkpoint: Path, out: Path,
                   source: Path = STAGE_REPOSITORY) -> None:
    """Into repository `out`: the family's stages (from `source`, e.g. a deployment
    profile's rewritten copies) renamed for `model` with the checkpoint as their
    `checkpoint` parameter (each stage reads it before the family's default), and the
    ensemble `model` over them."""
    import shutil

    for stage in family.stages:
        target = out / served_model_stage(model, family, stage)
        shutil.copytree(source / stage, target, dirs_exist_ok=True)
        text = (target / "config.pbtxt").read_text()
        old = f'name: "{stage}"'
        if old not in text:
            raise WiringError(f"{source / stage / 'config.pbtxt'} has no {old}")
        text = text.replace(old, f'name: "{served_model_stage(model, family, stage)}"', 1)
        text += (f'\nparameters {{ key: "checkpoint" value: {{ string_value: '
                 f'"{checkpoint}" }} }}\n')
        (target / "config.pbtxt").write_text(text)
    (out / model / "1").mkdir(parents=True, exist_ok=True)
    (out / model / "config.pbtxt").write_text(ensemble_config(family, out, model))


def ensemble_config(family: Family, repository: Path = STAGE_REPOSITORY,
                    model: str | None = None, aligned: bool = False) -> str:
    """The ensemble config.pbtxt text for a family (or for `model`, another checkpoint of it
    whose renamed stages write_served_model put in `repository`), from its stage configs;
    `aligned`: ending with the word_aligner stage (write_word_aligned_repository)."""
    model = model or family.name
    names = [served_model_stage(model, family, stage) for stage in family.stages]
    names += [WORD_ALIGNER] if aligned else []
    stages = [read_config(repository / name / "config.pbtxt") for name in names]
    for name, config in zip(names, stages):
        if config.name != name:
            raise WiringError(f"{repository / name / 'config.pbtxt'} names model {config.name!r}")
    check_convention(family, stages)
    ensemble_outputs = ENSEMBLE_OUTPUTS + ((WORDS,) if aligned else ())
    inputs, outputs = wire(stages, ensemble_outputs)
    # An ensemble output takes its own name at its (last) producer; other consumed tensors
    # are named <stage>.<tensor> after the producing stage.
    final_name = {(src.step, src.name): name for name, src in outputs.items()}
    used: dict[int, dict[str, str]] = {}
    for wired in inputs:
        for src in wired.values():
            if src.step is not None:
                used.setdefault(src.step, {})[src.name] = final_name.get(
                    (src.step, src.name), tensor_name(stages, src, model))
    for name, src in outputs.items():
        used.setdefault(src.step, {})[src.name] = name

    def io(name: str) -> str:
        return f'  {{ name: "{name}" data_type: {CONVENTION_TYPES[name]} dims: [ {"-1" if name == "audio" else "1"} ] }}'

    arrows = " -> ".join(f"{c.name}{' (decoupled)' if decoupled(c) else ''}" for c in stages)
    lines = [
        "# Generated by `python -m tritontts.deploy.repository` from the stage configs: do not edit.",
        f"# {family.description}",
        f"# {arrows}",
        f'name: "{model}"',
        'platform: "ensemble"',
        f"max_batch_size: {min(c.max_batch_size for c in stages)}",
        "",
        "input [", ",\n".join(io(n) for n in ENSEMBLE_INPUTS), "]",
        "output [", ",\n".join(io(n) for n in ensemble_outputs), "]",
        "",
        "ensemble_scheduling {",
        "  step [",
    ]
    steps = []
    for i, config in enumerate(stages):
        step = ["    {", f'      model_name: "{config.name}"', "      model_version: -1"]
        for name, src in inputs[i].items():
            value = (src.name if src.step is None else
                     final_name.get((src.step, src.name), tensor_name(stages, src, model)))
            step.append(f'      input_map {{ key: "{name}" value: "{value}" }}')
        for name, value in used.get(i, {}).items():
            step.append(f'      output_map {{ key: "{name}" value: "{value}" }}')
        step.append("    }")
        steps.append("\n".join(step))
    lines += [",\n".join(steps), "  ]", "}", ""]
    return "\n".join(lines)


def forward_word_requests(config: mc.ModelConfig, first: bool) -> mc.ModelConfig:
    """A stage's config on a word-aligned server: it also passes words_request on (the
    first stage's host makes it), and stream_id, which the word_aligner keys streams by."""
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}

    def add(tensors, name):
        tensors.add(name=name, data_type=mc.DataType.Value(CONVENTION_TYPES[name]), dims=[1])

    for name in (WORDS_REQUEST, STREAM_ID):
        if not first and name not in inputs:
            add(config.input, name)
        if name not in outputs:
            add(config.output, name)
    return config


def write_word_aligned_repository(models: dict[str, Family], sources: tuple[Path, ...], out: Path,
                                  aligner_source: Path = STAGE_REPOSITORY) -> None:
    """Into repository `out`: every stage of the served `models` (model name -> family),
    taken from the first of `sources` that has it and rewritten by forward_word_requests, the
    word_aligner and cancel models, and each model's ensemble ending with the word_aligner.
    It replaces `sources` for tritonserver (the ensembles have the same names)."""
    import shutil

    from ..serving.cancellation import CANCEL_MODEL

    def found(stage: str) -> Path:
        for source in sources:
            if (source / stage / "config.pbtxt").is_file():
                return source / stage
        raise WiringError(f"no stage {stage!r} in {', '.join(map(str, sources))}")

    for model, family in models.items():
        for i, stage in enumerate(family.stages):
            name = served_model_stage(model, family, stage)
            target = out / name
            shutil.copytree(found(name), target, dirs_exist_ok=True)
            config = forward_word_requests(read_config(target / "config.pbtxt"), first=i == 0)
            (target / "config.pbtxt").write_text(
                "# Written by tritontts.deploy.repository.write_word_aligned_repository from the "
                "stage's config:\n# words_request and stream_id pass through for the word_aligner.\n"
                + text_format.MessageToString(config))
    shutil.copytree(aligner_source / WORD_ALIGNER, out / WORD_ALIGNER, dirs_exist_ok=True)
    shutil.copytree(found(CANCEL_MODEL), out / CANCEL_MODEL, dirs_exist_ok=True)
    for model, family in models.items():
        (out / model / "1").mkdir(parents=True, exist_ok=True)
        (out / model / "config.pbtxt").write_text(ensemble_config(family, out, model, aligned=True))


def ensemble_path(family: Family, repository: Path = ENSEMBLE_REPOSITORY) -> Path:
    return repository / family.name / "config.pbtxt"


def write_ensemble(family: Family, repository: Path = ENSEMBLE_REPOSITORY) -> Path:
    path = ensemble_path(family, repository)
    (path.parent / "1").mkdir(parents=True, exist_ok=True)
    (path.parent / "1" / ".gitkeep").touch()   # git keeps no empty version folder
    path.write_text(ensemble_config(family))
    return path


def main(argv: list[str] | None = None) -> int:
    from ..families import FAMILIES

    parser = argparse.ArgumentParser(prog="python -m tritontts.deploy.repository", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed ensembles instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for family in FAMILIES.values():
        if args.check:
            path = ensemble_path(family)
            if not path.is_file() or path.read_text() != ensemble_config(family):
                stale.append(str(path))
        else:
            print(write_ensemble(family))
    if stale:
        print("out of date (run python -m tritontts.deploy.repository): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
