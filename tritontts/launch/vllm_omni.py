"""vLLM-Omni's serve flags and environment variables, each declared once with what it does
here: mapped to this launcher's flag, or accepted with a line that says why it has no effect
here, or refused with what to use instead. `tritontts serve` translates with it; the
migration table in docs/api.md is generated from it (python -m tritontts.launch.vllm_omni,
--check in the tests), so the two cannot drift apart."""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MAPPED, NO_EFFECT, REFUSED = "mapped", "accepted, no effect", "refused"


@dataclass(frozen=True)
class OmniOption:
    name: str                     # the flag (--x) or the environment variable (X=)
    metavar: str | None           # its value's name; None: a switch
    kind: str                     # MAPPED, NO_EFFECT or REFUSED
    here: str                     # what it does here (docs, and the line logged for NO_EFFECT)
    ours: Callable[[str], list[str]] | None = None   # MAPPED: our launcher's argv for the value


FLAGS: tuple[OmniOption, ...] = (
    OmniOption("--omni", None, NO_EFFECT, "every model is served as its whole pipeline of stages "
               "(one Triton ensemble per model); there is no other mode to choose"),
    OmniOption("--trust-remote-code", None, NO_EFFECT, "nothing of a checkpoint is executed: its files are "
               "read as data by this project's own code"),
    OmniOption("--host", "HOST", MAPPED, "the front's address", lambda v: ["--host", v]),
    OmniOption("--port", "PORT", MAPPED, "the front's port; the tritonserver the launcher starts moves its "
               "ports to 8100-8102 when PORT is one of 8000-8002", lambda v: ["--port", v]),
    OmniOption("--served-model-name", "NAME", MAPPED, "one more name the first MODEL answers to",
               None),
    OmniOption("--stage-init-timeout", "SECONDS", MAPPED, "fail a start not ready after SECONDS "
               "(--startup-timeout)", lambda v: ["--startup-timeout", v]),
    OmniOption("--dtype", "DTYPE", MAPPED, "every vLLM stage's dtype (--dtype)", lambda v: ["--dtype", v]),
    OmniOption("--stage-N-FIELD", "VALUE", MAPPED, "an engine argument of stage N of the last MODEL named "
               "before it: --engine-arg STAGE.FIELD=VALUE. N counts as vLLM-Omni's stage_id does, from its "
               "talker (stage 0): our prompt stage, which vLLM-Omni runs inside its first, is not counted. A "
               "stage without an engine refuses it, naming the stages that have one", None),
    OmniOption("--stage-overrides", "JSON", MAPPED, '{"N": {"FIELD": VALUE}}: the same as --stage-N-FIELD '
               "for each, on the first MODEL", None),
    OmniOption("--gpu-memory-utilization", "FRACTION", NO_EFFECT, "on the CPU each vLLM stage's KV cache is "
               "sized from its checkpoint for --kv-requests full-length requests; the gpu profile gives the "
               "engines their shares of --gpu-memory-gib"),
    OmniOption("--deploy-config", "PATH", MAPPED, "vLLM-Omni's deploy YAML, for the first MODEL: dtype, and each "
               "stage's engine fields (max_num_seqs, max_model_len, "
               "max_num_batched_tokens, enable_prefix_caching, enforce_eager) as --stage-N-FIELD; every other key "
               "is logged with why it has no effect here, an unknown one named in a warning", None),
    OmniOption("--no-async-chunk", None, MAPPED, "each MODEL whose family has a whole-utterance mode "
               "(Family.whole_utterance: GLM-TTS) synthesizes each utterance whole (--stage-setting); for a "
               "family without one it is refused, naming the families that have it", None),
    OmniOption("--api-server-count", "N", REFUSED, "N > 1 not served yet: start more fronts on other ports "
               "with --triton-url (they share voices through --voices-dir); 1 is accepted"),
)

ENV: tuple[OmniOption, ...] = (
    OmniOption("GPUS", "IDS", MAPPED, "the GPU ids of the gpu profile (--gpus)", lambda v: ["--gpus", v]),
    OmniOption("NO_ASYNC_CHUNK", "1", MAPPED, "as --no-async-chunk", None),
    OmniOption("COSYVOICE3_BATCH_FLOW", "0", MAPPED, "0: every batched stage computes its rows one by one "
               "(TRITONTTS_MAX_ROWS_PER_CALL=1): a request's numbers never depend on what is batched beside it",
               None),
)

STAGE_FLAG = re.compile(r"^--stage-(\d+)-([a-z0-9-]+)$")


def omni_stages(family) -> list[str]:
    """The family's stages as vLLM-Omni numbers them (stage_id 0, 1, ...): ours without the
    prompt stage (text and reference preparation, which vLLM-Omni does in its first stage's
    input processing)."""
    return [stage for stage in family.stages if not stage.endswith("_prompt")]


class OmniError(Exception):
    """A vLLM-Omni flag this launch cannot honour: the message says what to use instead."""


def migration_table() -> str:
    rows = ["| vLLM-Omni | here | what it does here |", "|---|---|---|"]
    for option in (*FLAGS, *ENV):
        name = option.name + (f" {option.metavar}" if option.metavar and option.name.startswith("--")
                              else f"={option.metavar}" if option.metavar else "")
        rows.append(f"| `{name}` | {option.kind} | {option.here} |")
    return "\n".join(rows) + "\n"


