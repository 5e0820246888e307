"""Helpers for the Python-backend model.py files (importable only inside the Triton stub)."""
from __future__ import annotations

import json
import locale
import logging
import os
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from .stage import INVALID_REQUEST_TAG, InvalidRequest

# The stub's embedded interpreter starts in the C locale; torch and espeak data paths
# then fail on non-ASCII. Set it once, before anything heavy is imported.
try:
    locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
except locale.Error:  # pragma: no cover - every supported image has C.UTF-8
    pass

logger = logging.getLogger("tritontts")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(os.environ.get("TRITONTTS_LOG_LEVEL", "INFO"))


def model_parameters(args: dict) -> dict[str, str]:
    """config.pbtxt `parameters` as a plain dict of strings."""
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def input_array(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def input_scalar(request, name: str, default: Any = None) -> Any:
    """First element of an input (batch dims flattened); BYTES decode to str."""
    array = input_array(request, name)
    if array is None or array.size == 0:
        return default
    value = array.reshape(-1)[0]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"{name} must be UTF-8 text") from None
    return value.item() if hasattr(value, "item") else value


def tensor(name: str, value, dtype) -> "pb_utils.Tensor":
    """An output tensor with a leading batch dimension of 1."""
    array = np.asarray(value, dtype=dtype)
    return pb_utils.Tensor(name, array.reshape((1,) + array.shape if array.ndim else (1, 1)))


def error_response(exc: BaseException) -> "pb_utils.InferenceResponse":
    """Request errors carry INVALID_REQUEST_TAG so the front answers 400; the rest are 500."""
    if isinstance(exc, InvalidRequest):
        return pb_utils.InferenceResponse(
            error=pb_utils.TritonError(f"{INVALID_REQUEST_TAG} {exc}", pb_utils.TritonError.INVALID_ARG))
    logger.exception("stage failure", exc_info=exc)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"internal error: {exc!r}"))


def cancelled_response() -> "pb_utils.InferenceResponse":
    """For a request whose client went away: Triton 2.51 cancels an ensemble's later steps
    (not the step already running), so later stages check and skip the work."""
    return pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED))
