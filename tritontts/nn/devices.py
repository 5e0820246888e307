"""Device choices shared by every stage, without torch: Piper's stages run on onnxruntime
alone, and a server of the default voice installs no torch (scripts/setup.sh --minimal)."""
from __future__ import annotations


def onnxruntime_providers(device: str) -> list:
    """onnxruntime's providers for a stage instance's device ("cpu" or "cuda:N"): CUDA on
    that GPU (CPU for any node CUDA lacks) or the CPU alone. A GPU instance without
    onnxruntime-gpu is an error that says so, not a silent CPU run."""
    import onnxruntime as ort

    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError("the CUDA execution provider is not in this onnxruntime "
                           "(install onnxruntime-gpu)")
    index = int(device.partition(":")[2] or 0)
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