BEGIN = "<!-- vLLM-Omni migration table: generated by python -m tritontts.launch.vllm_omni -->"
END = "<!-- end of vLLM-Omni migration table -->"
API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def with_table(page: str) -> str:
    start, stop = page.find(BEGIN), page.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"docs/api.md has no {BEGIN!r} ... {END!r} block")
    return page[:start] + BEGIN + "\n" + migration_table() + page[stop:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritontts.launch.vllm_omni", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if docs/api.md's table is stale")
    args = parser.parse_args(argv)
    text = API_DOC.read_text()
    new = with_table(text)
    if new != text:
        if args.check:
            print("docs/api.md: the vLLM-Omni migration table is stale: run python -m tritontts.launch.vllm_omni",
                  file=sys.stderr)
            return 1
        API_DOC.write_text(new)
    return 0


# vLLM-Omni deploy YAML keys (vllm_omni/deploy/*.yaml) and what they do here.
DEPLOY_STAGE_ENGINE_KEYS = ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "enable_prefix_caching",
                            "enforce_eager")
DEPLOY_NO_EFFECT = {
    "pipeline": "the family is told from the checkpoint's own files",
    "trust_remote_code": "nothing of a checkpoint is executed",
    "async_chunk": None,     # false: as --no-async-chunk
    "connectors": "the stages pass chunks through Triton's decoupled ensemble, not a connector; each family's "
                  "chunk sizes are its talker stage's 1/model.json (--stage-setting STAGE.chunks=...)",
    "stage_id": None, "engine_args": None,
    "gpu_memory_utilization": "on the CPU the KV cache is sized for --kv-requests; the gpu profile shares "
                              "--gpu-memory-gib",
    "devices": "stages are placed by the profile (--profile gpu --gpus IDS)",
    "async_scheduling": "each talker steps its engine in its stage's process",
    "hf_overrides": "each family's talker is registered by this project's own code",
    "output_connectors": "see connectors", "input_connectors": "see connectors",
    "disable_hybrid_kv_cache_manager": "vLLM's KV manager as each talker's engine sets it",
    "mm_processor_cache_gb": "no multimodal processor runs", "skip_mm_profiling": "no multimodal processor runs",
    "default_sampling_params": "each family's sampling defaults are its checkpoint's generation config; a "
                               "request's own fields (temperature, top_k, top_p, max_new_tokens) override them",
    "custom_voice_dir": "not read yet: give stored voices with --preload-voices DIR (the --voices-dir layout)",
}


@dataclass
class DeployConfig:
    """What a deploy YAML sets here: --dtype, engine fields by vLLM-Omni stage id, and the
    lines to log (keys without effect, with why; unknown keys named)."""
    dtype: str | None
    stage_fields: list[tuple[int, str, object]]
    said: list[str]
    whole_utterance: bool = False        # async_chunk: false, as --no-async-chunk


def read_deploy_config(path: str) -> DeployConfig:
    try:
        import yaml

        data = yaml.safe_load(Path(path).expanduser().read_text())
    except OSError as exc:
        raise OmniError(f"--deploy-config {path}: not readable ({exc.strerror or exc})") from None
    except Exception as exc:  # noqa: BLE001 - a YAML error, in one line
        raise OmniError(f"--deploy-config {path}: not YAML ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(data, dict):
        raise OmniError(f"--deploy-config {path}: a deploy config is a YAML mapping (dtype, stages, ...)")
    config = DeployConfig(None, [], [])

    def note(key: str, where: str = "") -> None:
        if key in DEPLOY_NO_EFFECT:
            if DEPLOY_NO_EFFECT[key]:
                config.said.append(f"--deploy-config {where}{key}: accepted; {DEPLOY_NO_EFFECT[key]}")
        else:
            config.said.append(f"warning: --deploy-config {path}: unknown key {where}{key}: ignored")

    for key, value in data.items():
        if key == "dtype":
            config.dtype = str(value)
        elif key == "async_chunk":
            config.whole_utterance = value is False
        elif key == "stages":
            if not isinstance(value, list):
                raise OmniError(f"--deploy-config {path}: stages is a list of stage mappings")
            for at, stage in enumerate(value):
                if not isinstance(stage, dict):
                    raise OmniError(f"--deploy-config {path}: stages[{at}] is not a mapping")
                stage_id = int(stage.get("stage_id", at))
                for field_name, field_value in stage.items():
                    if field_name in DEPLOY_STAGE_ENGINE_KEYS:
                        config.stage_fields.append((stage_id, field_name, field_value))
                    else:
                        note(field_name, f"stages[{stage_id}].")
        else:
            note(key)
    return config


def stage_overrides(value: str) -> dict[int, dict[str, object]]:
    """--stage-overrides JSON: {"N": {"FIELD": VALUE}} (N a stage index)."""
    try:
        given = json.loads(value)
        if not isinstance(given, dict):
            raise ValueError("not a JSON object")
        return {int(n): dict(fields) for n, fields in given.items()}
    except (ValueError, TypeError) as exc:
        raise OmniError(f'--stage-overrides {value!r}: give a JSON object {{"N": {{"FIELD": VALUE}}}} '
                        f'({exc})') from None


if __name__ == "__main__":
    sys.exit(main())
