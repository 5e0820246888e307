"""cosyvoice3_frontend: text and reference recording -> everything the talker conditions on."""
# The stub's interpreter runs isolated (ignores PYTHONPATH): put this environment's
# paths first, before numpy is imported (launcher: tritontts/tritonserver.py).
import os, sys  # noqa: E401
sys.path[:0] = [p for p in os.environ.get("TRITONTTS_PYTHONPATH", "").split(os.pathsep) if p]
import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts import stage
from tritontts.cosyvoice3.family import CosyVoice3Frontend
from tritontts.triton_utils import error_response, input_scalar, tensor


class TritonPythonModel:
    def initialize(self, args):
        self.frontend = CosyVoice3Frontend.from_environment()

    def execute(self, requests):
        return [self._prepare(request) for request in requests]

    def _prepare(self, request):
        try:
            job = self.frontend.prepare(input_scalar(request, stage.TEXT, ""),
                                        input_scalar(request, stage.VOICE, ""),
                                        stage.parse_params(input_scalar(request, stage.PARAMS, "")))
            return pb_utils.InferenceResponse(output_tensors=[
                tensor("prompt_ids", [i for seg in job.segments for i in seg.prompt_ids], np.int64),
                tensor("segment_lengths", [len(seg.prompt_ids) for seg in job.segments], np.int32),
                tensor("min_tokens", [seg.min_tokens for seg in job.segments], np.int32),
                tensor("max_tokens", [seg.max_tokens for seg in job.segments], np.int32),
                tensor("seed", [job.seed], np.int64),
                tensor("prompt_tokens", job.prompt.speech_tokens, np.int32),
                tensor("prompt_mel", job.prompt.mel, np.float32),
                tensor("embedding", job.prompt.embedding, np.float32),
                tensor(stage.STREAM_ID, [job.stream_id], np.int64),
            ])
        except Exception as exc:
            return error_response(exc)
