"""piper_vits: phoneme ids of one sentence -> audio, for every chunk Triton batched."""
# The stub's interpreter runs isolated (ignores PYTHONPATH): put this environment's
# paths first, before numpy is imported (launcher: tritontts/tritonserver.py).
import os, sys  # noqa: E401
sys.path[:0] = [p for p in os.environ.get("TRITONTTS_PYTHONPATH", "").split(os.pathsep) if p]
import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts import stage
from tritontts.piper.vits import PiperVits
from tritontts.piper.voices import load_voice_table
from tritontts.triton_utils import error_response, input_array, input_scalar, model_parameters, tensor

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        threads = int(model_parameters(args).get("intra_op_threads", "0"))
        self.voices = load_voice_table()
        sessions = {}  # voices sharing one .onnx share one session
        self.vits = {name: sessions.setdefault(spec.model_path, PiperVits(
                         spec.model_path, spec.config.sample_rate, threads))
                     for name, spec in self.voices.voices.items()}

    def execute(self, requests):
        # Send each chunk's response as soon as it is ready rather than returning the whole
        # batch at the end: a batch must not delay the first chunk of a stream.
        for request in requests:
            request.get_response_sender().send(self._synthesize(request), flags=FINAL)
        return None

    def _synthesize(self, request):
        try:
            spec = self.voices.resolve(input_scalar(request, "voice"))
            vits = self.vits[spec.name]
            index = int(input_scalar(request, stage.CHUNK_INDEX))
            # The request's seed and the chunk index seed this chunk's noise.
            seed = [int(input_scalar(request, "seed")), index]
            audio = vits.synthesize(input_array(request, "phoneme_ids").reshape(-1),
                                    input_array(request, "scales").reshape(-1),
                                    seed, spec.speaker_id)
            return pb_utils.InferenceResponse(output_tensors=[
                tensor(stage.AUDIO, audio, np.float32),
                tensor(stage.SAMPLE_RATE, [vits.sample_rate], np.int32),
                tensor(stage.CHUNK_INDEX, [index], np.int32),
                tensor(stage.IS_FINAL, [bool(input_scalar(request, stage.IS_FINAL))], np.bool_),
            ])
        except Exception as exc:
            return error_response(exc)
