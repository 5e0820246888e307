"""A stand-in for `triton_python_backend_utils` (which only exists inside the Triton stub),
so the tritontts backend (tritontts/serving/triton_stage.py) and the stages it hosts can be unit
tested on CPU, as tensorrtllm_backend's all_models tests do with a mocked pb_utils.

    with fake_pb_utils():
        from tritontts.serving.triton_stage import TritonPythonModel
        model = TritonPythonModel(); model.initialize(model_args(config_path))
        senders = [FakeRequest({...}) for ...]; model.execute(requests)
"""
from __future__ import annotations

import contextlib
import json
import sys
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

_NUMPY_TYPES = {"TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
                "TYPE_FP32": np.float32, "TYPE_FP64": np.float64, "TYPE_STRING": np.object_,
                "BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64, "FP32": np.float32,
                "FP64": np.float64, "BYTES": np.object_}


class Tensor:
    def __init__(self, name: str, array: np.ndarray):
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 0):
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class InferenceResponse:
    def __init__(self, output_tensors=None, error: TritonError | None = None):
        self.output_tensors = list(output_tensors or [])
        self._error = error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def output(self, name: str) -> np.ndarray:
        return next(t.as_numpy() for t in self.output_tensors if t.name() == name)


def get_input_tensor_by_name(request, name: str) -> Tensor | None:
    return request.tensors.get(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors if t.name() == name), None)


def triton_string_to_numpy(data_type: str):
    return _NUMPY_TYPES[data_type]


def using_decoupled_model_transaction_policy(config: dict) -> bool:
    return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


class FakeSender:
    """Records what a decoupled model sends, and from which thread."""

    def __init__(self):
        self.sent: list[tuple[InferenceResponse | None, int, str]] = []
        self.done = threading.Event()

    def send(self, response=None, flags: int = 0) -> None:
        if self.done.is_set():   # as Triton's: nothing may follow the final response
            raise RuntimeError("Unable to send response. Response sender has been closed.")
        self.sent.append((response, flags, threading.current_thread().name))
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.done.set()

    @property
    def responses(self) -> list[InferenceResponse]:
        return [r for r, _, _ in self.sent if r is not None]

    @property
    def flags(self) -> list[int]:
        return [f for _, f, _ in self.sent]


class FakeRequest:
    """A request with batch-1 inputs: values are wrapped to [1, ...] like a client's."""

    def __init__(self, inputs: dict[str, Any], cancelled: bool = False,
                 requested: list[str] | None = None, request_id: str = ""):
        self.id = request_id
        self.requested = requested or []   # empty: whatever the model's config declares
        self.tensors = {}
        for name, value in inputs.items():
            array = np.asarray([value.encode()] if isinstance(value, str) else value)
            if array.dtype.kind == "U":
                array = np.char.encode(array).astype(np.object_)
            if array.ndim == 0:
                array = array.reshape(1)
            self.tensors[name] = Tensor(name, array[None])
        self.cancelled = cancelled
        self.sender = FakeSender()

    def is_cancelled(self) -> bool:
        return self.cancelled

    def request_id(self) -> str:
        return self.id

    def requested_output_names(self) -> list[str]:
        return list(self.requested)

    def get_response_sender(self) -> FakeSender:
        return self.sender


def _module() -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")
    for name in ("Tensor", "TritonError", "InferenceResponse", "get_input_tensor_by_name",
                 "get_output_tensor_by_name",
                 "triton_string_to_numpy", "using_decoupled_model_transaction_policy",
                 "TRITONSERVER_RESPONSE_COMPLETE_FINAL"):
        setattr(module, name, globals()[name])
    return module


@contextlib.contextmanager
def fake_pb_utils():
    """Install the stand-in as `triton_python_backend_utils` (and forget tritontts'
    backend module after, so it re-imports against whatever is installed next)."""
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = _module()
    try:
        yield sys.modules["triton_python_backend_utils"]
    finally:
        sys.modules.pop("tritontts.serving.triton_stage", None)
        if saved is None:
            sys.modules.pop("triton_python_backend_utils", None)
        else:
            sys.modules["triton_python_backend_utils"] = saved


def model_args(config_pbtxt: Path, **parameter_overrides: str) -> dict[str, str]:
    """The `args` Triton passes to initialize(), from a config.pbtxt (as JSON, like Triton)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse(Path(config_pbtxt).read_text(), mc.ModelConfig())
    as_json = json_format.MessageToDict(config, preserving_proto_field_name=True)
    for key, value in parameter_overrides.items():
        as_json.setdefault("parameters", {})[key] = {"string_value": value}
    return {"model_config": json.dumps(as_json), "model_repository": str(Path(config_pbtxt).parent),
            "model_version": "1", "model_name": config.name, "model_instance_kind": "CPU"}

