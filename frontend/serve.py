"""`tritontts serve MODEL [MODEL ...] [flags]`: vLLM-Omni's command line, served here.

    tritontts serve Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice --omni --port 8091
    tritontts serve openbmb/VoxCPM2 --omni --port 8000 --trust-remote-code
    tritontts serve /models/Qwen3-TTS-Base /models/CosyVoice3 --stage-0-max-num-seqs 2

MODEL is a local checkpoint folder or a Hugging Face repo id (the HF cache first, then a
download; offline, a line that says how to fetch it), served under that very string as
its model id; its family and variant are told from the checkpoint's own files
(tritontts/launch/resolve.py). vLLM-Omni's flags mean what they mean there, or say why they
have no effect here (tritontts/launch/vllm_omni.py; the table in docs/api.md). Every flag of
`python -m frontend` is taken too. The front listens on --port (default 8000, as `vllm
serve`); the tritonserver it starts takes 8100-8102 when the front is on one of 8000-8002.
"""
from __future__ import annotations

import logging
import os
import sys

from tritontts.launch.resolve import Resolved, ResolveError, resolve
from tritontts.launch.vllm_omni import (
    ENV, FLAGS, MAPPED, NO_EFFECT, STAGE_FLAG, OmniError, omni_stages, read_deploy_config, stage_overrides)

logger = logging.getLogger("tritontts.serve")

DEFAULT_PORT = "8000"
TRITON_PORTS = ("8000", "8001", "8002")
MOVED_TRITON_PORTS = {"--http-port": "8100", "--grpc-port": "8101", "--metrics-port": "8102"}
USAGE = "usage: tritontts serve MODEL [MODEL ...] [flags]   (tritontts serve --help)"


def launcher_takes_value(flag: str) -> str | None:
    """How `python -m frontend`'s flag takes a value: "no", "yes" or "optional" (None: it has
    no such flag)."""
    from .__main__ import build_parser

    action = build_parser()._option_string_actions.get(flag)
    if action is None:
        return None
    return {0: "no", "?": "optional"}.get(action.nargs, "yes")


def served_names(resolved: list[Resolved]) -> list[str]:
    """Each MODEL's name in the launcher: its family's for the first of a family, then
    FAMILY-2, FAMILY-3, ... (tritontts.families.family_of reads them back)."""
    names, seen = [], {}
    for r in resolved:
        seen[r.family.name] = seen.get(r.family.name, 0) + 1
        names.append(r.family.name if seen[r.family.name] == 1 else f"{r.family.name}-{seen[r.family.name]}")
    return names


def engine_arg(name: str, resolved: Resolved, index: int, field: str, value: str) -> list[str]:
    """--stage-N-FIELD VALUE of one MODEL: --engine-arg for its stage N (as served)."""
    from tritontts.deploy.profiles import engine_settings_path
    from tritontts.deploy.repository import STAGE_REPOSITORY, served_model_stage

    stages = omni_stages(resolved.family)
    engines = [i for i, s in enumerate(stages) if engine_settings_path(STAGE_REPOSITORY / s)]
    if not 0 <= index < len(stages) or index not in engines:
        listed = ", ".join(f"{i} {s}" for i, s in enumerate(stages))
        raise OmniError(f"--stage-{index}-{field}: {resolved.model} ({resolved.family.name}) has stages {listed}; "
                        f"only {', '.join(str(i) for i in engines) or 'none'} run a vLLM engine")
    stage = served_model_stage(name, resolved.family, stages[index])
    return ["--engine-arg", f"{stage}.{field.replace('-', '_')}={value}"]


