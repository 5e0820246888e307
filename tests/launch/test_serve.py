"""`tritontts serve MODEL ...` without starting anything: MODEL resolved (a local folder, a
Hugging Face repo id from an offline HF cache written here in the cache's own layout), the
family told from the checkpoint's files, vLLM-Omni's flags translated into the launcher's,
and the migration table in docs/api.md generated from the one declaration. The families
used are picked from the registry by what they declare (shared tests name none). A served
start from an HF cache: tests/server/test_tritontts_serve.py."""
from __future__ import annotations

import pytest

from frontend.serve import translate
from tritontts.deploy.profiles import engine_settings_path
from tritontts.deploy.repository import STAGE_REPOSITORY, served_model_stage
from tritontts.families import DEFAULT_FAMILY, FAMILIES
from tritontts.launch import vllm_omni
from tritontts.launch.resolve import ResolveError, detect, resolve
from tritontts.launch.vllm_omni import OmniError, omni_stages
from tritontts.testing.hub import hf_cache

# Every family's default checkpoint and each variant written with checkpoint options.
CASES = [(name, {}) for name, f in FAMILIES.items() if f.layout is not None] + [
    (name, v.options) for name, f in FAMILIES.items() if f.layout is not None
    for v in f.variants.values() if v.options]


def engine(stage: str) -> bool:
    return engine_settings_path(STAGE_REPOSITORY / stage) is not None


# A family with checkpoint kinds (named variants) and released names for them.
KINDS = next(f for f in FAMILIES.values() if f.variant_of is not None and f.released_names
             and any(v.options for v in f.variants.values()))
KIND_OPTIONS = next(v.options for v in KINDS.variants.values() if v.options)
# A family whose vLLM-Omni stage 0 runs an engine here and stage 1 does not.
ENGINE_THEN_STAGE = next(f for f in FAMILIES.values() if f.layout is not None and len(omni_stages(f)) > 1
                         and engine(omni_stages(f)[0]) and not engine(omni_stages(f)[1]))


@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}"
                                                      for n, o in CASES])
def test_every_familys_checkpoint_is_told_by_its_files_alone_and_its_variant_named_as_released(
        random_checkpoints, name, options):
    family = FAMILIES[name]
    path = random_checkpoints.get(name, **options)
    assert detect(path) is family
    resolved = resolve(str(path))
    assert resolved.family is family and resolved.path == path.resolve()
    if family.variant_of is not None:
        assert resolved.variant and any(resolved.variant in released for released in family.released_names)


def test_checkpoint_kinds_of_one_family_are_named_apart(random_checkpoints):
    kinds = {resolve(str(random_checkpoints.get(KINDS.name, **options))).variant
             for options in [{}, *(v.options for v in KINDS.variants.values() if v.options)]}
    assert len(kinds) == 1 + sum(1 for v in KINDS.variants.values() if v.options)


def test_an_unknown_checkpoint_is_one_line_saying_what_was_found_and_what_is_known(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ResolveError) as failed:
        resolve(str(tmp_path))
    message = str(failed.value)
    assert "\n" not in message and "config.json, model.safetensors" in message and "'llama'" in message
    assert all(f"{name}:" in message for name, f in FAMILIES.items() if f.layout is not None)


def test_a_repo_id_is_the_snapshot_refs_main_names_in_the_hf_cache(random_checkpoints, tmp_path, monkeypatch):
    checkpoint = random_checkpoints.get(KINDS.name, **KIND_OPTIONS)
    variant = resolve(str(checkpoint)).variant
    repo_id = next(n for n in KINDS.released_names if n.endswith(variant))
    snapshot = hf_cache(tmp_path / "hub", repo_id, checkpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved = resolve(repo_id)
    assert resolved.path == snapshot and resolved.family is KINDS and resolved.variant == variant


def test_a_repo_id_missing_offline_is_one_line_naming_it_the_cache_and_the_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ResolveError) as failed:
        resolve("some-org/some-model")
    message = str(failed.value)
    assert "\n" not in message and message.startswith("some-org/some-model: not in the Hugging Face cache")
    assert str(tmp_path / "hub") in message and "huggingface-cli download some-org/some-model" in message


