"""GET /v1/audio/models: what each served model takes, for a client that builds a form from it
(the demo page does; any client may). Nothing here names a family: each model is described
from its Family descriptor (fields, capabilities, voice modes) and its checkpoint's Form.

A model's entry: its id (and --served-model-name aliases), family, description, whether it
is ready, the sample rate of its audio (each audio response also says it in the
X-Sample-Rate header), whether it streams, its built-in voices, whether it clones and
stores uploaded voices, whether `input` may be empty (instructions carry the request), and
its fields: name, kind (tritontts.protocol.FIELD_KINDS), what it does, the values it takes
(choice fields), whether a request needs it, and whether a form shows it among the advanced
ones. Fields the checkpoint refuses are left out, as are those the front fills in itself.
"""
from __future__ import annotations

from typing import Any

from tritontts.protocol import FIELD_KINDS, MAIN_FIELDS

from .serving import ServedModel, SpeechService

# The front's own fields every model takes (the family's parser never sees speed unless the
# family controls duration itself: the front time-stretches the audio otherwise).
SPEED_BY_THE_FRONT = "0.25-4: the front time-stretches the audio (pitch kept)"


def describe_models(service: SpeechService, ready: list[str]) -> dict[str, Any]:
    return {"object": "list", "data": [describe(served, service.names_of(name), name in ready)
                                       for name, served in service.models.items()]}


def describe(served: ServedModel, aliases: list[str], ready: bool) -> dict[str, Any]:
    family = served.family
    caps = family.capabilities
    return {
        "id": served.name, "aliases": aliases, "family": family.name, "description": family.description,
        "ready": ready, "sample_rate": caps.sample_rate, "streaming": caps.streaming,
        "voices": list(served.voices or ("default",)), "preset_voices": caps.preset_voices,
        "uploads_voices": family.voice_encoder is not None,
        "input_required": not caps.instruction_only,
        "max_instructions_chars": caps.max_instructions_chars,
        "fields": fields(served),
    }


def fields(served: ServedModel) -> list[dict[str, Any]]:
    family, form = served.family, served.form
    takes = dict(family.fields.takes)
    if "speed" not in takes or not family.capabilities.native_speed:
        takes["speed"] = SPEED_BY_THE_FRONT
    names = [n for n in takes if n not in form.hidden and FIELD_KINDS[n] != "internal"]
    ordered = [n for n in MAIN_FIELDS if n in names] + [n for n in names if n not in MAIN_FIELDS]
    transcript = bool(family.voice_modes) and all(m.transcript for m in family.voice_modes)
    out = []
    for name in ordered:
        kind = FIELD_KINDS[name]
        entry: dict[str, Any] = {"name": name, "kind": kind, "description": takes[name],
                                 "required": name in form.required, "advanced": name not in MAIN_FIELDS}
        if name in form.choices:
            entry.update(kind="choice", choices=list(form.choices[name]))
        elif kind == "choice":
            entry["kind"] = "text"          # the checkpoint's values unknown here: free text
        if name == "ref_audio" and form.reference_required:
            entry["required"] = True
            entry["unless_uploaded_voice"] = True
        if name == "ref_text" and transcript:
            entry["required_with"] = "ref_audio"
        out.append(entry)
    return out
