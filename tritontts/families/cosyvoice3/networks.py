"""CosyVoice3's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch). The flow stage runs the token
encoder (embedding, lookahead layer, speaker projection) once per chunk and the DiT
velocity once per Euler step; the hift stage runs the causal f0 predictor (in float64, as
upstream) and the vocoder's spectrum network. The talker is a converted Qwen2 checkpoint
that vLLM runs: no module of ours; the prompt stage's CAM++ and speech tokenizer are ONNX
files on onnxruntime."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn.hift import HiFTGenerator, spectrum_graph
from ...nn.runtime import Axis, Graph, TensorSpec
from ...weights.hyperpyyaml import _Loader, _resolve
from .flow import CausalMaskedDiffWithDiT, build_flow, velocity_graph
from .random_checkpoint import SIZES, YAML_TEMPLATE
from .talker import SPEECH_TOKEN_SIZE

# A stream after a 3 s reference (batching.py's prompt): 75 prompt tokens and 75 speech
# tokens so far, 3 more of lookahead. The flow sees all 150 tokens (300 mel frames, the
# velocity graph's opt), the vocoder the speech's 150 mel frames.
PROMPT_TOKENS, SPEECH_TOKENS = 75, 75


class FlowEncoder(nn.Module):
    """Tokens so far (prompt first, the last pre_lookahead_len only lookahead) [B, N] and
    the CAM++ x-vector [B, 192] -> (mu [B, 80, ratio * (N - lookahead)], spks [B, 80]):
    what CausalMaskedDiffWithDiT.inference computes before the CFM solve (finalize=False)."""

    def __init__(self, flow: CausalMaskedDiffWithDiT) -> None:
        super().__init__()
        # The flow's parts, not the flow: its DiT is the velocity graph's.
        self.input_embedding = flow.input_embedding
        self.pre_lookahead_layer = flow.pre_lookahead_layer
        self.spk_embed_affine_layer = flow.spk_embed_affine_layer
        self.look, self.ratio = flow.pre_lookahead_len, flow.token_mel_ratio

    def forward(self, tokens: Tensor, embedding: Tensor) -> tuple[Tensor, Tensor]:
        emb = self.input_embedding(tokens)
        h = self.pre_lookahead_layer(emb[:, :-self.look], context=emb[:, -self.look:])
        mu = h.repeat_interleave(self.ratio, dim=1).transpose(1, 2)
        return mu, self.spk_embed_affine_layer(F.normalize(embedding, dim=1))


class F0Predictor(nn.Module):
    """The causal f0 predictor, in its weights' dtype (float64 as the stage keeps it):
    mel [B, 80, T] -> f0 [B, T] (finalize=True), in the mel's dtype."""

    def __init__(self, hift: HiFTGenerator) -> None:
        super().__init__()
        self.predictor = hift.f0_predictor

    def forward(self, mel: Tensor) -> Tensor:
        dtype = self.predictor.classifier.weight.dtype
        return self.predictor(mel.to(dtype), finalize=True).to(mel.dtype)


def config(size: str) -> dict:
    """cosyvoice3.yaml as random_checkpoint.write_config writes it, parsed in memory."""
    sizes = SIZES["tiny" if size == "tiny" else "released"]
    text = YAML_TEMPLATE.format(hidden=sizes["qwen2"]["hidden_size"],
                                **{k: v for k, v in sizes.items() if k.startswith(("dit", "lookahead", "hift"))})
    loader = _Loader(text)
    try:
        raw = loader.get_single_data()
    finally:
        loader.dispose()
    return _resolve(raw, raw, Path("cosyvoice3.yaml"))


def torch_networks(size: str) -> list[Graph]:
    blocks = config(size)
    flow = build_flow(blocks["flow"]).eval()
    hift = HiFTGenerator.from_config(blocks["hift"]).eval()
    look = flow.pre_lookahead_len
    mels = hift.conv_pre.in_channels
    encoder = Graph(
        name="cosyvoice3_flow_encoder", module=FlowEncoder(flow),
        inputs=(TensorSpec("tokens", torch.long, ("batch", "tokens"), high=SPEECH_TOKEN_SIZE),
                TensorSpec("embedding", torch.float32, ("batch", flow.spk_embed_affine_layer.in_features))),
        outputs=("mu", "spks"),
        axes={"batch": Axis(1, 1, 16), "tokens": Axis(look + 1, PROMPT_TOKENS + SPEECH_TOKENS + look, 1500 + look)})
    frames = flow.token_mel_ratio * SPEECH_TOKENS
    f0 = Graph(
        name="cosyvoice3_hift_f0", module=F0Predictor(hift),
        inputs=(TensorSpec("mel", torch.float32, ("batch", mels, "mel_frames")),),
        outputs=("f0",), axes={"batch": Axis(1, 1, 16), "mel_frames": Axis(1, frames, 3000)})
    spectrum = spectrum_graph(hift)
    ahead = spectrum.axes["mel_frames"]
    spectrum = replace(spectrum, axes={**spectrum.axes, "mel_frames": replace(
        ahead, opt=frames + hift.conv_pre_look_right)})
    graphs = [encoder, velocity_graph(flow.decoder.estimator), f0, spectrum]
    for graph in graphs:
        graph.module.eval()
    return graphs
