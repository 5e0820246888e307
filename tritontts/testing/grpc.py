"""One decoupled request straight to a family's ensemble over tritonclient gRPC streaming."""
from __future__ import annotations

import json
import queue

import numpy as np


def ensemble_inputs(text: str, voice: str = "", params: dict | None = None) -> list:
    """The ensemble's three BYTES inputs for one request (tritontts.serving.stage conventions)."""
    import tritonclient.grpc as grpcclient

    def tensor(name, value):
        t = grpcclient.InferInput(name, [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[value.encode()]], dtype=np.object_))
        return t

    return [tensor("text", text), tensor("voice", voice), tensor("params", json.dumps(params or {}))]


def stream_model(url: str, model: str, text: str, voice: str = "", params: dict | None = None,
                 timeout: float = 120.0):
    """Returns (the responses that carry audio, in order; the error or None)."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, ensemble_inputs(text, voice, params),
                                  enable_empty_final_response=True)
        chunks = []
        while True:
            result, error = results.get(timeout=timeout)
            if error is not None:
                return chunks, error
            response = result.get_response()
            if result.as_numpy("audio") is not None:
                chunks.append(result)
            if response.parameters["triton_final_response"].bool_param:
                return chunks, None
    finally:
        client.stop_stream()
        client.close()
