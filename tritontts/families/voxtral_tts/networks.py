"""Voxtral TTS's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch). Each talker step runs, besides the
Ministral backbone (vLLM's Llama), the acoustic transformer on the last hidden state (the
semantic head's argmax, then 7 flow-matching Euler steps with guidance over the 36
acoustic values: one frame, in compute_logits) and the frame embeddings on the frame just
made (the next position's input); the codec stage decodes each chunk's codes after their
left context. At tiny size also the backbone itself (ours, talker.VoxtralTalker). Voices
are preset embeddings: there is no encoder to run."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ...nn.runtime import Axis, Graph, TensorSpec
from .acoustic import SPECIAL_CODES, AcousticTransformer
from .checkpoint import params_json_config
from .codec import VoxtralCodec
from .random_checkpoint import SIZES
from .stages import DEFAULT_CFG
from .talker import VoxtralTalker

# model.json's steady chunk (25 frames; the first is 5) after its 25 frames of left
# context; a prompt of 64 positions (a sentence after the tiny voices' placeholders).
CHUNK_FRAMES, LEFT_CONTEXT_FRAMES, PROMPT_POSITIONS = 25, 25, 64
# The tiny tekken.json's vocabulary size (100 specials + its BPE ranks) is only known once
# it is trained; it sizes the token table alone, which none of these graphs holds.
TINY_VOCAB = 1024


class AcousticFrame(nn.Module):
    """The backbone's last hidden state [B, D] and the frame's noise [B, 36] -> the frame
    [B, 37] (codes shifted by the 2 specials), at the stage's default guidance (a buffer:
    make_frames passes the rows' values as a tensor on the device)."""

    def __init__(self, acoustic: AcousticTransformer) -> None:
        super().__init__()
        self.acoustic = acoustic
        self.register_buffer("cfg", torch.full((1,), DEFAULT_CFG), persistent=False)

    def forward(self, hidden: Tensor, noise: Tensor) -> Tensor:
        return self.acoustic.frame(hidden, noise, self.cfg)


class Backbone(nn.Module):
    """The Ministral layers and final norm over input embeddings [B, T, D] (causal,
    positions 0..T-1) -> final-normed hidden states [B, T, D]: VoxtralTalker.hidden."""

    hidden = VoxtralTalker.hidden

    def __init__(self, talker: VoxtralTalker) -> None:
        super().__init__()
        self.layers, self.norm = talker.layers, talker.norm

    def forward(self, embeds: Tensor) -> Tensor:
        return self.hidden(embeds)


class CodecWindow(nn.Module):
    """A window's codes [B, 37, frames] (0-based) -> its audio [B, frames * 1920]
    (VoxtralCodec.decode; the stage keeps the samples after the left context)."""

    def __init__(self, codec: VoxtralCodec) -> None:
        super().__init__()
        self.codec = codec

    def forward(self, codes: Tensor) -> Tensor:
        return self.codec.decode(codes)


def torch_networks(size: str) -> list[Graph]:
    size = "tiny" if size == "tiny" else "released"
    shape = SIZES[size][0]
    vocab = TINY_VOCAB if size == "tiny" else SIZES[size][2]["vocab_size"]
    # params.json as write_random_checkpoint lays it out.
    params = {k: v for k, v in shape.items() if not k.startswith("audio_")}
    params.update(vocab_size=vocab, multimodal={"audio_model_args": shape["audio_model_args"],
                                                "audio_tokenizer_args": shape["audio_tokenizer_args"]})
    config = params_json_config(params)
    b, a, c = config.backbone, config.acoustic, config.codec
    talker = VoxtralTalker(config)
    codec = VoxtralCodec(c)
    with torch.no_grad():
        # Unit-normal semantic codebook rows (a checkpoint always fills them; zeros would
        # decode every semantic code alike).
        codec.quantizer.semantic_codebook.embedding_sum.normal_()
    codec.fold_weight_norm()
    f32 = torch.float32
    graphs = [
        Graph(name="voxtral_tts_acoustic_frame", module=AcousticFrame(talker.acoustic_transformer),
              inputs=(TensorSpec("hidden", f32, ("batch", b.dim)),
                      TensorSpec("noise", f32, ("batch", a.n_acoustic_codebook))),
              outputs=("frame",), axes={"batch": Axis(1, 1, 16)}),
        Graph(name="voxtral_tts_frame_embeddings", module=talker.embed_frames,
              inputs=(TensorSpec("frame", torch.long, ("batch", 1 + a.n_acoustic_codebook),
                                 high=a.acoustic_codebook_size + SPECIAL_CODES),),
              outputs=("embeds",), axes={"batch": Axis(1, 1, 16)}),
        Graph(name="voxtral_tts_codec_decoder", module=CodecWindow(codec),
              inputs=(TensorSpec("codes", torch.long, ("batch", 1 + c.acoustic_dim, "frames"),
                                 high=c.acoustic_codebook_size),),
              outputs=("audio",),
              axes={"batch": Axis(1, 1, 8), "frames": Axis(1, LEFT_CONTEXT_FRAMES + CHUNK_FRAMES, 2048)}),
    ]
    if size == "tiny":
        graphs.append(Graph(
            name="voxtral_tts_talker_backbone", module=Backbone(talker),
            inputs=(TensorSpec("embeds", f32, ("batch", "positions", b.dim)),),
            outputs=("hidden",), axes={"batch": Axis(1, 1, 16), "positions": Axis(1, PROMPT_POSITIONS, 4096)}))
    for graph in graphs:
        graph.module.eval()
    return graphs
