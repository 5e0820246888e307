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
    ended = False       # the server ended the stream (its final response, or an error)
    try:
        client.async_stream_infer(model, ensemble_inputs(text, voice, params),
                                  enable_empty_final_response=True)
        chunks = []
        while True:
            try:
                result, error = results.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"{model}: no response from the server for {timeout} s "
                                   f"({len(chunks)} audio responses before)") from None
            if error is not None:
                ended = True
                return chunks, error
            response = result.get_response()
            if result.as_numpy("audio") is not None:
                chunks.append(result)
            if response.parameters["triton_final_response"].bool_param:
                ended = True
                return chunks, None
    finally:
        # A stream the server did not end is cancelled: closing it politely waits for an
        # end that a wedged server never sends (a CI run once waited out pytest's timeout).
        client.stop_stream(cancel_requests=not ended)
        client.close()
