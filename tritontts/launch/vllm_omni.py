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
    OmniOption("--deploy-config", "PATH", REFUSED, "not read yet: give its stage fields as --stage-N-FIELD"),
    OmniOption("--no-async-chunk", None, REFUSED, "not mapped yet: every family streams in chunks; "
               "non_streaming_mode is a request field of the families that take it"),
    OmniOption("--api-server-count", "N", REFUSED, "N > 1 not served yet: start more fronts on other ports "
               "with --triton-url (they share voices through --voices-dir); 1 is accepted"),
)

ENV: tuple[OmniOption, ...] = (
    OmniOption("GPUS", "IDS", MAPPED, "the GPU ids of the gpu profile (--gpus)", lambda v: ["--gpus", v]),
    OmniOption("NO_ASYNC_CHUNK", "1", REFUSED, "as --no-async-chunk"),
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


def stage_overrides(value: str) -> dict[int, dict[str, object]]:
    """--stage-overrides JSON: {"N": {"FIELD": VALUE}} (N a stage index)."""
    try:
        given = json.loads(value)
        if not isinstance(given, dict):
            raise ValueError("not a JSON object")
        return {int(n): dict(fields) for n, fields in given.items()}
    except (ValueError, TypeError) as exc:
        raise OmniError(f'--stage-overrides {value!r}: give a JSON object {{"N": {{"FIELD": VALUE}}}} ({exc})') from None


if __name__ == "__main__":
    sys.exit(main())
