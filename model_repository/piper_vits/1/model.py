"""piper_vits: phoneme ids of one sentence -> audio, scheduled earliest-chunk-first."""
# The stub's interpreter runs isolated (ignores PYTHONPATH): put this environment's
# paths first, before numpy is imported (launcher: tritontts/tritonserver.py).
import os, sys  # noqa: E401
sys.path[:0] = [p for p in os.environ.get("TRITONTTS_PYTHONPATH", "").split(os.pathsep) if p]
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts import stage
from tritontts.piper.vits import PiperVits
from tritontts.piper.voices import load_voice_table
from tritontts.scheduling import ChunkScheduler
from tritontts.triton_utils import cancelled_response, error_response, input_array, input_scalar, model_parameters, tensor

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if sum(g.get("count", 1) for g in config.get("instance_group", [])) != 1:
            raise ValueError("piper_vits must run one instance: its scheduler keeps each "
                             "stream's chunks in order (raise `workers` for parallelism)")
        params = model_parameters(args)
        threads = int(params.get("intra_op_threads", "0"))
        self.voices = load_voice_table()
        sessions = {}  # voices sharing one .onnx share one session
        self.vits = {name: sessions.setdefault(spec.model_path, PiperVits(
                         spec.model_path, spec.config.sample_rate, threads))
                     for name, spec in self.voices.voices.items()}
        self.scheduler = ChunkScheduler(int(params.get("workers", "2")), "piper_vits")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            def deliver(result, sender=sender):
                if isinstance(result, Exception):
                    result = error_response(result)
                sender.send(result, flags=FINAL)

            try:
                stream_id = int(input_scalar(request, stage.STREAM_ID))
                index = int(input_scalar(request, stage.CHUNK_INDEX))
                final = bool(input_scalar(request, stage.IS_FINAL))
            except Exception as exc:
                deliver(error_response(exc))
                continue
            self.scheduler.submit(stream_id, index, final,
                                  lambda request=request: self._synthesize(request), deliver)
        return None

    def _synthesize(self, request):
        if request.is_cancelled():  # the client went away: skip the work
            return cancelled_response()
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

    def finalize(self):
        self.scheduler.close()
