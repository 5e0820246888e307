"""The model repositories without a server: committed ensembles equal what
`python -m tritontts.deploy.repository` writes, their wiring is valid, every stage config names a
real stage class, and the generator refuses wiring Triton would reject."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tritontts.deploy import repository
from tritontts.families import FAMILIES
from tritontts.deploy.repository import (
    ENSEMBLE_REPOSITORY, STAGE_REPOSITORY, WiringError, ensemble_config, read_config, wire)
from tritontts.protocol import ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS
from tritontts.serving.stage import Stage


@pytest.mark.parametrize("name", list(FAMILIES))
def test_committed_ensemble_equals_the_generated_one(name):
    committed = (ENSEMBLE_REPOSITORY / name / "config.pbtxt").read_text()
    assert committed == ensemble_config(FAMILIES[name]), \
        "ensembles/ is stale: run python -m tritontts.deploy.repository"
    assert (ENSEMBLE_REPOSITORY / name / "1").is_dir()


def test_check_command_passes_on_the_committed_tree():
    assert repository.main(["--check"]) == 0


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_step_input_is_mapped_and_every_ensemble_output_produced(name):
    family = FAMILIES[name]
    ensemble = read_config(ENSEMBLE_REPOSITORY / name / "config.pbtxt")
    assert [t.name for t in ensemble.input] == list(ENSEMBLE_INPUTS)
    assert [t.name for t in ensemble.output] == list(ENSEMBLE_OUTPUTS)
    produced = set(ENSEMBLE_INPUTS)
    for step in ensemble.ensemble_scheduling.step:
        stage = read_config(STAGE_REPOSITORY / step.model_name / "config.pbtxt")
        assert set(step.input_map) == {t.name for t in stage.input}, step.model_name
        assert set(step.input_map.values()) <= produced, step.model_name
        assert set(step.output_map) <= {t.name for t in stage.output}
        produced |= set(step.output_map.values())
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == list(family.stages)
    assert set(ENSEMBLE_OUTPUTS) <= produced


@pytest.mark.parametrize("stage", sorted(p.name for p in STAGE_REPOSITORY.iterdir() if p.is_dir()))
def test_every_stage_config_names_a_stage_class_and_has_a_version_folder(stage):
    import importlib

    config = read_config(STAGE_REPOSITORY / stage / "config.pbtxt")
    assert config.name == stage and config.backend == "tritontts"
    module, _, cls = config.parameters["stage"].string_value.partition(":")
    assert issubclass(getattr(importlib.import_module(module), cls), Stage)
    assert (STAGE_REPOSITORY / stage / "1").is_dir()


def copy_stages(tmp_path: Path, names) -> Path:
    for name in names:
        shutil.copytree(STAGE_REPOSITORY / name, tmp_path / name)
    return tmp_path


def test_reading_across_a_decoupled_step_is_refused_with_a_fix(tmp_path):
    """Negative control: drop the talker's forwarding of prompt_mel and the flow stage can
    no longer get it; the generator says which stage must forward it."""
    family = FAMILIES["cosyvoice3"]
    repo = copy_stages(tmp_path, family.stages)
    talker = repo / "cosyvoice3_talker" / "config.pbtxt"
    text = talker.read_text()
    out_start = text.index("output [")
    talker.write_text(text[:out_start] + text[out_start:].replace(
        '  { name: "prompt_mel"    data_type: TYPE_FP32  dims: [ -1, 80 ] },\n', "", 1))
    with pytest.raises(WiringError, match="'prompt_mel'.*across decoupled cosyvoice3_talker"):
        ensemble_config(family, repo)


@pytest.mark.parametrize("old,new,message", [
    ('input [\n', 'input [\n  { name: "pitch" data_type: TYPE_FP32 dims: [ 1 ] },\n',
     "piper_vits input needs 'pitch'"),
    ('{ name: "scales"      data_type: TYPE_FP32 ', '{ name: "scales"      data_type: TYPE_FP64 ',
     "'scales' is TYPE_FP64 but its source is TYPE_FP32"),
    ('{ name: "sample_rate" data_type: TYPE_INT32', '{ name: "sample_rate" data_type: TYPE_INT64',
     "'sample_rate' is TYPE_INT32 by convention"),
], ids=["input_nobody_produces", "type_mismatch_between_stages", "convention_type_broken"])
def test_a_broken_stage_config_is_refused_with_a_message_naming_it(tmp_path, old, new, message):
    family = FAMILIES["piper"]
    repo = copy_stages(tmp_path, family.stages)
    vits = repo / "piper_vits" / "config.pbtxt"
    text = vits.read_text()
    assert old in text
    vits.write_text(text.replace(old, new, 1))
    with pytest.raises(WiringError, match=message):
        ensemble_config(family, repo)


def test_the_wiring_reads_each_input_from_the_latest_producer():
    family = FAMILIES["cosyvoice3"]
    stages = [read_config(STAGE_REPOSITORY / n / "config.pbtxt") for n in family.stages]
    inputs, outputs = wire(stages)
    # hift's chunk_index comes from flow (the step right before it), not from the talker.
    assert inputs[3]["chunk_index"].step == 2 and inputs[2]["chunk_index"].step == 1
    assert outputs["audio"].step == 3 and outputs["chunk_index"].step == 3
    assert inputs[0]["text"].step is None


def test_a_word_aligned_repository_ends_every_ensemble_with_the_aligner(tmp_path):
    """--word-aligner: every family's stages pass words_request and stream_id on, and its
    ensemble ends with word_aligner, whose `words` is an ensemble output (the wiring's checks
    pass for all of them)."""
    from tritontts.deploy.repository import (STAGE_REPOSITORY, WORD_ALIGNER, read_config,
                                             write_word_aligned_repository)
    from tritontts.families import FAMILIES

    write_word_aligned_repository(dict(FAMILIES), (STAGE_REPOSITORY,), tmp_path)
    for name, family in FAMILIES.items():
        ensemble = read_config(tmp_path / name / "config.pbtxt")
        steps = ensemble.ensemble_scheduling.step
        assert steps[-1].model_name == WORD_ALIGNER
        assert "words" in [o.name for o in ensemble.output]
        assert dict(steps[-1].input_map)["words_request"] == f"{steps[-2].model_name.removeprefix(name + '_')}.words_request"
        for i, stage in enumerate(family.stages):
            config = read_config(tmp_path / stage / "config.pbtxt")
            assert "words_request" in [t.name for t in config.output]
            assert ("words_request" in [t.name for t in config.input]) == (i > 0)
    # The stage configs under model_repository/ stay as they are.
    assert "words_request" not in (STAGE_REPOSITORY / "piper_vits" / "config.pbtxt").read_text()


def test_words_request_is_made_only_for_requests_that_ask():
    from tritontts.protocol import InvalidRequest, words_request

    params = {"seed": 1, "word_timestamps": True, "language": "English"}
    assert json.loads(words_request("Hi there.", params, ("en",))) == {"text": "Hi there."}
    assert params == {"seed": 1, "language": "English"}         # the family never sees the field
    assert words_request("Hi.", {"word_timestamps": False}, ("en",)) == ""
    assert words_request("Hi.", {}, None) == ""
    for params, languages, needle in [({"word_timestamps": True}, None, "--word-aligner"),
                                      ({"word_timestamps": True, "language": "German"}, ("en",), "en only"),
                                      ({"word_timestamps": 1}, ("en",), "true or false")]:
        with pytest.raises(InvalidRequest, match=needle):
            words_request("Hi.", params, languages)
