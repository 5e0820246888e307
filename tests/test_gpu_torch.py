"""The GPU check's PyTorch tier (scripts/gpu_check.py --tier torch, tritontts.benchmark.gpu_torch):
its dry run on this CPU with only what the borrowed GPU images hold, and its verdicts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tritontts.benchmark import gpu_torch
from tritontts.families import FAMILIES
from tritontts.nn.runtime import Axis, Graph, TensorSpec

REPO = Path(__file__).resolve().parent.parent
NUMPY2 = REPO / ".venv" / "numpy2"

# The research GPU image's Python packages (/work/.library/device/KINDS.md, read 2026-11-17):
# torch 2.11 (CUDA 13), transformers 5.17, onnx, onnxruntime (CPU build), numpy 2.5; no vLLM,
# TensorRT, tritonserver, tritonclient, fastapi, soundfile, librosa.
IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml
regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp
""".split()
# Where a package's import name is not its name with '-' as '_'.
IMPORT_NAMES = {"attrs": "attr", "pyyaml": "yaml", "pillow": "PIL", "protobuf": "google",
                "scikit-learn": "sklearn", "scikit-image": "skimage", "opencv-python-headless": "cv2",
                "python-dateutil": "dateutil", "nvidia-ml-py": "pynvml", "py-cpuinfo": "cpuinfo",
                "cuda-bindings": "cuda", "setuptools": "pkg_resources", "tensorboard-data-server": "tensorboard_data_server"}
# Top-level modules the torch and setuptools wheels carry beside their own; and
# huggingface_hub 2.x here needs httpx2 / httpcore2 / truststore; the image's 1.33 uses httpx.
EXTRA_MODULES = {"torchgen", "functorch", "attrs", "setuptools", "tritontts", "sitecustomize",
                 "httpx2", "httpcore2", "truststore", "cython_runtime"}
IMAGE_MODULES = {IMPORT_NAMES.get(p, p.replace("-", "_")) for p in IMAGE_PACKAGES} | EXTRA_MODULES



def image_site(venv_site: Path, out: Path) -> Path:
    """A folder of links to the venv's packages that the image has too (modules and their
    dist-info, so version checks read them), numpy left out for the numpy 2 beside it. With
    `python -S` and this on the path, what the image lacks is simply not there."""
    out.mkdir()
    for entry in venv_site.iterdir():
        if entry.name.endswith(".dist-info"):
            project = entry.name.removesuffix(".dist-info").rsplit("-", 1)[0].lower().replace("_", "-")
            keep = project in IMAGE_PACKAGES or project.replace("-", "_") in EXTRA_MODULES
        else:
            top = entry.name.split(".")[0]
            keep = top in IMAGE_MODULES or (top.startswith("_") and not entry.name.endswith(".pth"))
        if keep and not entry.name.startswith("numpy"):
            (out / entry.name).symlink_to(entry)
    return out


