"""AuK's request fields (tritontts.families.auk.request: the one parser, shared by stage and front) and
the instruction and output length a request turns into (tritontts.families.auk.prompt)."""
from __future__ import annotations

import base64

import pytest

from tritontts.families.auk.prompt import DEFAULT_VOICE, instruction_for, output_frames
from tritontts.families.auk.request import parse_auk_params
from tritontts.protocol import InvalidRequest

CLIP = base64.b64encode(b"RIFF-not-really-audio").decode()


def frames_for(seconds: float) -> int:
    import math

    return max(1, math.ceil(seconds * 50 - 1e-9))


def test_every_documented_field_parses_within_its_bounds():
    p = parse_auk_params({"instructions": " Add rain. ", "ref_audio": CLIP, "duration_seconds": 4.5, "seed": 7,
                          "num_inference_steps": 8, "guidance_scale": 3.0, "sway": -0.5, "vae_sample": True})
    assert (p.instructions, p.duration_seconds, p.seed, p.num_inference_steps, p.guidance_scale, p.sway,
            p.vae_sample) == ("Add rain.", 4.5, 7, 8, 3.0, -0.5, True)
    assert p.ref_audio == base64.b64decode(CLIP)
    assert parse_auk_params({"t_grid": [0, 0.25, 1]}).t_grid == (0.0, 0.25, 1.0)


@pytest.mark.parametrize("params, needle", [
    ({"duration_seconds": 31}, "duration_seconds must be between"),
    ({"duration_seconds": 0}, "duration_seconds must be between"),
    ({"num_inference_steps": 0}, "num_inference_steps must be an integer from 1 to 128"),
    ({"guidance_scale": -1}, "guidance_scale must be between"),
    ({"sway": 2}, "sway must be between"),
    ({"t_grid": [0.5, 1.0]}, "t_grid must start at 0"),
    ({"t_grid": [0, 0.6, 0.4, 1]}, "increase strictly"),
    ({"t_grid": [0]}, "t_grid must be a list of 2"),
    ({"t_grid": [0, 0.5, 1], "num_inference_steps": 4}, "disagrees with t_grid"),
    ({"t_grid": [0, 0.5, 1], "sway": -1}, "with t_grid it has nothing to do"),
    ({"vae_sample": True}, "send ref_audio with it"),
    ({"vae_sample": "yes", "ref_audio": CLIP}, "vae_sample must be true or false"),
    ({"ref_text": "hello"}, "reads no transcript"),
    ({"speed": 1.5}, "speed"),
    ({"max_new_tokens": 100}, "duration_seconds"),
    ({"temperature": 0.7}, "seed, not temperature"),
    ({"steps": 3}, "unknown parameter"),
    ({"instructions": 5}, "instructions must be text"),
])
def test_bad_fields_are_refused_with_what_to_fix(params, needle):
    with pytest.raises(InvalidRequest, match=needle):
        parse_auk_params(params)


def test_input_is_the_whole_instruction_by_default_as_vllm_omni_reads_it():
    plain = parse_auk_params({})
    assert instruction_for("A dog barks twice.", plain, False) == "A dog barks twice."
    assert instruction_for("Add rain to the recording.", plain, True) == "Add rain to the recording."
    with pytest.raises(InvalidRequest, match="not both"):
        instruction_for("Hello.", parse_auk_params({"instructions": "A calm voice."}), False)
    with pytest.raises(InvalidRequest, match="input_mode must be one of"):
        parse_auk_params({"input_mode": "poem"})


def test_speech_mode_turns_input_into_an_instruction_with_the_voice_described_or_cloned():
    plain = parse_auk_params({"input_mode": "speech"})
    assert instruction_for("Hello.", plain, False) == (
        f'Generate speech based on the following description: "{DEFAULT_VOICE}". The content to speak is: "Hello.".')
    described = parse_auk_params({"instructions": "A calm, low voice.", "input_mode": "speech"})
    assert '"A calm, low voice."' in instruction_for("Hello.", described, False)
    assert instruction_for("Hello.", plain, True) == 'Say the following with the same voice: "Hello."'


def test_instructions_alone_are_the_whole_instruction_and_input_may_be_empty():
    p = parse_auk_params({"instructions": "Add rain to the recording."})
    assert instruction_for("", p, True) == "Add rain to the recording."
    assert instruction_for("  ", p, False) == "Add rain to the recording."
    with pytest.raises(InvalidRequest, match="input is empty"):
        instruction_for("", parse_auk_params({}), False)
    with pytest.raises(InvalidRequest, match="leave input empty"):
        instruction_for("Hello.", parse_auk_params({"instructions": "Add rain.", "input_mode": "speech"}), True)


def test_output_length_is_given_else_the_clip_else_sized_from_the_text():
    assert output_frames("", parse_auk_params({"duration_seconds": 2.0}), 77, frames_for) == 100
    assert output_frames("", parse_auk_params({"instructions": "Add rain."}), 77, frames_for) == 77
    assert output_frames("Add rain.", parse_auk_params({}), 77, frames_for) == 77     # input, the instruction
    speech = parse_auk_params({"input_mode": "speech"})
    assert output_frames("Hi.", speech, 77, frames_for) == 50          # speech in the clip's voice: its text
    short, long = (output_frames(t, parse_auk_params({}), 0, frames_for) for t in ("Hi.", "word " * 60))
    assert short == 50 and 50 < long <= 1500          # at least a second, at most 30
    assert output_frames("", parse_auk_params({"instructions": "A dog barks."}), 0, frames_for) == 70   # 0.5 + 12 x 0.075 s
