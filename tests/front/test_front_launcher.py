"""`python -m frontend` argument checks: every one of these exits before a server starts."""
from __future__ import annotations

from dataclasses import replace

import pytest

from frontend.__main__ import checkpoint_env, main
from tritontts.families import FAMILIES

REQUIRING = [f for f in FAMILIES.values() if f.checkpoint_required]


def launch(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of the launcher, whether it returns or argparse exits."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.fixture(autouse=True)
def no_checkpoint_variables(monkeypatch):
    for family in FAMILIES.values():
        monkeypatch.delenv(family.checkpoint_env, raising=False)


@pytest.mark.parametrize("family", REQUIRING, ids=lambda f: f.name)
def test_checkpoint_that_does_not_exist_exits_2_naming_the_path(family, tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    code, err = launch(["--families", family.name, "--checkpoint", f"{family.name}={missing}"],
                       capsys)
    assert code == 2 and str(missing) in err


def test_checkpoint_for_an_unknown_family_exits_2_naming_the_known_families(capsys):
    code, err = launch(["--checkpoint", "bogus=x"], capsys)
    assert code == 2 and all(name in err for name in FAMILIES)


def test_checkpoint_without_family_equals_path_exits_2_asking_for_that_form(capsys):
    code, err = launch(["--checkpoint", "just-a-path"], capsys)
    assert code == 2 and "FAMILY=PATH" in err


@pytest.mark.parametrize("family", REQUIRING, ids=lambda f: f.name)
def test_family_that_requires_a_checkpoint_exits_2_without_one(family, capsys):
    code, err = launch(["--families", family.name], capsys)
    assert code == 2 and f"needs --checkpoint {family.name}=PATH" in err


@pytest.mark.parametrize("family", REQUIRING, ids=lambda f: f.name)
def test_checkpoint_comes_from_the_family_environment_variable(family, tmp_path, monkeypatch,
                                                               capsys):
    missing = tmp_path / "from-environment"
    monkeypatch.setenv(family.checkpoint_env, str(missing))
    code, err = launch(["--families", family.name], capsys)
    assert code == 2 and str(missing) in err


@pytest.mark.parametrize("family", REQUIRING, ids=lambda f: f.name)
def test_checkpoint_option_wins_over_the_environment_variable(family, tmp_path, monkeypatch,
                                                              capsys):
    monkeypatch.setenv(family.checkpoint_env, str(tmp_path / "from-environment"))
    code, err = launch(["--families", family.name,
                        "--checkpoint", f"{family.name}={tmp_path / 'from-option'}"], capsys)
    assert code == 2 and "from-option" in err and "from-environment" not in err


def test_unknown_family_in_families_exits_2_naming_it(capsys):
    code, err = launch(["--families", "bogus"], capsys)
    assert code == 2 and "bogus" in err


def test_family_without_a_required_checkpoint_needs_no_tritonserver_entry():
    optional = [f.name for f in FAMILIES.values() if not f.checkpoint_required]
    assert checkpoint_env(optional, {}, {}) == {}


def test_checkpoint_is_preflighted_and_reaches_tritonserver_absolute_under_checkpoint_env(
        tmp_path, monkeypatch):
    checked = []
    family = replace(next(iter(FAMILIES.values())), open_checkpoint=checked.append)
    monkeypatch.setitem(FAMILIES, family.name, family)
    monkeypatch.chdir(tmp_path)
    env = checkpoint_env([family.name], {family.name: "ckpt"}, {})
    absolute = tmp_path.resolve() / "ckpt"
    assert env == {family.checkpoint_env: str(absolute)} and checked == [absolute]


@pytest.mark.parametrize("family", REQUIRING, ids=lambda f: f.name)
def test_another_checkpoint_of_a_family_that_does_not_exist_exits_2_naming_it(family, tmp_path,
                                                                             capsys):
    missing = tmp_path / "nonexistent"
    code, err = launch(["--families", "piper", "--checkpoint", f"{family.name}-second={missing}"],
                       capsys)
    assert code == 2 and f"{family.name}-second checkpoint" in err and str(missing) in err


def test_a_malformed_second_model_name_exits_2(capsys):
    code, err = launch(["--checkpoint", "qwen3_tts-=x"], capsys)
    assert code == 2 and "FAMILY-NAME=PATH" in err


def test_help_documents_every_option():
    from frontend.__main__ import build_parser

    undocumented = [a.option_strings for a in build_parser()._actions
                    if a.option_strings and not (a.help and a.help.strip())]
    assert not undocumented


def test_model_load_progress_is_reported_per_model_with_the_failure_reason():
    from tritontts.deploy.tritonserver import TritonServer

    class Index:
        def __init__(self):
            self.models = [{"name": "piper_text", "state": "LOADING"},
                           {"name": "piper_vits", "state": "LOADING"}]

        def get_model_repository_index(self, as_json=False):
            return {"models": self.models}

    index, states, lines = Index(), {}, []
    TritonServer._report_states(index, states, lines.append, 1.0)
    TritonServer._report_states(index, states, lines.append, 2.0)      # no change: no line
    index.models = [{"name": "piper_text", "state": "READY"},
                    {"name": "piper_vits", "state": "UNAVAILABLE",
                     "reason": "piper_vits: voices.json: no such file"}]
    TritonServer._report_states(index, states, lines.append, 9.0)
    assert lines == ["[    1 s] piper_text: LOADING (0/2 ready)",
                     "[    1 s] piper_vits: LOADING (0/2 ready)",
                     "[    9 s] piper_text: READY (1/2 ready)",
                     "[    9 s] piper_vits: UNAVAILABLE: piper_vits: voices.json: no such file (1/2 ready)"]


def test_engine_arg_reaches_the_talker_stage_over_its_model_json(monkeypatch):
    """--engine-arg STAGE.KEY=VALUE: parsed (JSON values typed), grouped per stage into
    tritonserver's environment, and merged over model.json's engine_args by the stage."""
    from frontend.__main__ import engine_arg, engine_args_env
    from tritontts.engine.vllm_talker import engine_arg_overrides

    given = [engine_arg("fish_s2_pro_talker.dtype=bfloat16"),
             engine_arg("fish_s2_pro_talker.kv_cache_memory_bytes=1073741824"),
             engine_arg("voxtral_tts_talker.max_num_seqs=4")]
    env = engine_args_env(given)
    assert engine_arg_overrides("fish_s2_pro_talker", env) == {"dtype": "bfloat16",
                                                               "kv_cache_memory_bytes": 1073741824}
    assert engine_arg_overrides("voxtral_tts_talker", env) == {"max_num_seqs": 4}
    assert engine_arg_overrides("qwen3_tts_talker", env) == {}
    assert engine_arg_overrides("qwen3_tts_talker", {}) == {}


@pytest.mark.parametrize("value,needle", [("fish_s2_pro_talker.dtype", "STAGE.KEY=VALUE"),
                                          ("dtype=bfloat16", "STAGE.KEY=VALUE"),
                                          ("fish_s2_pro_codec.dtype=bfloat16", "not a vLLM stage")])
def test_malformed_engine_arg_exits_2_saying_what_it_takes(value, needle, capsys):
    code, err = launch(["--engine-arg", value], capsys)
    assert code == 2 and needle in err


def test_engine_arg_with_an_outside_tritonserver_exits_2(capsys):
    code, err = launch(["--triton-url", "localhost:8001", "--engine-arg", "fish_s2_pro_talker.dtype=bfloat16"],
                       capsys)
    assert code == 2 and "--engine-arg" in err


def test_served_model_names_must_name_a_served_model_once():
    import argparse

    from frontend.__main__ import LaunchError, served_name, served_names

    assert served_name("qwen3_tts=Qwen3-TTS") == ("qwen3_tts", "Qwen3-TTS")
    for bad in ("Qwen3-TTS", "nosuch=Name", "piper="):
        with pytest.raises(argparse.ArgumentTypeError, match="MODEL=NAME"):
            served_name(bad)
    assert served_names([("piper", "voice")], ["piper"]) == {"voice": "piper"}
    with pytest.raises(LaunchError, match="not served here"):
        served_names([("qwen3_tts", "q")], ["piper"])
    with pytest.raises(LaunchError, match="names two models"):
        served_names([("piper", "x"), ("piper-b", "x")], ["piper", "piper-b"])


def test_a_stage_setting_must_be_a_model_json_setting_of_that_stage_and_reaches_it(tmp_path, monkeypatch):
    import argparse
    import json

    from frontend.__main__ import stage_setting, stage_settings_env
    from tritontts.serving.stage import STAGE_SETTINGS_ENV, StageContext

    assert stage_setting("cosyvoice3_talker.sampling_method=standard") == (
        "cosyvoice3_talker", "sampling_method", "standard")
    for bad, needle in (("cosyvoice3_talker.no_such=1", "its settings are"),
                        ("cosyvoice3_talker.engine_args=1", "its settings are"),
                        ("piper_vits.x=1", "not a stage setting"), ("nodot=1", "STAGE.KEY=VALUE")):
        with pytest.raises(argparse.ArgumentTypeError, match=needle):
            stage_setting(bad)
    env = stage_settings_env([("cosyvoice3_talker", "sampling_method", "standard")])
    folder = tmp_path / "cosyvoice3_talker"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.json").write_text(json.dumps({"engine_args": {}, "sampling_method": "ras"}))
    monkeypatch.setenv(STAGE_SETTINGS_ENV, env[STAGE_SETTINGS_ENV])
    assert StageContext("cosyvoice3_talker", folder).settings()["sampling_method"] == "standard"
    assert StageContext("other", folder).settings()["sampling_method"] == "ras"


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_kv_requests_below_one_or_not_a_number_exits_2_saying_what_it_takes(value, capsys):
    code, err = launch(["--kv-requests", value], capsys)
    assert code == 2 and "a whole number of at least 1" in err


def test_kv_requests_with_an_outside_tritonserver_exits_2(capsys):
    code, err = launch(["--triton-url", "localhost:8001", "--kv-requests", "2"], capsys)
    assert code == 2 and "--kv-requests sizes the talkers" in err


@pytest.mark.parametrize("flags,needle", [
    (["--dtype", "float16"], "--dtype=float16: float16 does not run on vLLM's CPU backend"),
    (["--dtype", "int8"], "--dtype=int8: dtype 'int8' is not one of"),
    (["--engine-arg", "fish_s2_pro_talker.dtype=float16"], "--engine-arg fish_s2_pro_talker.dtype=float16: float16"),
])
def test_a_dtype_the_device_cannot_run_exits_2_before_loading(flags, needle, capsys):
    code, err = launch(flags, capsys)
    assert code == 2 and needle in err


def test_dtype_reaches_tritonserver_only_when_not_auto():
    from frontend.__main__ import dtype_env
    from tritontts.engine.engine_dtype import DTYPE_ENV

    assert dtype_env("auto", [], None, None) == {}
    assert dtype_env("float32", [], None, None) == {DTYPE_ENV: "float32"}
    assert dtype_env("bfloat16", [], "gpu", None) == {DTYPE_ENV: "bfloat16"}


def test_a_word_aligner_that_is_neither_aligner_exits_2_saying_what_each_needs(tmp_path, capsys):
    code, err = launch(["--word-aligner", str(tmp_path)], capsys)
    assert code == 2 and "neither a CTranslate2 Whisper folder" in err and "model.bin" in err
    assert "Qwen3-ForcedAligner checkpoint" in err and "timestamp_token_id" in err


def test_word_languages_are_the_aligner_checkpoints(tmp_path):
    import json

    from frontend.__main__ import word_languages

    assert word_languages(None) is None and word_languages("whisper") == ("en",)
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_asr", "timestamp_token_id": 7, "thinker_config": {"classify_num": 5000},
        "support_languages": ["English", "French", "Klingon"]}))
    assert word_languages(str(tmp_path)) == ("en", "fr", "klingon")


def test_a_word_aligned_repository_builds_over_the_gpu_profile(tmp_path):
    """--word-aligner composes with --profile gpu: the aligned stages are the profile's
    rewritten ones, and the ensemble ends with the aligner."""
    from frontend.__main__ import aligned_repository, profile_repository, remove
    from tritontts.deploy.repository import ENSEMBLE_REPOSITORY, read_config

    profiled = profile_repository("gpu", ["piper"], [0])
    try:
        out = aligned_repository(["piper"], (profiled, ENSEMBLE_REPOSITORY))
        vits = read_config(out / "piper_vits" / "config.pbtxt")
        assert vits.instance_group[0].kind == read_config(profiled / "piper_vits" / "config.pbtxt").instance_group[0].kind
        steps = read_config(out / "piper" / "config.pbtxt").ensemble_scheduling.step
        assert [s.model_name for s in steps][-1] == "word_aligner"
        remove([out])
    finally:
        remove([profiled])
