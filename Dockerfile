# syntax=docker/dockerfile:1
# tritontts on NVIDIA GPUs: the `gpu` extra of pyproject.toml, the stages on the gpu profile
# (tritontts/deploy/profiles.py), the OpenAI front on :8091. How to use it: docs/gpu.md.
#
# NEVER BUILT OR RUN: this file was written on a machine with no docker, no GPU and no
# internet. The package pins were checked against the wheels' metadata; the image, the
# apt packages of the base image, and the gpu profile on a real card were not.
#
#   docker build -t tritontts:gpu .
#   docker run --gpus all --shm-size 2g -p 8091:8091 tritontts:gpu
#   docker run --gpus all --shm-size 2g -p 8091:8091 -v /models:/models tritontts:gpu \
#       python -m frontend --profile gpu --host 0.0.0.0 --families cosyvoice3 \
#       --checkpoint cosyvoice3=/models/Fun-CosyVoice3-0.5B-2512
#
# Triton 24.10 is tritonserver 2.51, the release the CPU path runs (the binary inside the
# nvidia-pytriton 0.7.0 wheel). Its system Python is 3.10, but vllm 0.32 and
# onnxruntime-gpu 1.31 need 3.11 or later: the project lives in a Python 3.11 venv, and the
# Python backend runs that interpreter through the 3.11 stub of the same Triton release,
# which the nvidia-pytriton wheel ships (docs/triton-on-cpu.md has why each step matters).
FROM nvcr.io/nvidia/tritonserver:24.10-py3

ENV DEBIAN_FRONTEND=noninteractive
# libpython3.11: the backend stub links it; libb64-0d: perf_analyzer (as scripts/setup.sh).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev libpython3.11 libb64-0d \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN python3.11 -m venv $VIRTUAL_ENV \
    && pip install --no-cache-dir -U pip setuptools wheel

WORKDIR /opt/tritontts

# The dependencies first, in a layer of their own: they are gigabytes (torch, vLLM, the
# CUDA 13 libraries) and change far less often than the code. The two placeholder
# packages only let pip read pyproject.toml; the real ones come with the code below.
# TensorRT's library wheel is fetched from NVIDIA's index (its PyPI sdist points there).
COPY pyproject.toml README.md ./
RUN mkdir -p tritontts frontend && touch tritontts/__init__.py frontend/__init__.py \
    && pip install --no-cache-dir --extra-index-url https://pypi.nvidia.com '.[gpu]' \
    && pip uninstall -y tritontts \
    && rm -rf tritontts frontend build
# Same fixes as scripts/setup.sh: vLLM's torchvision/torchaudio/torchcodec builds break
# imports beside torch 2.13, and the Triton stub corrupts input tensors with numpy 2.
RUN (pip uninstall -y torchvision torchaudio torchcodec || true) \
    && pip install --no-cache-dir "numpy<2" "ml_dtypes<=0.5.4"
# piper-tts pulls in onnxruntime (CPU), which installs the same `onnxruntime` module as
# onnxruntime-gpu: removing it deletes files both share, so the GPU build is reinstalled.
RUN pip uninstall -y onnxruntime \
    && pip install --no-cache-dir --force-reinstall --no-deps \
        "onnxruntime-gpu==$(pip show onnxruntime-gpu | sed -n 's/^Version: //p')"
# tritonserver 2.51 and one Python backend stub per Python version; its own pins are not
# needed to run them (as scripts/setup.sh).
RUN pip install --no-cache-dir --no-deps nvidia-pytriton==0.7.0

COPY . .
# Editable, as on the CPU path: the launcher finds model_repository/ and ensembles/ beside
# the package (tritontts/deploy/repository.py REPO_ROOT).
RUN pip install --no-cache-dir --no-deps -e . \
    && python - <<'PY'
import numpy, onnxruntime, tensorrt, torch
from tritontts.deploy.tritonserver import prepare_python_backend
prepare_python_backend()     # the launcher's tritonserver: stub and tritontts backend in place
assert torch.version.cuda and torch.version.cuda.startswith("13"), f"torch {torch.__version__} is not the CUDA 13 build"
assert "CUDAExecutionProvider" in onnxruntime.get_available_providers(), "onnxruntime is not onnxruntime-gpu"
assert numpy.__version__ < "2", f"numpy {numpy.__version__}: the Triton stub needs numpy<2"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), onnxruntime {onnxruntime.__version__}, "
      f"TensorRT {tensorrt.__version__}, numpy {numpy.__version__}")
PY

# The image's own tritonserver can serve our stages too (tritonserver --model-repository
# DIR after `python -m tritontts.deploy.profiles gpu --out DIR`): the same registration the
# launcher makes in the wheel's backend directory, made in /opt/tritonserver. The stub is
# the wheel's 3.11 build of this Triton release; it finds its libcudart in the wheel's
# library folder (whose file names are hashed, so it cannot shadow system libraries).
RUN SITE=$(python -c 'import site; print(site.getsitepackages()[0])') \
    && cp "$SITE/pytriton/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub" \
          /opt/tritonserver/backends/python/triton_python_backend_stub \
    && chmod 755 /opt/tritonserver/backends/python/triton_python_backend_stub \
    && ln -sfn /opt/tritontts/tritontts/serving/triton_backend /opt/tritonserver/backends/tritontts
ENV LD_LIBRARY_PATH=${LD_LIBRARY_PATH}:/opt/venv/lib/python3.11/site-packages/nvidia_pytriton.libs
# The stub's embedded interpreter ignores PYTHONPATH; the backend's model.py reads this.
ENV TRITONTTS_PYTHONPATH=/opt/tritontts:/opt/venv/lib/python3.11/site-packages

# Converted talkers, ONNX exports and TensorRT engines (mount a volume to keep them across
# containers); uploaded voices.
ENV TRITONTTS_CACHE=/var/cache/tritontts \
    TRITONTTS_VOICES_DIR=/var/lib/tritontts/voices \
    TRITONTTS_PROFILE=gpu

# Optional: TensorRT engines built into the image. Engines are specific to the GPU model
# and the TensorRT version, so this only pays off when the image runs on the GPU it was
# built on; it needs that GPU during the build (Docker's default runtime set to nvidia)
# and each checkpoint inside the build context. For each FAMILY=PATH in ENGINES it runs
#   python build/export.py --family FAMILY --checkpoint PATH --tensorrt --fp16
# (fp16: the gpu profile's `precision`, so the stages find these engines rather than
# build others), e.g. --build-arg ENGINES="cosyvoice3=checkpoints/Fun-CosyVoice3-0.5B-2512".
# Without it, a stage builds what it lacks on its first start, into $TRITONTTS_CACHE/engines.
ARG ENGINES=""
RUN for spec in $ENGINES; do \
        python build/export.py --family "${spec%%=*}" --checkpoint "${spec#*=}" --tensorrt --fp16 \
        || exit 1; \
    done

EXPOSE 8091 8000 8001 8002
# Talkers load for minutes on a first start (weights, CUDA graphs, engines).
HEALTHCHECK --start-period=900s --interval=30s --timeout=5s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://localhost:8091/health', timeout=4)"
CMD ["python", "-m", "frontend", "--profile", "gpu", "--host", "0.0.0.0"]
