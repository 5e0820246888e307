"""The shared text front-end and the Piper voice table (no server needed)."""
from __future__ import annotations

import json

import pytest

from tritontts.families.piper.request import parse_piper_params, scales_for
from tritontts.families.piper.voices import load_voice_table
from tritontts.protocol import InvalidRequest, decode_params
from tritontts.text import MAX_SENTENCE_CHARS, normalize, split_sentences


def test_sentence_splitting_keeps_abbreviations_together():
    text = normalize("Dr. Smith met Mr. Jones at 5 p.m. today! Did the U.S. team win?  “Yes” — it did.")
    assert split_sentences(text) == [
        "Dr. Smith met Mr. Jones at 5 p.m. today!", "Did the U.S. team win?", '"Yes", it did.']


def test_paragraphs_and_long_sentences_are_split():
    assert split_sentences("First line\n\nSecond line") == ["First line", "Second line"]
    long = ", ".join(["a clause of several words"] * 40) + "."
    parts = split_sentences(long)
    assert len(parts) > 1 and all(len(p) <= MAX_SENTENCE_CHARS for p in parts)
    assert " ".join(parts) == long


def test_nothing_speakable():
    assert split_sentences(normalize("... !!! ???")) == []


def test_params_validation():
    assert decode_params("") == {} and decode_params(b'{"seed": 1}') == {"seed": 1}
    with pytest.raises(InvalidRequest, match="JSON object"):
        decode_params("[1]")
    with pytest.raises(InvalidRequest, match="speed must be between"):
        parse_piper_params({"speed": 0.1})
    with pytest.raises(InvalidRequest, match="unknown parameter"):
        parse_piper_params({"pitch": 2})
    table = load_voice_table()
    config = table.resolve(None).config
    noise, length, noise_w = scales_for(parse_piper_params({"speed": 2.0}), config)
    assert length == pytest.approx(config.length_scale / 2) and noise == config.noise_scale


def test_voice_table_from_path_and_errors(tmp_path):
    default = load_voice_table().resolve("default")
    good = tmp_path / "voices.json"
    good.write_text(json.dumps({"default_voice": "narrator", "voices": {
        "narrator": {"model": str(default.model_path)}}}))
    table = load_voice_table(good)
    assert table.resolve(None).name == "narrator"
    with pytest.raises(InvalidRequest, match="valid voices: narrator"):
        table.resolve("joe")

    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"voices": {"x": {"model": "nowhere.onnx"}}}))
    with pytest.raises(FileNotFoundError, match="missing.json.*nowhere.onnx"):
        load_voice_table(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match="broken.json"):
        load_voice_table(broken)
