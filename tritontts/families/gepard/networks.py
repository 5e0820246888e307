"""Gepard-1.0's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch). Each talker step runs, besides the
backbone, our heads (heads.GepardHeads: the 32 FSQ heads, the stop head and the next
position's frame embedding); the codec stage decodes each window of codes with NanoCodec's
decoder. The Qwen3.5 backbone is vLLM's own layers (vllm_model.py) at every size: no module
of ours to time."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ...nn.runtime import Axis, Graph, Method, TensorSpec
from .checkpoint import GepardConfig, parse_backbone, parse_sidecar
from .codec import NanoCodecConfig, NanoCodecDecoder, nemo_model_config
from .heads import GepardHeads
from .random_checkpoint import RELEASED_FIRST_SPECIAL, SPECIAL, backbone_config, sidecar

# A stream's first chunk (model.json: 10 frames, then 86 after the codec's 25 frames of
# context): what sets the time to first audio, and small enough for the CPU dry run (its
# bfloat16 convolutions are slow; a 111-frame window takes seconds there).
FIRST_CHUNK_FRAMES = 10
# The special tokens' ids reach no network: the tiny tokenizer's sit after its BPE part,
# which the writer trains (at most 480 - 7 entries) and this does not.
FIRST_SPECIAL = {"tiny": 480 - len(SPECIAL), "released": RELEASED_FIRST_SPECIAL}


class Frame(nn.Module):
    """One talker step's heads, greedy: the backbone's last hidden state [B, H] -> (codes
    [B, 32]: each FSQ head's argmax, GepardHeads.draw without its Gumbel noise; the stop
    head's probability [B]; the next position's input embedding [B, H])."""

    def __init__(self, config: GepardConfig) -> None:
        super().__init__()
        self.heads = GepardHeads(config)

    def forward(self, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        heads = self.heads
        fused = heads.fused_logits(hidden)
        rest = fused[:, heads._gather].float() + heads._pad
        codes = torch.cat([fused[:, :heads.levels[0]].argmax(-1, keepdim=True), rest.argmax(-1)], dim=1)
        stop = torch.sigmoid(heads.stop_head(hidden).float())[:, 0]
        return codes, stop, heads.embed(codes)


def torch_networks(size: str) -> list[Graph]:
    size = "tiny" if size == "tiny" else "released"
    config = parse_sidecar(sidecar(FIRST_SPECIAL[size], size), parse_backbone(backbone_config(size)))
    codec = NanoCodecDecoder(NanoCodecConfig.from_yaml(nemo_model_config(size), f"{size} model_config.yaml"))
    c = codec.config
    graphs = [
        Graph(name="gepard_frame", module=Frame(config),
              inputs=(TensorSpec("hidden", torch.float32, ("batch", config.backbone.hidden_size)),),
              outputs=("codes", "stop", "next_embeds"), axes={"batch": Axis(1, 1, 64)}),
        Graph(name="gepard_codec_decoder", module=Method(codec, "decode_codes"),
              inputs=(TensorSpec("codes", torch.long, ("batch", c.codes_per_frame, "frames"), high=min(c.levels)),),
              outputs=("audio",), axes={"batch": Axis(1, 1, 16), "frames": Axis(1, FIRST_CHUNK_FRAMES, 512)}),
    ]
    for graph in graphs:
        graph.module.eval()
    return graphs