def test_every_family_but_piper_declares_the_networks_it_runs_in_pytorch():
    # Piper's stages run its VITS voice on onnxruntime only: no PyTorch network.
    assert {name for name, f in FAMILIES.items() if f.torch_networks is None} == {"piper"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    if not (NUMPY2 / "numpy").is_dir():
        pytest.fail(f"{NUMPY2} is missing: scripts/setup.sh puts numpy 2 there; rerun it")
    out = tmp_path_factory.mktemp("gpu-torch")
    site = image_site(Path(torch.__file__).resolve().parent.parent, out / "image-site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(NUMPY2), str(site), str(REPO)])}
    proc = subprocess.run(
        [sys.executable, "-S", "scripts/gpu_check.py", "--tier", "torch", "--cpu-dry-run", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return json.loads((out / "gpu_torch.json").read_text()), (out / "gpu_torch.md").read_text()


def test_dry_run_runs_with_numpy_2_and_imports_only_the_gpu_images_packages(dry_run):
    report, _ = dry_run
    environment = {r["what"]: r["result"] for r in report["environment"]}
    assert environment["numpy"].startswith("2."), environment
    assert environment["vllm"] == "not installed" and environment["tritonserver"].startswith("skipped")
    assert set(report["imported"]) <= IMAGE_MODULES, set(report["imported"]) - IMAGE_MODULES


def test_dry_run_checks_and_times_every_network_of_every_family(dry_run):
    report, text = dry_run
    rows = report["rows"]
    assert not gpu_torch.failed(rows), gpu_torch.failed(rows)
    for name, family in FAMILIES.items():
        if family.torch_networks is None:
            continue
        mine = [r for r in rows if r["family"] == name]
        drift = [r for r in mine if r["step"] == "parity" and r["what"].endswith("bf16 vs fp32")]
        timed = [r for r in mine if r["step"] == "timing" and "fp32_ms" in r]
        assert drift and all(r["result"] == "ok" for r in drift), (name, drift)
        assert len(timed) >= 2, (name, mine)     # batch 1 and 8 (a dry run) of at least one network
        assert any("bf16_ms" in r for r in timed), (name, timed)
    batched = [r for r in rows if r["step"] == "batching"]
    # The dry run measures the first family with batched stages (the code is every family's).
    assert {r["what"].split()[0] for r in batched} == {"cosyvoice3_flow", "cosyvoice3_hift"}, batched
    assert "| parity |" in text and "| timing |" in text


class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x), self.linear(x).argmax(-1)


def graph_of(module: nn.Module) -> Graph:
    return Graph("affine", module, (TensorSpec("x", torch.float32, ("batch", 8)),), ("y", "code"),
                 {"batch": Axis(1, 2, 16)})


def test_fp32_verdict_accepts_equal_runs_and_flags_a_perturbed_weight():
    torch.manual_seed(0)
    module = Affine()
    graph = graph_of(module)
    inputs = graph.example()
    expected = gpu_torch.call(graph, inputs)
    scale = gpu_torch.scale_of(expected)
    assert gpu_torch.fp32_verdict(gpu_torch.compare(gpu_torch.call(graph, inputs), expected), scale) == "ok"
    with torch.no_grad():
        module.linear.weight[0, 0] += 1e-2       # the negative control: a wrong weight
    perturbed = gpu_torch.compare(gpu_torch.call(graph, inputs), expected)
    assert perturbed["max_abs_diff"] > gpu_torch.FP32_TOLERANCE * scale
    assert gpu_torch.fp32_verdict(perturbed, scale) == "MISMATCH"


def test_codes_that_disagree_in_most_places_are_a_mismatch():
    codes = torch.arange(10)
    assert gpu_torch.compare((codes,), (codes,)) == {"codes_agree": 1.0}
    flipped = codes.clone()
    flipped[:5] += 1
    numbers = gpu_torch.compare((flipped,), (codes,))
    assert numbers == {"codes_agree": 0.5} and gpu_torch.fp32_verdict(numbers, 1.0) == "MISMATCH"


def test_cast_runs_in_bf16_inside_and_restores_the_exact_fp32_weights_after():
    torch.manual_seed(0)
    module = Affine()
    graph = graph_of(module)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    inputs = graph.example()
    expected = gpu_torch.call(graph, inputs)
    with gpu_torch.cast(module, torch.bfloat16):
        assert module.linear.weight.dtype == torch.bfloat16
        low = gpu_torch.call(graph, gpu_torch.cast_inputs(inputs, torch.bfloat16))
    assert low[0].dtype == torch.bfloat16 and gpu_torch.compare((low[0].float(),), expected[:1])["max_abs_diff"] > 0
    assert all(torch.equal(before[k], v) and v.dtype == torch.float32 for k, v in module.state_dict().items())
    assert torch.equal(gpu_torch.call(graph, inputs)[0], expected[0])


def test_timing_varies_the_first_inputs_first_axis_over_batches_1_4_8():
    torch.manual_seed(0)
    rows = gpu_torch.timing(graph_of(Affine()), "cpu", repeats=1)
    assert [r["what"] for r in rows] == ["affine {'batch': 1}", "affine {'batch': 4}", "affine {'batch': 8}"]
    assert all(r["fp32_ms"] > 0 and r["bf16_ms"] > 0 for r in rows)


def test_batching_reads_every_stage_configs_parameters_as_read_config_does():
    from tritontts.benchmark.batching import config_parameters
    from tritontts.deploy.repository import STAGE_REPOSITORY, read_config

    configs = sorted(STAGE_REPOSITORY.glob("*/config.pbtxt"))
    assert len(configs) > 20
    for path in configs:
        expected = {k: v.string_value for k, v in read_config(path).parameters.items()}
        assert config_parameters(path) == expected, path
