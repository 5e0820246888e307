"""cosyvoice3_hift: mel so far -> the audio of this chunk, per chunk Triton batched."""
# The stub's interpreter runs isolated (ignores PYTHONPATH): put this environment's
# paths first, before numpy is imported (launcher: tritontts/tritonserver.py).
import os, sys  # noqa: E401
sys.path[:0] = [p for p in os.environ.get("TRITONTTS_PYTHONPATH", "").split(os.pathsep) if p]
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from tritontts import stage
from tritontts.cosyvoice3.family import HiftRunner, checkpoint_from_environment
from tritontts.triton_utils import cancelled_response, error_response, input_array, input_scalar, model_parameters, tensor


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(int(model_parameters(args).get("torch_threads", "1")))
        self.runner = HiftRunner(checkpoint_from_environment())

    def execute(self, requests):
        return [self._audio(request) for request in requests]

    def _audio(self, request):
        if request.is_cancelled():  # the client went away: skip the work
            return cancelled_response()
        try:
            audio = self.runner.new_audio(input_array(request, "mel")[0],
                                          int(input_scalar(request, "token_offset")),
                                          bool(input_scalar(request, "finalize")))
            return pb_utils.InferenceResponse(output_tensors=[
                tensor(stage.AUDIO, audio, np.float32),
                tensor(stage.SAMPLE_RATE, [self.runner.sample_rate], np.int32),
                tensor(stage.CHUNK_INDEX, [input_scalar(request, stage.CHUNK_INDEX)], np.int32),
                tensor(stage.IS_FINAL, [bool(input_scalar(request, stage.IS_FINAL))], np.bool_),
            ])
        except Exception as exc:
            return error_response(exc)