def translate(args: list[str], environ: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """`tritontts serve` arguments -> (`python -m frontend` argv, lines to log: what was
    detected, and each vLLM-Omni option accepted without effect)."""
    environ = dict(os.environ if environ is None else environ)
    flags = {o.name: o for o in FLAGS}
    models: list[str] = []
    # (model index, stage, field, value, strict): a flag's field on a stage without an engine
    # is refused; a deploy YAML's (written for vLLM-Omni's stages) is logged as without effect.
    stage_args: list[tuple[int, int, str, str, bool]] = []
    ours: list[str] = []
    said: list[str] = []
    served_name = None
    whole = False            # --no-async-chunk: each MODEL synthesizes whole utterances
    i = 0
    while i < len(args):
        token = args[i]
        flag, eq, inline = token.partition("=")

        def value() -> str:
            nonlocal i
            if eq:
                return inline
            if i + 1 >= len(args):
                raise OmniError(f"{flag} needs a value")
            i += 1
            return args[i]

        if not token.startswith("-"):
            models.append(token)
        elif (match := STAGE_FLAG.match(flag)) is not None:
            if not models:
                raise OmniError(f"{flag}: name the MODEL first (it applies to the MODEL before it)")
            stage_args.append((len(models) - 1, int(match.group(1)), match.group(2), value(), True))
        elif flag == "--stage-overrides":
            for stage, fields in stage_overrides(value()).items():
                stage_args += [(0, stage, key, json_value(v), True) for key, v in fields.items()]
        elif flag == "--deploy-config":
            deploy = read_deploy_config(value())
            stage_args += [(0, stage, key, json_value(v), False) for stage, key, v in deploy.stage_fields]
            ours += ["--dtype", deploy.dtype] if deploy.dtype else []
            said += deploy.said
            whole = whole or deploy.whole_utterance
        elif flag == "--no-async-chunk":
            whole = True
        elif flag == "--served-model-name":
            served_name = value()
        elif flag == "--api-server-count":
            count = value()
            if count != "1":
                raise OmniError(f"--api-server-count {count}: {flags[flag].here}")
        elif flag in flags:
            option = flags[flag]
            given = value() if option.metavar else None
            if option.kind == MAPPED:
                ours += option.ours(given)
            elif option.kind == NO_EFFECT:
                said.append(f"{flag}: accepted; {option.here}")
            else:
                raise OmniError(f"{flag}: {option.here}")
        else:
            takes = launcher_takes_value(flag)
            if takes is None:
                raise OmniError(f"{flag}: neither a vLLM-Omni serve flag this launcher knows nor one of its own "
                                "(python -m frontend --help lists those)")
            ours.append(token)
            optional_given = takes == "optional" and i + 1 < len(args) and not args[i + 1].startswith("-")
            if not eq and (takes == "yes" or optional_given):
                ours.append(value())
        i += 1
    if not models:
        raise OmniError("name at least one MODEL: a checkpoint folder or a Hugging Face repo id")
    for option in ENV:
        given = environ.get(option.name)
        if given is None:
            continue
        if option.name == "NO_ASYNC_CHUNK":
            whole = whole or given not in ("", "0")
        elif option.name == "COSYVOICE3_BATCH_FLOW":
            if given == "0":
                from tritontts.serving.stage import MAX_ROWS_PER_CALL_ENV

                os.environ[MAX_ROWS_PER_CALL_ENV] = "1"
                said.append(f"COSYVOICE3_BATCH_FLOW=0: {option.here}")
        elif option.kind == MAPPED:
            ours += option.ours(given)
        elif given not in ("", "0"):
            raise OmniError(f"{option.name}={given}: {option.here}")

    resolved = [resolve(m) for m in models]
    names = served_names(resolved)
    argv = ["--families", ",".join(dict.fromkeys(r.family.name for r in resolved))]
    for r, name in zip(resolved, names):
        if r.path is not None:
            argv += ["--checkpoint", f"{name}={r.path}"]
        if r.model != name:
            argv += ["--served-model-name", f"{name}={r.model}"]
        said.append(f"{r.model}: {r.family.name}{f' ({r.variant})' if r.variant else ''}"
                    + (f", from {r.path}" if r.path is not None else "") + f", served as model {r.model!r}")
    if served_name is not None:
        argv += ["--served-model-name", f"{names[0]}={served_name}"]
    if whole:
        argv += whole_utterance_settings(resolved, names)
    for model_index, stage, field, given, strict in stage_args:
        try:
            argv += engine_arg(names[model_index], resolved[model_index], stage, field, given)
        except OmniError as exc:
            if strict:
                raise
            said.append(f"--deploy-config stages[{stage}].{field}: accepted; no effect here: {exc}")
    if "--port" not in ours:
        ours += ["--port", DEFAULT_PORT]
    port = ours[ours.index("--port") + 1]
    if port in TRITON_PORTS:
        for flag, moved in MOVED_TRITON_PORTS.items():
            if flag not in ours:
                ours += [flag, moved]
    return argv + ours, said


def whole_utterance_settings(resolved: list[Resolved], names: list[str]) -> list[str]:
    """--no-async-chunk: each MODEL's whole-utterance settings (Family.whole_utterance) on its
    own served stages; OmniError for a MODEL whose family has no such mode."""
    import json

    from tritontts.deploy.repository import served_model_stage
    from tritontts.families import FAMILIES

    argv = []
    for r, name in zip(resolved, names):
        if not r.family.whole_utterance:
            having = ", ".join(f.name for f in FAMILIES.values() if f.whole_utterance) or "none"
            raise OmniError(f"--no-async-chunk: {r.model} ({r.family.name}) has no whole-utterance mode here (its "
                            f"audio streams in chunks); families that have one: {having}")
        for stage, settings in r.family.whole_utterance.items():
            for key, value in settings.items():
                argv += ["--stage-setting", f"{served_model_stage(name, r.family, stage)}.{key}={json.dumps(value)}"]
    return argv


def json_value(value) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def serve(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        argv, said = translate(args)
    except (ResolveError, OmniError) as exc:
        print(f"tritontts serve: {exc}", file=sys.stderr)
        return 2
    for line in said:
        logger.info("%s", line)
    from .__main__ import main

    return main(argv)


def cli(argv: list[str] | None = None) -> int:
    """The `tritontts` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] != "serve":
        print(f"tritontts: unknown command {args[0]!r}; {USAGE}", file=sys.stderr)
        return 2
    return serve(args[1:])


if __name__ == "__main__":
    sys.exit(cli())
