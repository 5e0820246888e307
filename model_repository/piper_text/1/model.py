"""piper_text: text -> one response per sentence with its phoneme ids."""
# The stub's interpreter runs isolated (ignores PYTHONPATH): put this environment's
# paths first, before numpy is imported (launcher: tritontts/tritonserver.py).
import os, sys  # noqa: E401
sys.path[:0] = [p for p in os.environ.get("TRITONTTS_PYTHONPATH", "").split(os.pathsep) if p]
import secrets

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts import stage
from tritontts.piper.phonemize import PiperPhonemizer
from tritontts.piper.request import parse_piper_params, scales_for
from tritontts.piper.voices import load_voice_table
from tritontts.triton_utils import error_response, input_scalar, tensor

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.voices = load_voice_table()
        # One phonemizer per voice config (voices may share one).
        self.phonemizers = {}
        for spec in self.voices.voices.values():
            self.phonemizers.setdefault(id(spec.config), PiperPhonemizer(spec.config))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._stream(request, sender)
            except Exception as exc:  # the request fails, the model stays up
                sender.send(error_response(exc), flags=FINAL)
        return None

    def _stream(self, request, sender):
        text = stage.check_text(input_scalar(request, stage.TEXT, ""))
        spec = self.voices.resolve(input_scalar(request, stage.VOICE, ""))
        params = parse_piper_params(stage.parse_params(input_scalar(request, stage.PARAMS, "")))
        scales = scales_for(params, spec.config)
        seed = params.seed if params.seed is not None else secrets.randbits(62)
        stream_id = secrets.randbits(63)
        phonemizer = self.phonemizers[id(spec.config)]
        sentences = phonemizer.sentences(text)
        # Emit each sentence once the next is known to exist, so the last one is marked final.
        pending = None
        index = 0
        for sentence in sentences:
            ids = phonemizer.phoneme_ids(sentence)
            if not ids:
                continue
            if pending is not None:
                sender.send(self._chunk(pending, scales, seed, stream_id, spec.name, index, False))
                index += 1
            pending = ids
        if pending is None:
            raise stage.InvalidRequest("input has nothing to speak")
        sender.send(self._chunk(pending, scales, seed, stream_id, spec.name, index, True), flags=FINAL)

    @staticmethod
    def _chunk(ids, scales, seed, stream_id, voice, index, final):
        return pb_utils.InferenceResponse(output_tensors=[
            tensor("phoneme_ids", ids, np.int64),
            tensor("scales", scales, np.float32),
            tensor("seed", [seed], np.int64),
            tensor("voice", [voice.encode()], np.object_),
            tensor(stage.STREAM_ID, [stream_id], np.int64),
            tensor(stage.CHUNK_INDEX, [index], np.int32),
            tensor(stage.IS_FINAL, [final], np.bool_),
        ])
