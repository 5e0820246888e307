"""Deployment profiles without a GPU or a server: the gpu profile's rewritten configs (kinds,
counts, batch sizes, parameters, talker engine arguments) still parse and wire, the cpu
profile is the committed tree byte for byte, and the launcher takes --profile."""
from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from frontend.__main__ import parse_args, profile_repository
from tritontts.deploy import profiles
from tritontts.families import FAMILIES
from tritontts.deploy.profiles import (
    DEFAULT_GPU_MEMORY_GIB, ENGINE_BUDGET, GPU_SIZING_FILE, ProfileError, check_engines, config_text, engine_shares,
    gpu_sizing, write_profile_repository)
from tritontts.deploy.repository import (
    ENSEMBLE_REPOSITORY, STAGE_REPOSITORY, ensemble_config, read_config, write_served_model)

STAGES = profiles.stage_names()
GPU, CPU = mc.ModelInstanceGroup.Kind.KIND_GPU, mc.ModelInstanceGroup.Kind.KIND_CPU
SIZING = {stage: gpu_sizing(STAGE_REPOSITORY / stage) for stage in STAGES}
ENGINES = sorted(s for s in STAGES if profiles.engine_settings_path(STAGE_REPOSITORY / s))
CPU_STAGES = {s for s in STAGES if SIZING[s].device == "cpu"}
WITH_PARAMETERS = sorted(s for s in STAGES if SIZING[s].parameters)
WITH_RUNTIME = sorted(s for s in STAGES if "runtime" in SIZING[s].parameters)
# What every engine served together on an 80 GiB card got from the global table this
# replaced (each gpu.json's weights + KV cache were written to keep it): a regression check.
FORMER_SHARES = {"cosyvoice3_talker": 0.05, "qwen3_tts_talker": 0.08, "higgs_audio_v2_talker": 0.17,
                 "glm_tts_talker": 0.07, "voxcpm2_talker": 0.07, "voxtral_tts_talker": 0.11,
                 "fish_s2_pro_talker": 0.13, "gepard_talker": 0.03, "auk_encoder": 0.09}


