"""Per-request parameters of the Piper family: the one place that validates them.

Used by the text stage (for every client, tritonclient and perf_analyzer included) and by
the front (to answer 400 before a request reaches Triton).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...protocol import RequestFields, number_param, seed_param

FIELDS = RequestFields(
    takes={
        "speed": "0.25-4: speaking rate (every phoneme of the speed-1 alignment lasts 1/speed as long)",
        "noise_scale": "0-2: phoneme noise (default: the voice's own)",
        "noise_w_scale": "0-2: duration noise (default: the voice's own)",
        "seed": "the noise of the chunk's synthesis (reproducible under any load)",
    },
)


@dataclass(frozen=True)
class PiperParams:
    speed: float = 1.0
    noise_scale: float | None = None     # None: the voice's own default
    noise_w_scale: float | None = None
    seed: int | None = None


def parse_piper_params(params: dict[str, Any]) -> PiperParams:
    FIELDS.check(params, "piper")
    return PiperParams(
        speed=number_param(params, "speed", 1.0, 0.25, 4.0),
        noise_scale=number_param(params, "noise_scale", None, 0.0, 2.0),
        noise_w_scale=number_param(params, "noise_w_scale", None, 0.0, 2.0),
        seed=seed_param(params),
    )


def scales_for(params: PiperParams, voice_config) -> tuple[float, float, float]:
    """(noise_scale, length_scale, noise_w_scale) as the VITS graph's `scales` input wants:
    the voice's length scale; speed rescales the alignment after it (vits.make_speed_exact)."""
    noise = voice_config.noise_scale if params.noise_scale is None else params.noise_scale
    noise_w = voice_config.noise_w_scale if params.noise_w_scale is None else params.noise_w_scale
    return noise, voice_config.length_scale / params.speed, noise_w