def test_vllm_omnis_flags_become_the_launchers_and_the_ones_without_effect_say_why(random_checkpoints):
    name, talker = KINDS.name, omni_stages(KINDS)[0]
    first, second = random_checkpoints[name], random_checkpoints.get(name, **KIND_OPTIONS)
    argv, said = translate([str(first), "--omni", "--trust-remote-code", "--port", "8000",
                            "--stage-init-timeout", "300", "--gpu-memory-utilization", "0.9",
                            "--stage-0-max-num-seqs", "2", str(second), "--stage-0-max-model-len=512",
                            "--word-aligner", "--served-model-name", "tts"], environ={})
    joined = " ".join(argv)
    assert argv[:2] == ["--families", name]
    assert f"--checkpoint {name}={first.resolve()} --served-model-name {name}={first}" in joined
    assert f"--checkpoint {name}-2={second.resolve()} --served-model-name {name}-2={second}" in joined
    # Each --stage-N- applies to the MODEL before it, on that MODEL's own served stage.
    assert f"--engine-arg {talker}.max_num_seqs=2" in joined
    assert f"--engine-arg {served_model_stage(name + '-2', KINDS, talker)}.max_model_len=512" in joined
    assert f"--served-model-name {name}=tts" in joined
    assert "--startup-timeout 300" in joined and "--word-aligner" in argv
    # The front on 8000: tritonserver moves to 8100-8102.
    assert "--port 8000" in joined and "--http-port 8100 --grpc-port 8101 --metrics-port 8102" in joined
    assert any(line.startswith("--omni: accepted;") for line in said)
    assert any(line.startswith("--trust-remote-code: accepted; nothing of a checkpoint is executed") for line in said)
    assert any(line.startswith("--gpu-memory-utilization: accepted;") for line in said)
    variant = resolve(str(second)).variant
    assert f"{second}: {name} ({variant}), from {second.resolve()}, served as model '{second}'" in said


def test_the_launcher_takes_the_translated_argv_including_a_second_checkpoints_engine_arg(random_checkpoints):
    from frontend.__main__ import parse_args

    name = KINDS.name
    second = random_checkpoints.get(name, **KIND_OPTIONS)
    argv, _ = translate([str(random_checkpoints[name]), str(second), "--stage-0-max-num-seqs", "2"], environ={})
    args = parse_args(argv)
    assert (served_model_stage(name + "-2", KINDS, omni_stages(KINDS)[0]), "max_num_seqs", 2) in args.engine_arg
    assert args.port == 8000 and (args.http_port, args.grpc_port, args.metrics_port) == (8100, 8101, 8102)


def stage_without_engine_says() -> str:
    stages = omni_stages(ENGINE_THEN_STAGE)
    return (f"--stage-1-max-num-seqs: {ENGINE_THEN_STAGE.name}) has stages "
            + ", ".join(f"{i} {s}" for i, s in enumerate(stages))
            + f"; only {', '.join(str(i) for i, s in enumerate(stages) if engine(s))} run a vLLM engine")


@pytest.mark.parametrize("args, says", [
    (["--deploy-config", "/no/such.yaml"], "--deploy-config /no/such.yaml: not readable"),
    (["--api-server-count", "2"], "--api-server-count 2: N > 1 not served yet"),
    (["--no-such-flag"], "--no-such-flag: neither a vLLM-Omni serve flag"),
    (["--stage-1-max-num-seqs", "2"], None),
], ids=["deploy_config", "api_server_count", "unknown", "stage_without_engine"])
def test_a_flag_that_cannot_be_honoured_is_refused_in_one_line_naming_it(random_checkpoints, args, says):
    path = random_checkpoints[ENGINE_THEN_STAGE.name]
    with pytest.raises(OmniError) as failed:
        translate([str(path), *args], environ={})
    message = str(failed.value)
    assert "\n" not in message and (says or stage_without_engine_says()) in message.replace(f"{path} (", "")


def test_the_default_voice_is_served_by_its_name_without_a_checkpoint():
    argv, said = translate([DEFAULT_FAMILY], environ={})
    assert argv[:2] == ["--families", DEFAULT_FAMILY] and "--checkpoint" not in argv


def test_every_vllm_omni_option_is_in_the_generated_migration_table_of_docs_api_md():
    text = vllm_omni.API_DOC.read_text()
    assert vllm_omni.with_table(text) == text, "run python -m tritontts.launch.vllm_omni"
    for option in (*vllm_omni.FLAGS, *vllm_omni.ENV):
        assert f"`{option.name}" in text and option.kind in (vllm_omni.MAPPED, vllm_omni.NO_EFFECT, vllm_omni.REFUSED)