@pytest.fixture(scope="module")
def gpu_repository(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu-profile")
    assert profiles.main(["gpu", "--out", str(out)]) == 0
    return out


def config(repository: Path, stage: str) -> mc.ModelConfig:
    return read_config(repository / stage / "config.pbtxt")


def engine_args(repository: Path, stage: str) -> dict:
    return json.loads((repository / stage / "1" / "model.json").read_text())["engine_args"]


def test_every_stage_declares_its_gpu_sizing_and_every_vllm_stage_its_engine():
    for stage in STAGES:
        assert SIZING[stage].why, stage
        assert (SIZING[stage].engine is not None) == (stage in ENGINES), stage
    assert ENGINES and CPU_STAGES and WITH_PARAMETERS


def test_all_engines_on_one_80_gib_card_get_the_shares_of_the_former_table():
    shares = check_engines(ENGINES)
    assert shares == pytest.approx(FORMER_SHARES, abs=1e-4)
    assert sum(shares.values()) <= ENGINE_BUDGET + 1e-6


def test_engines_served_alone_or_twice_share_what_the_budget_leaves_by_kv_size():
    engines = {s: SIZING[s].engine for s in ENGINES}
    alone = engine_shares(engines, {"cosyvoice3_talker": 1})
    assert alone == {"cosyvoice3_talker": ENGINE_BUDGET}          # the whole budget, not 0.05
    twice = engine_shares(engines, {"qwen3_tts_talker": 2})       # two checkpoints: two engines
    assert twice == {"qwen3_tts_talker": ENGINE_BUDGET / 2}
    pair = engine_shares(engines, {"glm_tts_talker": 1, "voxcpm2_talker": 1}, gpu_memory_gib=141)
    glm, vox = engines["glm_tts_talker"], engines["voxcpm2_talker"]
    spare = ENGINE_BUDGET * 141 - glm.need_gib - vox.need_gib
    assert pair["glm_tts_talker"] == pytest.approx(
        (glm.need_gib + spare * glm.kv_cache_gib / (glm.kv_cache_gib + vox.kv_cache_gib)) / 141, abs=1e-4)
    assert sum(pair.values()) == pytest.approx(ENGINE_BUDGET, abs=1e-3)


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_runs_where_the_profile_says(gpu_repository, stage):
    source, profiled = config(STAGE_REPOSITORY, stage), config(gpu_repository, stage)
    kinds = {g.kind for g in profiled.instance_group}
    sizing = SIZING[stage]
    if stage in CPU_STAGES:
        assert kinds == {CPU}
        assert profiled.instance_group == source.instance_group
        assert profiled.max_batch_size == source.max_batch_size
    else:
        assert kinds == {GPU}
        assert all(list(g.gpus) == [0] for g in profiled.instance_group)
        counts = [g.count for g in profiled.instance_group]
        # What gpu.json leaves out stays as committed.
        assert counts == [sizing.instances or g.count for g in source.instance_group]
        assert profiled.max_batch_size == (sizing.max_batch_size or source.max_batch_size)
    # Only placement, sizing and parameters change: tensors and batching stay as committed.
    assert profiled.name == source.name and profiled.backend == source.backend
    assert profiled.input == source.input and profiled.output == source.output
    assert profiled.dynamic_batching == source.dynamic_batching
    assert profiled.model_transaction_policy == source.model_transaction_policy


@pytest.mark.parametrize("stage", WITH_PARAMETERS)
def test_every_parameter_a_gpu_json_gives_is_set_once_over_the_committed_one(gpu_repository, stage):
    text = (gpu_repository / stage / "config.pbtxt").read_text()
    parameters = config(gpu_repository, stage).parameters
    for key, value in SIZING[stage].parameters.items():
        assert parameters[key].string_value == value and text.count(f'key: "{key}"') == 1, (stage, key)


@pytest.mark.parametrize("stage", WITH_RUNTIME)
def test_runtime_and_precision_are_set_once(gpu_repository, stage):
    text = (gpu_repository / stage / "config.pbtxt").read_text()
    parameters = config(gpu_repository, stage).parameters
    assert parameters["runtime"].string_value == "tensorrt,onnxruntime,torch"
    assert parameters["precision"].string_value == "fp16"
    assert "device" not in parameters
    for key in ("runtime", "precision"):
        assert text.count(f'key: "{key}"') == 1
    source = config(STAGE_REPOSITORY, stage).parameters
    assert all(parameters[k] == v for k, v in source.items() if k not in SIZING[stage].parameters)


def test_a_parameter_already_there_is_replaced_not_repeated(tmp_path):
    source = tmp_path / "source"
    stage = "cosyvoice3_flow"
    (source / stage).mkdir(parents=True)
    text = (STAGE_REPOSITORY / stage / "config.pbtxt").read_text()
    (source / stage / "config.pbtxt").write_text(
        text + 'parameters { key: "runtime" value: { string_value: "torch" } }\n')
    shutil.copy(STAGE_REPOSITORY / stage / GPU_SIZING_FILE, source / stage)
    write_profile_repository("gpu", [stage], tmp_path / "out", source=source)
    written = (tmp_path / "out" / stage / "config.pbtxt").read_text()
    assert written.count('key: "runtime"') == 1
    assert read_config(tmp_path / "out" / stage / "config.pbtxt").parameters["runtime"] \
        .string_value == "tensorrt,onnxruntime,torch"


def test_the_leading_comments_stay(gpu_repository):
    for stage in STAGES:
        source = (STAGE_REPOSITORY / stage / "config.pbtxt").read_text().splitlines()
        comments = source[:next(i for i, line in enumerate(source) if not line.startswith("#"))]
        written = (gpu_repository / stage / "config.pbtxt").read_text().splitlines()
        assert comments and written[:len(comments)] == comments, stage


@pytest.mark.parametrize("stage", ENGINES)
def test_talker_engine_arguments_are_for_cuda_vllm(gpu_repository, stage):
    source = engine_args(STAGE_REPOSITORY, stage)
    args = engine_args(gpu_repository, stage)
    assert "kv_cache_memory_bytes" not in args
    assert args["gpu_memory_utilization"] == check_engines(ENGINES)[stage]
    assert args["dtype"] == "bfloat16"
    assert args["enforce_eager"] is (not SIZING[stage].engine.cuda_graphs)
    rewritten = {"kv_cache_memory_bytes", "gpu_memory_utilization", "dtype", "enforce_eager"}
    assert {k: v for k, v in args.items() if k not in rewritten} == \
        {k: v for k, v in source.items() if k not in rewritten}
    # the talker's own settings (hops, chunks) are untouched; the card the share is of is
    # added, for the stage's check that its checkpoint fits the share (kv_budget.size_gpu_share)
    whole = lambda repo: json.loads((repo / stage / "1" / "model.json").read_text())  # noqa: E731
    profiled = whole(gpu_repository)
    assert profiled.pop("gpu_memory_gib") == DEFAULT_GPU_MEMORY_GIB
    assert {k: v for k, v in profiled.items() if k != "engine_args"} == \
        {k: v for k, v in whole(STAGE_REPOSITORY).items() if k != "engine_args"}


def test_talker_shares_in_the_written_repository_fit_the_budget(gpu_repository):
    assert sum(engine_args(gpu_repository, t)["gpu_memory_utilization"] for t in ENGINES) \
        <= ENGINE_BUDGET + 1e-6


def test_every_ensemble_is_copied_and_still_wires_over_the_profiled_stages(gpu_repository):
    for name, family in FAMILIES.items():
        assert filecmp.cmp(gpu_repository / name / "config.pbtxt",
                           ENSEMBLE_REPOSITORY / name / "config.pbtxt", shallow=False)
        assert (gpu_repository / name / "1").is_dir()
        ensemble = read_config(gpu_repository / name / "config.pbtxt")
        assert all(ensemble.max_batch_size <= config(gpu_repository, s).max_batch_size
                   for s in family.stages)
        ensemble_config(family, gpu_repository)     # raises if the wiring broke


def test_an_ensemble_is_left_out_when_its_stages_are_not_there(tmp_path):
    stages = list(FAMILIES["piper"].stages)
    assert profiles.main(["gpu", "--out", str(tmp_path), "--stages", ",".join(stages)]) == 0
    assert (tmp_path / "piper" / "config.pbtxt").is_file()
    assert not (tmp_path / "qwen3_tts").exists() and not (tmp_path / "cosyvoice3").exists()


def test_gpus_list_places_instances_and_talkers_and_one_instance_stages_stay_on_the_first(tmp_path):
    write_profile_repository("gpu", None, tmp_path, gpus=[2, 3])
    for stage in STAGES:
        if stage in CPU_STAGES:
            continue
        want = [2] if stage in ENGINES or SIZING[stage].one_instance else [2, 3]
        assert all(list(g.gpus) == want for g in config(tmp_path, stage).instance_group), stage


def test_cpu_profile_is_byte_identical(tmp_path):
    write_profile_repository("cpu", None, tmp_path)
    for stage in STAGES:
        comparison = filecmp.dircmp(STAGE_REPOSITORY / stage, tmp_path / stage)
        assert not comparison.diff_files and not comparison.left_only, stage
        for path in (STAGE_REPOSITORY / stage).rglob("*"):
            if path.is_file():
                copy = tmp_path / stage / path.relative_to(STAGE_REPOSITORY / stage)
                assert copy.read_bytes() == path.read_bytes(), path


@pytest.mark.parametrize("stage", STAGES)
def test_the_layout_round_trips_every_committed_config(stage):
    committed = config(STAGE_REPOSITORY, stage)
    text = config_text(committed)
    reread = mc.ModelConfig()
    text_format.Parse(text, reread)
    assert reread == committed


def test_errors_name_what_to_change(tmp_path):
    with pytest.raises(ProfileError, match="profiles: cpu, gpu"):
        write_profile_repository("tpu", None, tmp_path)
    with pytest.raises(ProfileError, match="no stage"):
        write_profile_repository("gpu", ["bogus"], tmp_path)
    with pytest.raises(ProfileError, match="--gpu-memory-gib"):
        check_engines(ENGINES * 2)
    check_engines(ENGINES * 2, gpu_memory_gib=160)      # a 160 GiB card holds them twice
    source = tmp_path / "source"
    shutil.copytree(STAGE_REPOSITORY / "cosyvoice3_talker", source / "cosyvoice3_talker")
    sizing = source / "cosyvoice3_talker" / GPU_SIZING_FILE
    sizing.write_text(json.dumps({"device": "gpu", "why": "a talker without its engine"}))
    with pytest.raises(ProfileError, match=f"{sizing}.*declare its \"engine\""):
        write_profile_repository("gpu", None, tmp_path / "out", source=source)
    sizing.write_text(json.dumps({"device": "tpu", "why": "?"}))
    with pytest.raises(ProfileError, match=f"{sizing}: an object with device"):
        write_profile_repository("gpu", None, tmp_path / "out", source=source)
    sizing.unlink()
    with pytest.raises(ProfileError, match=f"{sizing}: every stage declares"):
        write_profile_repository("gpu", None, tmp_path / "out", source=source)


def test_an_extra_checkpoint_copies_the_profiled_stages(gpu_repository, tmp_path):
    family = FAMILIES["qwen3_tts"]
    write_served_model("qwen3_tts-base", family, Path("/models/base"), tmp_path, source=gpu_repository)
    talker = config(tmp_path, "qwen3_tts-base_talker")
    assert {g.kind for g in talker.instance_group} == {GPU}
    assert talker.parameters["checkpoint"].string_value == "/models/base"
    codec = config(tmp_path, "qwen3_tts-base_code2wav")
    assert codec.parameters["precision"].string_value == "fp16"
    assert config(tmp_path, "qwen3_tts-base").platform == "ensemble"


def test_launcher_takes_profile_gpus_and_gpu_memory():
    args = parse_args(["--profile", "gpu", "--gpus", "0,1", "--gpu-memory-gib", "141"])
    assert args.profile == "gpu" and args.gpus == [0, 1] and args.gpu_memory_gib == 141
    assert parse_args([]).profile in profiles.PROFILES
    with pytest.raises(SystemExit):
        parse_args(["--profile", "tpu"])


def test_launcher_writes_only_the_served_stages_and_the_cancel_model():
    out = profile_repository("gpu", ["piper"], [0])
    try:
        assert sorted(p.name for p in out.iterdir()) == sorted(
            [*FAMILIES["piper"].stages, "tritontts_cancel"])
    finally:
        shutil.rmtree(out)
    assert profile_repository("cpu", ["piper"], [0]) is None


def test_launcher_refuses_engines_over_the_card_naming_them_and_leaves_no_folder():
    import glob
    import tempfile

    from frontend.__main__ import LaunchError

    pattern = str(Path(tempfile.gettempdir()) / "tritontts-gpu-*")
    before = set(glob.glob(pattern))
    with pytest.raises(LaunchError, match="--profile gpu: the vLLM engines cosyvoice3_talker, qwen3_tts_talker"):
        profile_repository("gpu", ["cosyvoice3", "qwen3_tts"], [0], gpu_memory_gib=5)
    assert set(glob.glob(pattern)) == before
