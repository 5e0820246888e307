"""GLM-TTS's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch). The prompt stage runs the
WhisperVQ speech tokenizer on the reference; the flow stage the token embedding once per
chunk and the DiT velocity once per Euler step; the vocoder stage the non-causal HiFT's f0
predictor and spectrum network. The talker is a plain Llama checkpoint that vLLM runs (no
module of ours), CAM++ an ONNX file on onnxruntime, and the optional Vocos2D vocoder exists
only as released TorchScript (random checkpoints write the HiFT)."""
from __future__ import annotations

import json
from dataclasses import replace

import torch
from torch import Tensor, nn

from ...nn.hift import HiFTGenerator, spectrum_graph
from ...nn.runtime import Axis, Graph, TensorSpec
from .flow import SPEAKER_DIM, GLMTTSDiT, GLMTTSFlow
from .random_checkpoint import SIZES
from .speech_tokenizer import (
    CONFIG_FILE, PREPROCESSOR_FILE, WhisperVQEncoder, parse_config, random_speech_tokenizer_config)
from .vocoder import HIFT_CONFIGS

# A stream's second chunk (75 tokens, talker.BLOCK_SIZES) after a 3 s reference (75 prompt
# tokens): the flow sees 150 tokens, 300 mel frames; the vocoder the speech's 150 frames;
# the speech tokenizer the reference's 300 whisper frames.
PROMPT_TOKENS, SPEECH_TOKENS = 75, 75


class SpeechTokenizer(nn.Module):
    """WhisperVQ up to its codebook: log-mel [B, mels, T] and which frames are real [B, T]
    -> (tokens [B, T / 4], the quantizer's input [B, T / 4, d]), padding positions too."""

    def __init__(self, encoder: WhisperVQEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, features: Tensor, frame_valid: Tensor) -> tuple[Tensor, Tensor]:
        hidden, _ = self.encoder(features, frame_valid)
        return self.encoder.quantize(hidden), hidden


class TokenFrames(nn.Module):
    """Speech tokens [B, N] -> their embedding at the mel rate [B, frames_for(N), token_dim]
    (the DiT's text_emb_layer, which the flow runs once per ODE solve)."""

    def __init__(self, flow: GLMTTSFlow) -> None:
        super().__init__()
        self.text_emb_layer = flow.estimator.text_emb_layer
        self.frames_for = flow.frames_for

    def forward(self, tokens: Tensor) -> Tensor:
        return self.text_emb_layer(tokens, self.frames_for(tokens.shape[1]))


class Velocity(nn.Module):
    """GLMTTSDiT.velocity on the DiT's modules, all but its token table (TokenFrames')."""

    velocity = GLMTTSDiT.velocity
    PARTS = ("time_embed", "emb_concator", "rotary_embed", "transformer_blocks", "norm_out", "proj_out")

    def __init__(self, dit: GLMTTSDiT) -> None:
        super().__init__()
        self.speaker_dim = dit.speaker_dim
        for name in self.PARTS:
            setattr(self, name, getattr(dit, name))

    def forward(self, x: Tensor, cond: Tensor, token_emb: Tensor, t: Tensor, speaker: Tensor,
                attn_mask: Tensor) -> Tensor:
        return self.velocity(x, cond, token_emb, t, speaker, attn_mask)


class _JsonFolder:
    """A folder of JSON files held in memory, for parse_config's `root / name`."""

    def __init__(self, files: dict[str, dict], name: str = "speech_tokenizer") -> None:
        self.files, self.name = files, name

    def __truediv__(self, name: str) -> _JsonFolder:
        return _JsonFolder(self.files, name)

    def read_text(self, encoding: str | None = None) -> str:
        return json.dumps(self.files[self.name])

    def __str__(self) -> str:
        return self.name


def torch_networks(size: str) -> list[Graph]:
    size = "tiny" if size == "tiny" else "released"
    config, preprocessor = random_speech_tokenizer_config(size)
    whisper = parse_config(_JsonFolder({CONFIG_FILE: config, PREPROCESSOR_FILE: preprocessor}))
    encoder = WhisperVQEncoder(whisper).eval()
    # random_checkpoint.write_flow's network (its flow/config.yaml: GLMTTSFlow's defaults).
    flow = GLMTTSFlow(GLMTTSDiT(**SIZES[size]["dit"], ff_mult=2, mel_dim=80, cond_dim=80,
                                speaker_adaln=True)).eval()
    hift = HiFTGenerator(**HIFT_CONFIGS[size]).eval()
    dit, f32 = flow.estimator, torch.float32
    reference = 2 * whisper.pooling_kernel * PROMPT_TOKENS       # whisper frames of the reference
    tokens = PROMPT_TOKENS + SPEECH_TOKENS
    frames = flow.frames_for(tokens)
    speech_frames = flow.frames_for(SPEECH_TOKENS)
    spectrum = spectrum_graph(hift, name="glm_tts_hift_spectrum")
    graphs = [
        Graph(name="glm_tts_speech_tokenizer", module=SpeechTokenizer(encoder),
              inputs=(TensorSpec("features", f32, ("batch", whisper.num_mel_bins, "frames")),
                      TensorSpec("frame_valid", torch.bool, ("batch", "frames"))),
              outputs=("tokens", "hidden"),
              axes={"batch": Axis(1, 1, 16), "frames": Axis(4, reference, 3000)}),
        Graph(name="glm_tts_flow_token_embedding", module=TokenFrames(flow),
              inputs=(TensorSpec("tokens", torch.long, ("batch", "tokens"), high=SIZES[size]["dit"]["vocab"]),),
              outputs=("token_emb",), axes={"batch": Axis(1, 2, 16), "tokens": Axis(1, tokens, 1500)}),
        Graph(name="glm_tts_flow_velocity", module=Velocity(dit),
              inputs=(TensorSpec("x", f32, ("batch", "frames", dit.mel_dim)),
                      TensorSpec("cond", f32, ("batch", "frames", dit.cond_dim)),
                      TensorSpec("token_emb", f32, ("batch", "frames", dit.text_emb_layer.text_embed.embedding_dim)),
                      TensorSpec("t", f32, ("batch",)),
                      TensorSpec("speaker", f32, ("batch", SPEAKER_DIM)),
                      TensorSpec("attn_mask", torch.bool, ("batch", 1, "frames", "frames"))),
              outputs=("velocity",), axes={"batch": Axis(2, 2, 16), "frames": Axis(2, frames, 3000)}),
        Graph(name="glm_tts_hift_f0", module=hift.f0_predictor,
              inputs=(TensorSpec("mel", f32, ("batch", hift.conv_pre.in_channels, "mel_frames")),),
              outputs=("f0",), axes={"batch": Axis(1, 1, 16), "mel_frames": Axis(1, speech_frames, 3000)}),
        replace(spectrum, axes={**spectrum.axes, "mel_frames": replace(spectrum.axes["mel_frames"],
                                                                       opt=speech_frames)}),
    ]
    for graph in graphs:
        graph.module.eval()
    return graphs