DEPLOY = """\
# in the shape of vLLM-Omni's vllm_omni/deploy/*.yaml (a talker, then a code2wav stage)
async_chunk: true
dtype: float32
connectors:
  connector_of_shared_memory:
    name: SharedMemoryConnector
    extra: {codec_chunk_frames: 15, initial_codec_chunk_frames: 5}
stages:
  - stage_id: 0
    max_num_seqs: 8
    gpu_memory_utilization: 0.4
    enforce_eager: false
    enable_prefix_caching: false
    default_sampling_params: {max_tokens: 2048, top_k: 25}
    devices: "0"
  - stage_id: 1
    max_num_seqs: 8
    max_model_len: 32768
    enforce_eager: true
no_such_key: 1
"""


def test_a_deploy_yaml_sets_dtype_and_each_stages_engine_fields_and_says_what_has_no_effect(random_checkpoints,
                                                                                           tmp_path):
    from frontend.__main__ import parse_args

    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(DEPLOY)
    talker = omni_stages(ENGINE_THEN_STAGE)[0]
    argv, said = translate([str(random_checkpoints[ENGINE_THEN_STAGE.name]), "--deploy-config", str(deploy)],
                           environ={})
    joined = " ".join(argv)
    assert f"--engine-arg {talker}.max_num_seqs=8" in joined
    assert f"--engine-arg {talker}.enforce_eager=false" in joined
    assert f"--engine-arg {talker}.enable_prefix_caching=false" in joined and "--dtype float32" in joined
    args = parse_args(argv)       # the launcher takes every one of them
    assert (talker, "max_num_seqs", 8) in args.engine_arg and args.dtype == "float32"
    assert any(line.startswith("--deploy-config stages[0].gpu_memory_utilization: accepted;") for line in said)
    assert any(line.startswith("--deploy-config stages[0].default_sampling_params: accepted;") for line in said)
    # Stage 1 is an engine in vLLM-Omni; here it runs none: logged, not applied.
    assert any(line.startswith("--deploy-config stages[1].max_num_seqs: accepted; no effect here") for line in said)
    assert f"warning: --deploy-config {deploy}: unknown key no_such_key: ignored" in said


def test_a_deploy_yaml_that_is_not_yaml_is_refused_in_one_line(random_checkpoints, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [\n  - stage_id: 0\n")
    with pytest.raises(OmniError) as failed:
        translate([str(random_checkpoints[ENGINE_THEN_STAGE.name]), "--deploy-config", str(bad)], environ={})
    assert "\n" not in str(failed.value) and str(failed.value).startswith(f"--deploy-config {bad}: not YAML")


WHOLE = next(f for f in FAMILIES.values() if f.whole_utterance and f.layout is not None)


@pytest.mark.parametrize("how", ["flag", "environment", "deploy_yaml"])
def test_no_async_chunk_sets_the_whole_utterance_mode_of_a_family_that_has_one(random_checkpoints, tmp_path, how):
    from frontend.__main__ import parse_args

    path = str(random_checkpoints[WHOLE.name])
    if how == "flag":
        argv, _ = translate([path, "--no-async-chunk"], environ={})
    elif how == "environment":
        argv, _ = translate([path], environ={"NO_ASYNC_CHUNK": "1"})
    else:
        deploy = tmp_path / "deploy.yaml"
        deploy.write_text("async_chunk: false\n")
        argv, _ = translate([path, "--deploy-config", str(deploy)], environ={})
    settings = parse_args(argv).stage_setting
    assert settings == [(stage, key, value) for stage, keys in WHOLE.whole_utterance.items()
                        for key, value in keys.items()]


def test_no_async_chunk_for_a_family_without_a_whole_utterance_mode_is_refused_naming_those_that_have_one(
        random_checkpoints):
    other = next(f for f in FAMILIES.values() if not f.whole_utterance and f.layout is not None)
    with pytest.raises(OmniError) as failed:
        translate([str(random_checkpoints[other.name]), "--no-async-chunk"], environ={})
    assert "has no whole-utterance mode here" in str(failed.value) and WHOLE.name in str(failed.value)
