"""Fish Speech S2 Pro's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch). Each talker step runs, besides the
slow AR (vLLM's Qwen3), our frame: the main-token head, the fast AR over codes 1..9 and the
next position's input embedding; the codec stage decodes each chunk with the stream's state
(FishCodec.decode_stream; its first chunk here); the prompt stage encodes a reference to
clone with the codec's encoder (on the CPU when served). At tiny size also the slow AR
itself (ours, dual_ar.FishDualAR)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn.qwen3 import KVCache
from ...nn.runtime import Axis, Graph, TensorSpec
from .checkpoint import FishConfig, parse_config_dict
from .codec import FishCodec, FishCodecConfig, LegacyWNConv1x1
from .dual_ar import FastTransformer, FishDualAR, Transformer, position_inputs
from .random_checkpoint import BPE_VOCAB, SIZES, TINY_CODEC, config_dict, special_ids

# A stream's first chunk (model.json: 4 frames, then 25 each): what the first audio waits
# on; the shortest reference the prompt stage takes (1 s); a cloning prompt of about 100
# positions. Longer ones make the CPU dry run slow: at 44.1 kHz its bfloat16 convolutions
# take seconds (a steady 25-frame chunk's decode does).
FIRST_CHUNK_FRAMES, REFERENCE_SECONDS, PROMPT_TOKENS = 4, 1, 100


class Frame(nn.Module):
    """One talker step after the slow AR, greedy: its final-normed hidden state [B, D] ->
    (the frame [B, 1 + K]: main token, codes; the next position's input [B, D]), as
    dual_ar.decode_frames and position_inputs compute them with argmax for the draws."""

    def __init__(self, config: FishConfig, embeddings: nn.Embedding, fast: FastTransformer) -> None:
        super().__init__()
        self.config, self.embeddings, self.fast = config, embeddings, fast
        allowed = torch.full((config.slow.vocab_size,), float("-inf"))
        allowed[config.semantic_begin_id:config.semantic_end_id + 1] = 0.0
        allowed[config.im_end_id] = 0.0
        self.register_buffer("allowed", allowed, persistent=False)
        self.register_buffer("positions", torch.arange(config.num_codebooks), persistent=False)

    def forward(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        c, fast = self.config, self.fast
        main = (F.linear(hidden, self.embeddings.weight) + self.allowed).argmax(-1)
        codes = [(main - c.semantic_begin_id).clamp(0, c.codebook_size - 1)]
        cache = KVCache(len(fast.layers))
        fast(hidden[:, None], self.positions[:1], cache)
        for i in range(1, c.num_codebooks):
            x = fast.embeddings(codes[-1])[:, None]
            codes.append(fast.output(fast(x, self.positions[i:i + 1], cache)[:, 0]).argmax(-1))
        codes = torch.stack(codes, dim=1)
        frame = torch.cat([main[:, None], codes], dim=1)
        return frame, position_inputs(self.embeddings(main), main, codes, fast, c)


class CodecChunk(nn.Module):
    """A stream's first chunk of codes [B, 10, n] -> its audio [B, 1, n * hop]:
    FishCodec.decode_stream from a fresh state (later chunks also attend over the state's
    cached keys and values, and see the last frames' output again)."""

    def __init__(self, codec: FishCodec) -> None:
        super().__init__()
        self.codec = codec

    def forward(self, codes: Tensor) -> Tensor:
        return self.codec.decode_stream(codes)[0]


class CodecEncoder(nn.Module):
    """A reference clip [B, 1, samples] at 44.1 kHz -> its codes [B, 10, ceil(samples / hop)]
    (FishCodec.encode: right-padded to whole frames, encoded, quantized)."""

    def __init__(self, codec: FishCodec) -> None:
        super().__init__()
        self.encoder, self.quantizer, self.hop = codec.encoder, codec.quantizer, codec.config.hop

    def forward(self, audio: Tensor) -> Tensor:
        audio = F.pad(audio, (0, -audio.shape[-1] % self.hop))
        return self.quantizer.encode(self.encoder(audio))


class SlowAR(nn.Module):
    """The slow AR over a prompt's inputs [B, T, D] -> final-normed hidden [B, T, D]."""

    def __init__(self, slow: Transformer) -> None:
        super().__init__()
        self.slow = slow

    def forward(self, embeds: Tensor) -> Tensor:
        positions = torch.arange(embeds.shape[1], device=embeds.device)
        return self.slow(embeds, positions, KVCache(len(self.slow.layers)))


def codec_half(config: FishCodecConfig, unused: tuple[str, ...]) -> FishCodec:
    """The codec as load_codec serves it (weight norm folded) without the `unused` parts
    (the other direction's), its quantizer projections unit-normal: their default init
    (weight_v all ones; a checkpoint always fills them) makes every latent channel alike
    and every frame encode to the same codes."""
    codec = FishCodec(config).fold_weight_norm()
    for name in unused:
        owner, _, leaf = name.rpartition(".")
        setattr(codec.get_submodule(owner), leaf, nn.Identity())
    with torch.no_grad():
        for module in codec.modules():
            if isinstance(module, LegacyWNConv1x1):
                module.weight_v.normal_()
    return codec.eval()


def torch_networks(size: str) -> list[Graph]:
    size = "tiny" if size == "tiny" else "released"
    config = parse_config_dict(config_dict(size, special_ids(size, SIZES[size]["base_vocab"] or BPE_VOCAB)))
    codec_config = FishCodecConfig.from_dict(TINY_CODEC) if size == "tiny" else FishCodecConfig()
    decoding = codec_half(codec_config, ("encoder", "quantizer.pre_module", "quantizer.downsample"))
    encoding = codec_half(codec_config, ("decoder", "quantizer.post_module", "quantizer.upsample"))
    if size == "tiny":
        dual = FishDualAR(config).eval()
        embeddings, fast = dual.slow.embeddings, dual.audio_decoder
    else:       # the slow AR's 4 B weights are vLLM's: only its (tied) head table
        embeddings, fast = nn.Embedding(config.slow.vocab_size, config.slow.dim), FastTransformer(config)
    c, dim, f32 = codec_config, config.slow.dim, torch.float32
    graphs = [
        Graph(name="fish_s2_pro_frame", module=Frame(config, embeddings, fast),
              inputs=(TensorSpec("hidden", f32, ("batch", dim)),),
              outputs=("frame", "next_embeds"), axes={"batch": Axis(1, 1, 64)}),
        Graph(name="fish_s2_pro_codec_decoder", module=CodecChunk(decoding),
              inputs=(TensorSpec("codes", torch.long, ("batch", c.num_codebooks, "frames"),
                                 high=c.semantic_codebook_size),),
              outputs=("audio",), axes={"batch": Axis(1, 1, 16), "frames": Axis(1, FIRST_CHUNK_FRAMES, 64)}),
        Graph(name="fish_s2_pro_codec_encoder", module=CodecEncoder(encoding),
              inputs=(TensorSpec("audio", f32, ("batch", 1, "samples")),),
              outputs=("codes",),
              axes={"batch": Axis(1, 1, 8),
                    "samples": Axis(c.hop, REFERENCE_SECONDS * c.sample_rate, 30 * c.sample_rate)}),
    ]
    if size == "tiny":
        graphs.append(Graph(
            name="fish_s2_pro_slow_ar", module=SlowAR(dual.slow),
            inputs=(TensorSpec("embeds", f32, ("batch", "tokens", dim)),),
            outputs=("hidden",), axes={"batch": Axis(1, 1, 64), "tokens": Axis(1, PROMPT_TOKENS, 4096)}))
    for graph in graphs:
        graph.module.eval()
    return graphs
