"""What a Qwen3-TTS checkpoint's form asks (Family.form, shown by GET /v1/audio/models and
the demo page): its one task type and its languages; CustomVoice: presets and style
instructions, no reference; VoiceDesign: the description required, no reference; Base: a
reference required, no instructions. Each on a random checkpoint of that kind."""
from __future__ import annotations

import pytest

from tritontts.families import FAMILIES

FAMILY = FAMILIES["qwen3_tts"]
REFERENCE = {"ref_audio", "ref_text", "x_vector_only_mode", "speaker_embedding"}


@pytest.mark.parametrize("kind, task", [("custom_voice", "CustomVoice"), ("voice_design", "VoiceDesign"),
                                        ("base", "Base")])
def test_the_form_offers_the_checkpoint_s_own_task_and_languages_and_hides_what_it_refuses(
        random_checkpoints, kind, task):
    path = random_checkpoints.get("qwen3_tts", kind=kind)
    form = FAMILY.form(path)
    checkpoint = FAMILY.open_checkpoint(path)
    assert form.choices["task_type"] == (task,)
    assert form.choices["language"] == checkpoint.languages and "auto" in form.choices["language"]
    if kind == "base":
        assert form.reference_required and form.hidden == ("instructions",) and not form.required
    else:
        assert set(form.hidden) == REFERENCE and not form.reference_required
        assert form.required == (("instructions",) if kind == "voice_design" else ())
    assert set(form.hidden) <= set(FAMILY.fields.takes)


def test_without_a_checkpoint_the_form_asks_nothing_beyond_the_fields():
    form = FAMILY.form(None)
    assert not form.choices and not form.required and not form.hidden and not form.reference_required
