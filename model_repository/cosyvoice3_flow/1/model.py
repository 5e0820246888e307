"""cosyvoice3_flow: speech tokens so far -> mel of all of them, per chunk Triton batched."""
# The stub's interpreter runs isolated (ignores PYTHONPATH): put this environment's
# paths first, before numpy is imported (launcher: tritontts/tritonserver.py).
import os, sys  # noqa: E401
sys.path[:0] = [p for p in os.environ.get("TRITONTTS_PYTHONPATH", "").split(os.pathsep) if p]
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from tritontts import stage
from tritontts.cosyvoice3.family import FlowRunner, checkpoint_from_environment
from tritontts.triton_utils import cancelled_response, error_response, input_array, input_scalar, model_parameters, tensor


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(int(model_parameters(args).get("torch_threads", "1")))
        self.runner = FlowRunner(checkpoint_from_environment())

    def execute(self, requests):
        return [self._mel(request) for request in requests]

    def _mel(self, request):
        if request.is_cancelled():  # the client went away: skip the work
            return cancelled_response()
        try:
            finalize = bool(input_scalar(request, "finalize"))
            mel = self.runner.mel(input_array(request, "speech_tokens").reshape(-1),
                                  input_array(request, "prompt_tokens").reshape(-1),
                                  input_array(request, "prompt_mel")[0],
                                  input_array(request, "embedding").reshape(-1), finalize)
            return pb_utils.InferenceResponse(output_tensors=[
                tensor("mel", mel, np.float32),
                tensor("token_offset", [input_scalar(request, "token_offset")], np.int32),
                tensor("finalize", [finalize], np.bool_),
                tensor(stage.STREAM_ID, [input_scalar(request, stage.STREAM_ID)], np.int64),
                tensor(stage.CHUNK_INDEX, [input_scalar(request, stage.CHUNK_INDEX)], np.int32),
                tensor(stage.IS_FINAL, [bool(input_scalar(request, stage.IS_FINAL))], np.bool_),
            ])
        except Exception as exc:
            return error_response(exc)
