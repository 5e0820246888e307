"""`tritontts serve MODEL ...` without starting anything: MODEL resolved (a local folder, a
Hugging Face repo id from an offline HF cache written here in the cache's own layout), the
family told from the checkpoint's files, vLLM-Omni's flags translated into the launcher's,
and the migration table in docs/api.md generated from the one declaration. A served start
from an HF cache: tests/server/test_tritontts_serve.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from frontend.serve import translate
from tritontts.families import FAMILIES
from tritontts.launch import vllm_omni
from tritontts.launch.resolve import ResolveError, detect, resolve
from tritontts.testing.hub import hf_cache

VARIANTS = [(name, {}) for name, f in FAMILIES.items() if f.layout is not None] + [
    ("qwen3_tts", {"kind": "voice_design"}), ("qwen3_tts", {"kind": "base"})]


@pytest.mark.parametrize("name, options", VARIANTS, ids=[f"{n}-{o.get('kind', 'default')}" for n, o in VARIANTS])
def test_every_familys_checkpoint_is_told_by_its_files_alone_and_its_variant_named(random_checkpoints, name, options):
    path = random_checkpoints.get(name, **options)
    assert detect(path) is FAMILIES[name]
    resolved = resolve(str(path))
    assert resolved.family is FAMILIES[name] and resolved.path == path.resolve()
    if name == "qwen3_tts":
        assert resolved.variant == {"voice_design": "VoiceDesign", "base": "Base"}.get(options.get("kind"), "CustomVoice")
    if name == "auk":
        assert resolved.variant == "AuK"


def test_gepard_is_told_by_its_layout_though_its_config_says_qwen3_5_text(random_checkpoints, tmp_path):
    gepard = random_checkpoints["gepard"]
    assert detect(gepard).name == "gepard"
    bare = tmp_path / "bare"
    shutil.copytree(gepard, bare, symlinks=True)
    (bare / "gepard_config.json").unlink()          # a plain Qwen3.5 text model: no family's
    with pytest.raises(ResolveError, match="model_type 'qwen3_5_text'"):
        detect(bare)


def test_an_unknown_checkpoint_is_one_line_saying_what_was_found_and_what_is_known(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ResolveError) as failed:
        resolve(str(tmp_path))
    message = str(failed.value)
    assert "\n" not in message and "config.json, model.safetensors" in message and "'llama'" in message
    assert all(f"{name}:" in message for name, f in FAMILIES.items() if f.layout is not None)


def test_a_repo_id_is_the_snapshot_refs_main_names_in_the_hf_cache(random_checkpoints, tmp_path, monkeypatch):
    snapshot = hf_cache(tmp_path / "hub", "Qwen/Qwen3-TTS-12Hz-1.7B-Base", random_checkpoints.get("qwen3_tts", kind="base"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved = resolve("Qwen/Qwen3-TTS-12Hz-1.7B-Base")
    assert resolved.path == snapshot and resolved.family.name == "qwen3_tts" and resolved.variant == "Base"


def test_a_repo_id_missing_offline_is_one_line_naming_it_the_cache_and_the_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ResolveError) as failed:
        resolve("openbmb/VoxCPM2")
    message = str(failed.value)
    assert "\n" not in message and message.startswith("openbmb/VoxCPM2: not in the Hugging Face cache")
    assert str(tmp_path / "hub") in message and "huggingface-cli download openbmb/VoxCPM2" in message


def test_vllm_omnis_flags_become_the_launchers_and_the_ones_without_effect_say_why(random_checkpoints, tmp_path):
    base = random_checkpoints.get("qwen3_tts", kind="base")
    custom = random_checkpoints["qwen3_tts"]
    argv, said = translate([str(custom), "--omni", "--trust-remote-code", "--port", "8000",
                            "--stage-init-timeout", "300", "--gpu-memory-utilization", "0.9",
                            "--stage-0-max-num-seqs", "2", str(base), "--stage-0-max-model-len=512",
                            "--word-aligner", "--served-model-name", "tts"], environ={})
    assert argv[:2] == ["--families", "qwen3_tts"]
    assert f"--checkpoint qwen3_tts={custom.resolve()} --served-model-name qwen3_tts={custom}" in " ".join(argv)
    assert f"--checkpoint qwen3_tts-2={base.resolve()} --served-model-name qwen3_tts-2={base}" in " ".join(argv)
    # Each --stage-N- applies to the MODEL before it, on its own served stage.
    assert "--engine-arg qwen3_tts_talker.max_num_seqs=2" in " ".join(argv)
    assert "--engine-arg qwen3_tts-2_talker.max_model_len=512" in " ".join(argv)
    assert "--served-model-name qwen3_tts=tts" in " ".join(argv)
    assert "--startup-timeout 300" in " ".join(argv) and "--word-aligner" in argv
    # The front on 8000: tritonserver moves to 8100-8102.
    assert "--port 8000" in " ".join(argv) and "--http-port 8100 --grpc-port 8101 --metrics-port 8102" in " ".join(argv)
    assert any(line.startswith("--omni: accepted;") for line in said)
    assert any(line.startswith("--trust-remote-code: accepted; nothing of a checkpoint is executed") for line in said)
    assert any(line.startswith("--gpu-memory-utilization: accepted;") for line in said)
    assert f"{base}: qwen3_tts (Base), from {base.resolve()}, served as model '{base}'" in said


def test_the_launcher_takes_the_translated_argv_including_a_second_checkpoints_engine_arg(random_checkpoints):
    from frontend.__main__ import parse_args

    base = random_checkpoints.get("qwen3_tts", kind="base")
    argv, _ = translate([str(random_checkpoints["qwen3_tts"]), str(base), "--stage-0-max-num-seqs", "2"], environ={})
    args = parse_args(argv)
    assert ("qwen3_tts-2_talker", "max_num_seqs", 2) in args.engine_arg
    assert args.port == 8000 and (args.http_port, args.grpc_port, args.metrics_port) == (8100, 8101, 8102)


@pytest.mark.parametrize("args, says", [
    (["--deploy-config", "/no/such.yaml"], "--deploy-config /no/such.yaml: not readable"),
    (["--api-server-count", "2"], "--api-server-count 2: N > 1 not served yet"),
    (["--no-such-flag"], "--no-such-flag: neither a vLLM-Omni serve flag"),
    (["--stage-1-max-num-seqs", "2"], "--stage-1-max-num-seqs: qwen3_tts) has stages 0 qwen3_tts_talker, "
                                       "1 qwen3_tts_code2wav; only 0 run a vLLM engine"),
], ids=["deploy_config", "api_server_count", "unknown", "stage_without_engine"])
def test_a_flag_that_cannot_be_honoured_is_refused_in_one_line_naming_it(random_checkpoints, args, says):
    from tritontts.launch.vllm_omni import OmniError

    with pytest.raises(OmniError) as failed:
        translate([str(random_checkpoints["qwen3_tts"]), *args], environ={})
    assert says in str(failed.value).replace(f"{random_checkpoints['qwen3_tts']} (", "")


def test_piper_is_served_by_its_name_without_a_checkpoint():
    argv, said = translate(["piper"], environ={})
    assert argv[:2] == ["--families", "piper"] and "--checkpoint" not in argv


def test_every_vllm_omni_option_is_in_the_generated_migration_table_of_docs_api_md():
    text = vllm_omni.API_DOC.read_text()
    assert vllm_omni.with_table(text) == text, "run python -m tritontts.launch.vllm_omni"
    for option in (*vllm_omni.FLAGS, *vllm_omni.ENV):
        assert f"`{option.name}" in text and option.kind in (vllm_omni.MAPPED, vllm_omni.NO_EFFECT, vllm_omni.REFUSED)


COSYVOICE3_DEPLOY = """\
# written in the shape of vLLM-Omni's vllm_omni/deploy/cosyvoice3.yaml
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

    deploy = tmp_path / "cosyvoice3.yaml"
    deploy.write_text(COSYVOICE3_DEPLOY)
    argv, said = translate([str(random_checkpoints["cosyvoice3"]), "--deploy-config", str(deploy)], environ={})
    joined = " ".join(argv)
    assert "--engine-arg cosyvoice3_talker.max_num_seqs=8" in joined
    assert "--engine-arg cosyvoice3_talker.enforce_eager=false" in joined
    assert "--engine-arg cosyvoice3_talker.enable_prefix_caching=false" in joined and "--dtype float32" in joined
    args = parse_args(argv)       # the launcher takes every one of them
    assert ("cosyvoice3_talker", "max_num_seqs", 8) in args.engine_arg and args.dtype == "float32"
    assert any(line.startswith("--deploy-config async_chunk: accepted;") for line in said)
    assert any(line.startswith("--deploy-config stages[0].gpu_memory_utilization: accepted;") for line in said)
    assert any(line.startswith("--deploy-config stages[0].default_sampling_params: accepted;") for line in said)
    # Stage 1 is vLLM-Omni's code2wav engine; here a Triton-batched flow: logged, not applied.
    assert any(line.startswith("--deploy-config stages[1].max_num_seqs: accepted; no effect here") for line in said)
    assert f"warning: --deploy-config {deploy}: unknown key no_such_key: ignored" in said


def test_a_deploy_yaml_that_is_not_yaml_is_refused_in_one_line(random_checkpoints, tmp_path):
    from tritontts.launch.vllm_omni import OmniError

    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [\n  - stage_id: 0\n")
    with pytest.raises(OmniError) as failed:
        translate([str(random_checkpoints["cosyvoice3"]), "--deploy-config", str(bad)], environ={})
    assert "\n" not in str(failed.value) and str(failed.value).startswith(f"--deploy-config {bad}: not YAML")
