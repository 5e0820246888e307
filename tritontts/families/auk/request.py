"""Per-request parameters of the AuK family: the one place that validates them (the prompt
stage and the HTTP front both call parse_auk_params).

AuK is instruction-driven audio generation: one instruction (plus an optional clip) in,
audio of a given length out. Its fields:

  input               the whole instruction, as vLLM-Omni reads it (input_mode "instruction",
                      the default), or text to speak (input_mode "speech": AuK's speech
                      template, see tritontts.families.auk.prompt)
  instructions        the instruction, whole (speech, voice design, sound, an edit of the
                      clip); `input` may then be empty. With `input` as speech, it describes
                      the voice that speaks `input`
  input_mode          "instruction" (default) or "speech"
  ref_audio           a clip: the voice to speak `input` in, or the source of an edit
  duration_seconds    the output's length, up to 30 s; without it: the clip's length for an
                      instruction on a clip, an estimate from `input`'s length for speech
  seed                the initial noise (and the clip's posterior draw with vae_sample)
  extra_params:
    num_inference_steps   Euler steps, 1..128 (the checkpoint's default: 32)
    guidance_scale        classifier-free guidance, 0..20 (default 2; 0 runs no uncond branch)
    sway                  sway-sampling coefficient of the time grid, -1..1 (default -1)
    t_grid                explicit times, 0 first and 1 last, strictly increasing (overrides
                          num_inference_steps and sway)
    vae_sample            draw the clip's latents from the VAE posterior, not its mean

AuK-Flash runs its distilled 4-step grid only: the stage answers 400 for the sampling
knobs there (the front does not know which variant a checkpoint is).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...protocol import (
    MAX_INPUT_CHARS, InvalidRequest, RequestFields, audio_param, int_param, number_param, seed_param)

MAX_SECONDS = 30.0
MIN_SECONDS = 0.02                  # one latent frame
MAX_STEPS = 128

UNSUPPORTED = {
    "ref_text": "AuK reads no transcript of the clip; the instruction says what to do with it",
    "task_type": "AuK's task is the instruction itself; omit task_type",
    "language": "AuK reads the language from the instruction; omit language",
    "speed": "AuK's pace follows the instruction and duration_seconds; omit speed",
    "max_new_tokens": "AuK is not autoregressive: its output length is duration_seconds",
    "temperature": "AuK samples by integrating a flow from seeded noise; use seed, not temperature",
    "top_p": "AuK has no token sampling; omit top_p",
    "top_k": "AuK has no token sampling; omit top_k",
}
INSTRUCTION, SPEECH = "instruction", "speech"
INPUT_MODES = (INSTRUCTION, SPEECH)
SAMPLING = ("num_inference_steps", "guidance_scale", "sway", "t_grid")
FIELDS = RequestFields(
    takes={
        "instructions":
            "the instruction, whole (speech, voice design, sound, an edit of the clip); input may then be empty",
        "input_mode": "how input is read: \"instruction\" (default, vLLM-Omni's: input is the whole "
                      "instruction) or \"speech\" (input is text to speak, in AuK's speech template; "
                      "instructions then describe the voice)",
        "ref_audio": "a clip: the voice to speak input in, or the source of an edit",
        "duration_seconds": "the output's length, up to 30 s",
        "seed": "the initial noise (and the clip's posterior draw with vae_sample)",
        "num_inference_steps": "Euler steps, 1..128 (default 32; AuK-Flash: its 4-step grid only)",
        "guidance_scale": "classifier-free guidance, 0..20 (default 2)",
        "sway": "sway-sampling coefficient of the time grid, -1..1 (default -1)",
        "t_grid": "explicit times, 0 first and 1 last, strictly increasing",
        "vae_sample": "draw the clip's latents from the VAE posterior, not its mean",
    },
    refuses=UNSUPPORTED,
)


@dataclass(frozen=True)
class AuKParams:
    instructions: str | None
    input_mode: str
    ref_audio: bytes | None
    duration_seconds: float | None
    seed: int | None
    num_inference_steps: int | None
    guidance_scale: float | None
    sway: float | None
    t_grid: tuple[float, ...] | None
    vae_sample: bool

    def sampling_asked(self) -> list[str]:
        return [name for name in SAMPLING if getattr(self, name) is not None]


def parse_auk_params(params: dict[str, Any]) -> AuKParams:
    FIELDS.check(params, "auk")
    instructions = params.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequest("instructions must be text")
        if len(instructions) > MAX_INPUT_CHARS:
            raise InvalidRequest(f"instructions are {len(instructions)} characters; the limit is {MAX_INPUT_CHARS}")
        instructions = instructions.strip() or None
    input_mode = params.get("input_mode", INSTRUCTION)
    if input_mode not in INPUT_MODES:
        raise InvalidRequest(f"input_mode must be one of {', '.join(INPUT_MODES)}, got {input_mode!r}")
    ref_audio = audio_param(params["ref_audio"]) if params.get("ref_audio") is not None else None
    vae_sample = params.get("vae_sample", False)
    if not isinstance(vae_sample, bool):
        raise InvalidRequest("vae_sample must be true or false")
    if vae_sample and ref_audio is None:
        raise InvalidRequest("vae_sample draws the clip's latents from the VAE posterior: send ref_audio with it")
    steps = int_param(params, "num_inference_steps", 1, MAX_STEPS)
    grid = _t_grid(params.get("t_grid"))
    if grid is not None and steps is not None and steps != len(grid) - 1:
        raise InvalidRequest(f"num_inference_steps {steps} disagrees with t_grid's {len(grid) - 1} steps; "
                             "send one of them")
    if grid is not None and params.get("sway") is not None:
        raise InvalidRequest("sway reshapes the uniform grid; with t_grid it has nothing to do: omit one")
    return AuKParams(
        instructions=instructions, input_mode=input_mode, ref_audio=ref_audio,
        duration_seconds=number_param(params, "duration_seconds", None, MIN_SECONDS, MAX_SECONDS),
        seed=seed_param(params), num_inference_steps=steps,
        guidance_scale=number_param(params, "guidance_scale", None, 0.0, 20.0),
        sway=number_param(params, "sway", None, -1.0, 1.0), t_grid=grid, vae_sample=vae_sample)


def _t_grid(value: Any) -> tuple[float, ...] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or not 2 <= len(value) <= MAX_STEPS + 1
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise InvalidRequest(f"t_grid must be a list of 2 to {MAX_STEPS + 1} numbers (the flow's times)")
    grid = tuple(float(v) for v in value)
    if grid[0] != 0.0 or grid[-1] != 1.0 or any(b <= a for a, b in zip(grid, grid[1:])):
        raise InvalidRequest("t_grid must start at 0, end at 1 and increase strictly (the flow runs from "
                             "noise at 0 to audio at 1)")
    return grid
