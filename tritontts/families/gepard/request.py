"""Per-request parameters of the Gepard-1.0 family: the one place that validates them (the
prompt stage and the HTTP front both call parse_gepard_params).

  seed              every frame's Gumbel draws (the request's own generator)
  max_new_tokens    1..4096 frames (21.5 a second): the frame budget; without it vLLM-Omni's
                    stage default, 1000 (about 46 s)

Sampling is fixed by the checkpoint (the sidecar's temperature; Gumbel-max has no top-p), as
upstream fixes it. What the released model cannot do is a 400 that says so: cloning
(ref_audio, ref_text: the released checkpoint ships the compressor's config only, and
upstream serves the learned default voice), instructions, task_type, language, speed != 1,
and sampling knobs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...protocol import RequestFields, int_param, seed_param, speed_refusal

UNSUPPORTED = {
    "ref_audio": "Gepard-1.0 speaks in its default voice only (voice cloning is not released); omit ref_audio",
    "ref_text": "Gepard-1.0 does not clone: omit ref_text",
    "instructions": "Gepard-1.0 takes no style instructions; omit instructions",
    "task_type": "Gepard-1.0 has one task (speech in its default voice); omit task_type",
    "language": "Gepard-1.0 reads the language from the text itself; omit language",
    "speed": speed_refusal('Gepard-1.0'),
    "temperature": "Gepard-1.0's sampling is fixed by its checkpoint (gepard_config.json's temperature); "
                   "omit temperature",
    "top_p": "Gepard-1.0 draws every code by Gumbel-max (no nucleus step); omit top_p",
    "top_k": "Gepard-1.0 draws every code by Gumbel-max over its few levels; omit top_k",
}
FIELDS = RequestFields(
    takes={
        "seed": "every frame's Gumbel draws",
        "max_new_tokens": "1..4096 frames (21.5 a second; default 1000)",
    },
    refuses=UNSUPPORTED,
)
MAX_NEW_TOKENS = 4096
DEFAULT_MAX_NEW_TOKENS = 1000


@dataclass(frozen=True)
class GepardParams:
    seed: int | None
    max_new_tokens: int | None


def parse_gepard_params(params: dict[str, Any]) -> GepardParams:
    FIELDS.check(params, "gepard")
    return GepardParams(seed=seed_param(params), max_new_tokens=int_param(params, "max_new_tokens", 1, MAX_NEW_TOKENS))
