"""cosyvoice3_talker: vLLM generates speech tokens; one response per hop."""
# The stub's interpreter runs isolated (ignores PYTHONPATH): put this environment's
# paths first, before numpy is imported (launcher: tritontts/tritonserver.py).
import os, sys  # noqa: E401
sys.path[:0] = [p for p in os.environ.get("TRITONTTS_PYTHONPATH", "").split(os.pathsep) if p]
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts import stage
from tritontts.cosyvoice3.family import checkpoint_from_environment
from tritontts.cosyvoice3.streaming import HopSchedule
from tritontts.cosyvoice3.talker_engine import TalkerEngine, TalkRequest, ensure_talker_checkpoint
from tritontts.triton_utils import error_response, input_array, input_scalar, tensor

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        settings = json.loads(Path(__file__).with_name("model.json").read_text())
        checkpoint = checkpoint_from_environment()
        # The hop lookahead is the flow's: it must see pre_lookahead_len tokens ahead.
        hops = {**settings["hops"], "lookahead": int(checkpoint.config["flow"]["pre_lookahead_len"])}
        self.engine = TalkerEngine(ensure_talker_checkpoint(checkpoint),
                                   checkpoint.config["llm"]["sampling"], HopSchedule(**hops),
                                   settings["engine_args"])

    def execute(self, requests):
        for request in requests:
            self.engine.submit(self._talk(request))
        return None

    async def _talk(self, request):
        sender = request.get_response_sender()
        try:
            prompt_tokens = input_array(request, "prompt_tokens").reshape(-1)
            stream_id = int(input_scalar(request, stage.STREAM_ID))
            forwarded = [tensor("prompt_tokens", prompt_tokens, np.int32),
                         tensor("prompt_mel", input_array(request, "prompt_mel")[0], np.float32),
                         tensor("embedding", input_array(request, "embedding").reshape(-1), np.float32),
                         tensor(stage.STREAM_ID, [stream_id], np.int64)]
            prompts = np.split(input_array(request, "prompt_ids").reshape(-1),
                               np.cumsum(input_array(request, "segment_lengths").reshape(-1))[:-1])
            min_tokens = input_array(request, "min_tokens").reshape(-1)
            max_tokens = input_array(request, "max_tokens").reshape(-1)
            seed = int(input_scalar(request, "seed"))
            index = 0
            for k, prompt_ids in enumerate(prompts):
                last_segment = k == len(prompts) - 1

                def send_chunk(tokens, chunk, last_segment=last_segment):
                    nonlocal index
                    final = chunk.finalize and last_segment
                    sender.send(pb_utils.InferenceResponse(output_tensors=[
                        tensor("speech_tokens", tokens[:chunk.tokens_upto], np.int32),
                        tensor("token_offset", [chunk.token_offset], np.int32),
                        tensor("finalize", [chunk.finalize], np.bool_),
                        *forwarded,
                        tensor(stage.CHUNK_INDEX, [index], np.int32),
                        tensor(stage.IS_FINAL, [final], np.bool_),
                    ]), flags=FINAL if final else 0)
                    index += 1

                # Segments are spoken one after another, each a generation of its own.
                job = TalkRequest(request_id=f"{stream_id}-{k}", prompt_ids=prompt_ids.tolist(),
                                  min_tokens=int(min_tokens[k]), max_tokens=int(max_tokens[k]),
                                  seed=(seed + k) % 2**63, prompt_tokens=prompt_tokens.size)
                await self.engine.talk(job, send_chunk, request.is_cancelled)
        except BaseException as exc:  # CancelledError included: every request gets its end
            sender.send(error_response(exc if isinstance(exc, Exception) else RuntimeError(repr(exc))),
                        flags=FINAL)

    def finalize(self):
        self.engine.shutdown()
