"""Entry point of the `tritontts` Python-based Triton backend (as Triton's vLLM backend is
packaged): tritonserver runs this file for every model whose config.pbtxt says
`backend: "tritontts"`; the stage class it hosts is the config's `stage` parameter.
`tritontts.deploy.tritonserver.prepare_python_backend()` links this folder into the backend
directory as `tritontts/`.

The stub's embedded interpreter runs isolated (it ignores PYTHONPATH): put this
environment's paths first, before numpy is imported (see docs/triton-on-cpu.md).
"""
import faulthandler
import os
import sys

# A stage that dies in native code (a segfault in a kernel, an abort) leaves its stack in
# the server log, beside the launcher's line naming the stage and the signal.
faulthandler.enable()
sys.path[:0] = [p for p in os.environ.get("TRITONTTS_PYTHONPATH", "").split(os.pathsep) if p]

from tritontts.serving.triton_stage import TritonPythonModel  # noqa: E402,F401
