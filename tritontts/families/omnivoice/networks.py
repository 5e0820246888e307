"""OmniVoice's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch). The generator stage runs the whole
bidirectional Qwen3 (with the audio embeddings and heads) once per unmasking step, in
PyTorch at every size (no vLLM here); the decoder stage the higgs-audio v2 codec decoder on
each segment; the prompt stage the codec's encoder (transformers' HuBERT + DAC encoder +
RVQ search) on a reference to clone. The unmasking loop around the logits samples with
Gumbel noise and is not a network."""
from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from ...nn.higgs_codec import HiggsCodecConfig, HiggsCodecDecoder, decoder_graph
from ...nn.higgs_codec.encoder import _tokenizer_classes
from ...nn.higgs_codec.random import codec_config_dict, spread_codebooks
from ...nn.runtime import Axis, Graph, TensorSpec
from .checkpoint import CONFIG_FILE, parse_config
from .generator import OmniVoiceGenerator, logits_graph
from .random_checkpoint import config_dict

# A stream's first segment, decoded whole before any audio plays: at its shortest, 40
# characters (stages.MIN_SEGMENT_CHARS), estimate_frames gives it 56 codec frames (2.2 s).
# A reference to clone: 3 s (what the contract tests send).
SEGMENT_FRAMES, REFERENCE_SECONDS = 56, 3
# What HiggsCodecEncoder drops: encode() never runs the decode halves.
DECODE_ONLY = ("acoustic_decoder", "decoder_semantic", "fc1", "fc2")


class CodecEncoder(nn.Module):
    """audio [B, 1, samples] (24 kHz, whole frames) -> codes [B, Q, samples / hop]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio: Tensor) -> Tensor:
        return self.model.encode(audio, return_dict=False)


def torch_networks(size: str) -> list[Graph]:
    size = "tiny" if size == "tiny" else "released"
    generator = OmniVoiceGenerator(parse_config(config_dict(size), Path(CONFIG_FILE))).eval()
    codec = codec_config_dict(size)
    cfg = HiggsCodecConfig.from_dict(codec)
    decoder = HiggsCodecDecoder(cfg).eval()
    model_class, config_class = _tokenizer_classes()
    encoder = model_class(config_class(**copy.deepcopy(codec)))
    for name in DECODE_ONLY:
        setattr(encoder, name, nn.Identity())
    encoder.eval()
    spread_codebooks(decoder)
    spread_codebooks(encoder)
    decoding = decoder_graph(decoder)
    frames = decoding.axes["frames"]
    graphs = [
        logits_graph(generator),
        replace(decoding, name="omnivoice_codec_decoder",
                axes={**decoding.axes, "frames": replace(frames, opt=SEGMENT_FRAMES)}),
        Graph(name="omnivoice_codec_encoder", module=CodecEncoder(encoder),
              inputs=(TensorSpec("audio", torch.float32, ("batch", 1, "samples")),),
              outputs=("codes",),
              axes={"batch": Axis(1, 1, 8),
                    "samples": Axis(cfg.hop_length, REFERENCE_SECONDS * cfg.sample_rate, 30 * cfg.sample_rate)}),
    ]
    for graph in graphs:
        graph.module.eval()
    return graphs
