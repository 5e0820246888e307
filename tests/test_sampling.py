"""Sampling overrides (tritontts/sampling.py): checked once by each family's parser, only
the knobs its talker has, and applied over the checkpoint's defaults."""
from __future__ import annotations

import pytest

from tritontts import sampling
from tritontts.families import FAMILIES
from tritontts.protocol import InvalidRequest


@pytest.mark.parametrize("name,value,needle", [
    ("temperature", -0.1, "from 0 up to 2"),
    ("temperature", "hot", "must be a number"),
    ("top_p", 0.0, "above 0 up to 1"),
    ("top_p", 1.5, "above 0 up to 1"),
    ("top_k", 2.5, "must be an integer"),
    ("top_k", True, "must be an integer"),
    ("repetition_penalty", float("nan"), "must be a number"),
    ("win_size", 0, "from 1 up to 1000"),
    ("subtalker_temperature", 0, "above 0"),
])
def test_out_of_range_or_mistyped_knob_is_400_naming_it(name, value, needle):
    with pytest.raises(InvalidRequest, match=name) as error:
        sampling.sampling_overrides({name: value}, [name])
    assert needle in str(error.value)


def test_overrides_apply_over_defaults_by_prefix():
    overrides = sampling.decode(sampling.encode(
        sampling.sampling_overrides({"top_k": 1, "subtalker_top_p": 0.5}, sampling.RULES)))
    assert sampling.apply({"top_k": 50, "top_p": 1.0}, overrides) == {"top_k": 1, "top_p": 1.0}
    assert sampling.apply({"top_k": 50, "top_p": 1.0}, overrides, "subtalker_") == {"top_k": 50, "top_p": 0.5}
    assert sampling.decode("") == {}


@pytest.mark.parametrize("family,knob,accepted", [
    ("piper", "temperature", False),
    ("cosyvoice3", "top_k", True),
    ("cosyvoice3", "win_size", True),
    ("cosyvoice3", "subtalker_top_k", False),
    ("qwen3_tts", "temperature", True),
    ("qwen3_tts", "subtalker_top_k", True),
    ("qwen3_tts", "win_size", False),
])
def test_each_family_takes_only_its_talkers_knobs(family, knob, accepted):
    example = FAMILIES[family].example_params()
    value = 1
    if accepted:
        parsed = FAMILIES[family].parse_params({**example, knob: value})
        assert parsed.sampling == {knob: value}
    else:
        with pytest.raises(InvalidRequest, match=f"unknown parameter.*{knob}"):
            FAMILIES[family].parse_params({**example, knob: value})
