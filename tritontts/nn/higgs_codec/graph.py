"""The decoder as a tritontts.nn.runtime Graph (onnxruntime / TensorRT)."""
from __future__ import annotations

import torch

from .decoder import HiggsCodecDecoder


def decoder_graph(decoder: HiggsCodecDecoder, max_batch: int = 8, max_frames: int = 1500):
    """The decoder as a tritontts.nn.runtime Graph: codes int64 (batch, Q, frames) -> audio
    float32 (batch, frames * samples_per_frame), for onnxruntime / TensorRT."""
    from ..runtime import Axis, Graph, TensorSpec

    cfg = decoder.cfg
    return Graph(
        name="higgs_codec_decoder", module=decoder,
        inputs=(TensorSpec("codes", torch.int64, ("batch", cfg.num_quantizers, "frames"),
                           high=cfg.codebook_size),),
        outputs=("audio",),
        # opt: 10 s, a typical OmniVoice utterance (it decodes whole utterances).
        axes={"batch": Axis(1, 1, max_batch), "frames": Axis(1, min(250, max_frames), max_frames)},
        output_axes={"audio": {0: "batch", 1: "samples"}})
