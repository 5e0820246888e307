"""The Piper stages (each a tritontts.serving.stage class named by its config.pbtxt):

  piper_text  PiperTextStage  text -> phoneme ids, one chunk per sentence (streaming)
  piper_vits  PiperVitsStage  phoneme ids -> audio (ONNX Runtime); its model is decoupled,
                              so the backend runs chunks earliest-chunk-first on `workers`
                              threads and releases each stream's chunks in order
"""
from __future__ import annotations

from typing import Any, Iterator

from ...serving import scheduling
from ...protocol import AUDIO, CHUNK_INDEX, SAMPLE_RATE, STREAM_ID
from ...serving.stage import PREPARES_REQUESTS, Inputs, Stage, StageContext, StreamingStage, begin_request
from .phonemize import PiperPhonemizer
from .request import parse_piper_params, scales_for
from .vits import PiperVits
from .family import FAMILY
from .voices import load_voice_table


class PiperTextStage(StreamingStage):
    """One chunk per sentence; the backend marks the last one final (phonemizing the next
    sentence is cheap, so holding a chunk until it is known costs ~nothing)."""

    one_by_one = PREPARES_REQUESTS

    def __init__(self, context: StageContext):
        super().__init__(context)
        self.voices = load_voice_table(context.checkpoint(FAMILY))
        self.phonemizers: dict[int, PiperPhonemizer] = {}   # voices may share one config
        for spec in self.voices.voices.values():
            self.phonemizers.setdefault(id(spec.config), PiperPhonemizer(spec.config))

    def run(self, inputs: Inputs) -> Iterator[dict[str, Any]]:
        start = begin_request(inputs, parse_piper_params)
        spec = self.voices.resolve(start.voice)
        scales = scales_for(start.params, spec.config)
        for ids in self.phonemizers[id(spec.config)].sentence_phoneme_ids(start.text):
            yield {"phoneme_ids": ids, "scales": scales, "speed": start.params.speed, "seed": start.seed,
                   "voice": spec.name, STREAM_ID: start.stream_id}


class PiperVitsStage(Stage):
    """One sentence's phoneme ids -> its audio, with noise seeded by (seed, chunk index)."""

    def __init__(self, context: StageContext):
        super().__init__(context)
        threads = context.int_parameter("intra_op_threads", 0)
        first = context.int_parameter("first_chunk_intra_op_threads", threads)
        self.voices = load_voice_table(context.checkpoint(FAMILY))
        sessions: dict = {}  # voices sharing one .onnx share its sessions
        self.vits = {name: sessions.setdefault(spec.model_path, PiperVits(
                         spec.model_path, spec.config.sample_rate, threads, first, context.device))
                     for name, spec in self.voices.voices.items()}

    def run(self, inputs: Inputs) -> dict[str, Any]:
        spec = self.voices.resolve(inputs.scalar("voice"))
        vits = self.vits[spec.name]
        index = int(inputs.scalar(CHUNK_INDEX))
        seed = [int(inputs.scalar("seed")), index]
        # A stream's first chunk uses every core; alone on the machine (the scheduler says),
        # its threads may also spin.
        audio = vits.synthesize(inputs.flat("phoneme_ids"), inputs.flat("scales"), seed,
                                spec.speaker_id, first_chunk=index == 0,
                                alone=scheduling.alone(), speed=float(inputs.scalar("speed")))
        return {AUDIO: audio, SAMPLE_RATE: vits.sample_rate}
