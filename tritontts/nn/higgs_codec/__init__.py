"""The higgs-audio v2 codec: 8 codebooks x 1024 codes at 25 frames/s <-> 24 kHz audio.

OmniVoice (and higgs-audio v2) keep it in `audio_tokenizer/`, laid out as the Hugging Face
repo eustlb/higgs-audio-v2-tokenizer: config.json (model_type higgs_audio_v2_tokenizer,
with nested `acoustic_model_config` (DAC) and `semantic_model_config` (HuBERT)),
model.safetensors and preprocessor_config.json.

Decoding (ours, `HiggsCodecDecoder`):

  codes [B, 8, T]
    --RVQ: per codebook, embedding row then project_out (codebook_dim -> hidden), summed
                                                              [B, T, 1024]
    --fc2 (hidden -> acoustic latent)                        [B, T, 256]
    --DAC decoder: conv k7, per upsampling ratio (8, 5, 4, 2, 3) Snake + transposed conv
      (kernel 2r, output_padding r % 2 so every block is exactly r times longer) + residual
      units (dilations 1, 3, 9), Snake, conv k7 to 1 channel; no tanh
  audio [B, T * 960]

Module and parameter names are the checkpoint's, prefix kept (`quantizer.quantizers.0.
codebook.embed`, `fc2.weight`, `acoustic_decoder.block.0.conv_t1.weight`, ...), so the
decoder's tensors load strictly and the encoder's (project_in, the EMA training buffers,
acoustic_encoder, semantic_model, ...) are never read.

Encoding (`HiggsCodecEncoder`) wraps transformers' HiggsAudioV2TokenizerModel (HuBERT +
DAC encoder + RVQ search), loaded from the local folder only.

The DAC decoder is not causal: a frame's samples depend on `context_frames` (10) frames
on each side. `decode_chunk` decodes a window and keeps the frames between its context
margins; with that much context on both sides (`chunk_window`) a stream of chunks joins
into exactly the whole-utterance decode.

boson-ai's standalone layout (bosonai/higgs-audio-v2-tokenizer: config.json with
boson_multimodal's HiggsAudioTokenizer arguments + model.pth) loads too, its names mapped
onto these (see the section on it below).

Triton-free: torch, transformers and safetensors only.

The package by concern: config.py, decoder.py, streaming.py, weight_norm.py, weights.py, legacy.py, graph.py, encoder.py, random.py.
"""
from .config import (
    CONFIG_FILE,
    LEGACY_WEIGHTS_FILE,
    MODEL_TYPE,
    PREPROCESSOR_FILE,
    WEIGHTS_FILE,
    HiggsCodecConfig,
)
from .decoder import HiggsCodecDecoder
from .encoder import HiggsCodecEncoder, resample
from .graph import decoder_graph
from .random import write_legacy_codec, write_random_codec
from .streaming import chunk_window, context_frames, decode_chunk, decode_chunk_rows
from .weights import load_codec_decoder

__all__ = [
    "HiggsCodecConfig",
    "HiggsCodecDecoder",
    "HiggsCodecEncoder",
    "load_codec_decoder",
    "decoder_graph",
    "write_random_codec",
    "write_legacy_codec",
    "resample",
    "context_frames",
    "chunk_window",
    "decode_chunk",
    "decode_chunk_rows",
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "LEGACY_WEIGHTS_FILE",
    "PREPROCESSOR_FILE",
    "MODEL_TYPE",
]
