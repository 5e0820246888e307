"""higgs-audio v2's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch). The decoder stage runs the codec's
decoder on each chunk's window (the chunk and the codec's context frames on both sides);
the prompt stage runs the codec's encoder (transformers' HuBERT + DAC encoder + RVQ search)
on a reference to clone; each talker step runs, besides the Llama backbone, the fused audio
head on the last hidden state and the audio table on the step just sampled (the next
position's input). The backbone has no module of ours (vllm_model's DualFFN layers are
vLLM's attention and MLPs), so it is left out at every size; the code sampler (delay
pattern, top-k/p, RAS) is per-request Python on the CPU, not a network."""
from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from ...nn.higgs_codec import (
    HiggsCodecConfig,
    HiggsCodecDecoder,
    context_frames,
    decoder_graph,
)
from ...nn.higgs_codec.encoder import _tokenizer_classes
from ...nn.higgs_codec.random import codec_config_dict, spread_codebooks
from ...nn.runtime import Axis, Graph, TensorSpec
from .checkpoint import CONFIG_FILE, HiggsAudioV2Config, parse_config
from .random_checkpoint import SPECIAL_IDS, config_dict
from .vllm_model import HiggsAudioV2TalkerForVllm

# model.json's steady chunk (25 frames; the first is 5) with the codec's context on both
# sides; a reference to clone of 3 s (what the contract tests send).
CHUNK_FRAMES, REFERENCE_SECONDS = 25, 3
# The parts HiggsCodecEncoder replaces by nn.Identity: encode() never runs them.
DECODE_PARTS = ("acoustic_decoder", "decoder_semantic", "fc1", "fc2")


class AudioStep(nn.Module):
    """The talker step's audio parts besides the backbone, as HiggsAudioV2TalkerForVllm
    holds them: the final-normed hidden state [B, H] -> the fused head's logits [B, K * C]
    (compute_logits; the sampler draws the codes from them), and the codes sampled [B, K]
    -> the next position's input [B, H] (embed_steps: the sum of each codebook's row)."""

    embed_steps = HiggsAudioV2TalkerForVllm.embed_steps

    def __init__(self, cfg: HiggsAudioV2Config) -> None:
        super().__init__()
        rows = cfg.num_codebooks * cfg.codebook_size
        self.audio_embeddings = nn.Embedding(rows, cfg.hidden_size)
        self.audio_lm_head = nn.Linear(cfg.hidden_size, rows, bias=False)
        self.register_buffer("codebook_offsets", torch.arange(cfg.num_codebooks) * cfg.codebook_size,
                             persistent=False)

    def forward(self, hidden: Tensor, codes: Tensor) -> tuple[Tensor, Tensor]:
        return self.audio_lm_head(hidden), self.embed_steps(codes)


class CodecEncoder(nn.Module):
    """A reference [B, 1, samples] at 24 kHz -> codes [B, Q, samples // hop]: cut to whole
    frames, then transformers' encode, as HiggsCodecEncoder.encode runs it."""

    def __init__(self, model: nn.Module, hop: int) -> None:
        super().__init__()
        self.model, self.hop = model, hop

    def forward(self, audio: Tensor) -> Tensor:
        usable = audio.shape[-1] // self.hop * self.hop
        return self.model.encode(audio[..., :usable], return_dict=False)


def torch_networks(size: str) -> list[Graph]:
    size = "tiny" if size == "tiny" else "released"
    # The token ids only set vocab_size, which none of these networks holds.
    talker = parse_config(config_dict(size, SPECIAL_IDS), Path(CONFIG_FILE))
    codec = codec_config_dict(size)
    cfg = HiggsCodecConfig.from_dict(codec)
    decoder = HiggsCodecDecoder(cfg)
    model_class, config_class = _tokenizer_classes()
    encoder = model_class(config_class(**copy.deepcopy(codec)))
    for name in DECODE_PARTS:
        setattr(encoder, name, nn.Identity())
    spread_codebooks(decoder)
    spread_codebooks(encoder)
    decoding = decoder_graph(decoder)
    window = decoding.axes["frames"]
    graphs = [
        replace(decoding, name="higgs_audio_v2_codec_decoder",
                axes={**decoding.axes, "frames": replace(window, opt=CHUNK_FRAMES + 2 * context_frames(cfg))}),
        Graph(name="higgs_audio_v2_codec_encoder", module=CodecEncoder(encoder, cfg.hop_length),
              inputs=(TensorSpec("audio", torch.float32, ("batch", 1, "samples")),),
              outputs=("codes",),
              axes={"batch": Axis(1, 1, 8),
                    "samples": Axis(cfg.hop_length, REFERENCE_SECONDS * cfg.sample_rate, 30 * cfg.sample_rate)}),
        Graph(name="higgs_audio_v2_audio_step", module=AudioStep(talker),
              inputs=(TensorSpec("hidden", torch.float32, ("batch", talker.hidden_size)),
                      TensorSpec("codes", torch.long, ("batch", talker.num_codebooks), high=talker.codebook_size)),
              outputs=("logits", "next_embeds"), axes={"batch": Axis(1, 1, 16)}),
    ]
    for graph in graphs:
        graph.module.eval()
    return graphs
