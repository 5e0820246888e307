"""Reference codes for Qwen3-TTS in-context voice cloning: 24 kHz audio -> [frames, 16] codes
of the 12 Hz speech tokenizer (Qwen3-TTS-Tokenizer-12Hz), one frame per 1920 samples.

The tokenizer's encoder is Kyutai's Mimi (causal SEANet convolutions, a causal transformer,
a stride-2 downsample to 12.5 Hz, then a split residual VQ: 1 semantic + acoustic
codebooks). The checkpoint stores it as a transformers `MimiModel` without its decoder half,
under `encoder.` in speech_tokenizer/model.safetensors, configured by
speech_tokenizer/config.json `encoder_config` (a MimiConfig). So we build it from
transformers' MimiModel, the class the reference runs, rather than a re-implementation
(same numerics, sliding-window attention and padding rules included, and transformers'
own tests behind it); what is ours is the loading (strict, named errors, only `encoder.*`
read), the decoder-less build, and the framing rule below.

Checkpoint files (under <root>/speech_tokenizer/):
  config.json              encoder_config, encoder_valid_num_quantizers (16 of the
                           encoder's 32 codebooks are used), input_sample_rate (24000),
                           encode_downsample_rate (1920)
  preprocessor_config.json EncodecFeatureExtractor: feature_size 1, sampling_rate 24000,
                           no chunking: the features are the raw waveform
  model.safetensors        encoder.* (and the decoder.* we leave unread)

Framing: the reference keeps ceil(samples / encode_downsample_rate) frames (its feature
extractor right-pads a batch to one length; we encode one clip at a time, so nothing is
padded), so 3 s of audio give ceil(72000 / 1920) = 38 frames.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...weights.checkpoint import CheckpointError, load_strict, require_dir, require_files
from ...protocol import InvalidRequest
from .speaker_encoder import read_json, read_safetensors

TOKENIZER_DIR = "speech_tokenizer"
CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
WEIGHTS_FILE = "model.safetensors"
PREFIX = "encoder."


@dataclass(frozen=True)
class SpeechEncoderConfig:
    encoder_config: dict          # MimiConfig keyword arguments, as the checkpoint states them
    valid_num_quantizers: int = 16
    sample_rate: int = 24000
    downsample_rate: int = 1920

    def mimi_config(self):
        from transformers import MimiConfig

        return MimiConfig(**self.encoder_config)

    def problem(self) -> str | None:
        mimi = self.mimi_config()
        if not mimi.num_semantic_quantizers <= self.valid_num_quantizers <= mimi.num_quantizers:
            return (f"encoder_valid_num_quantizers {self.valid_num_quantizers} is outside "
                    f"{mimi.num_semantic_quantizers}..{mimi.num_quantizers} (encoder_config)")
        if mimi.sampling_rate != self.sample_rate:
            return (f"encoder_config.sampling_rate {mimi.sampling_rate} != "
                    f"input_sample_rate {self.sample_rate}")
        if mimi.frame_rate == mimi.encodec_frame_rate:
            return (f"encoder_config frame_rate {mimi.frame_rate} is the convolutions' own rate: "
                    "MimiModel then has no downsample stage and cannot encode")
        # MimiModel's convolutions stride by prod(upsampling_ratios), its downsample by 2.
        frame = 2 * int(np.prod(mimi.upsampling_ratios))
        if frame != self.downsample_rate:
            return (f"encode_downsample_rate {self.downsample_rate} != the encoder's frame of "
                    f"{frame} samples (upsampling_ratios {list(mimi.upsampling_ratios)}, "
                    f"frame_rate {mimi.frame_rate})")
        return None


class SpeechEncoder(nn.Module):
    """Mimi's encoder half. Its state dict is the checkpoint's `encoder.*` keys exactly:
    encoder.encoder.* (SEANet), encoder.encoder_transformer.*, encoder.downsample.*,
    encoder.quantizer.{semantic,acoustic}_residual_vector_quantizer.*."""

    def __init__(self, config: SpeechEncoderConfig):
        super().__init__()
        from transformers import MimiModel

        problem = config.problem()
        if problem:
            raise ValueError(problem)
        self.config = config
        self.encoder = MimiModel(config.mimi_config())
        # Codes never go back to audio here; the decoder half has no weights under encoder.*.
        self.encoder.upsample = self.encoder.decoder_transformer = self.encoder.decoder = None
        self.eval()

    def forget_codebook_cache(self) -> None:
        """Mimi caches each codebook's centroids (embed_sum / cluster_usage) as a plain
        attribute on first use; after new weights, a dtype or a device, they must be redone."""
        for module in self.modules():
            if hasattr(module, "_embed") and hasattr(module, "embed_sum"):
                module._embed = None

    def _apply(self, fn, *args, **kwargs):
        # .to()/.cuda()/.half() go through here; the centroid cache would keep the old ones.
        result = super()._apply(fn, *args, **kwargs)
        self.forget_codebook_cache()
        return result

    def num_frames(self, num_samples: int) -> int:
        return math.ceil(num_samples / self.config.downsample_rate)

    @torch.inference_mode()
    def encode(self, audio24k: np.ndarray | torch.Tensor) -> torch.Tensor:
        """[frames, valid_num_quantizers] int64 codes (on the module's device) of one mono
        clip at input_sample_rate; frames = ceil(samples / encode_downsample_rate)."""
        weight = self.encoder.downsample.conv.weight
        # In the module's dtype, as the reference casts its input values to the model's.
        x = torch.as_tensor(audio24k).to(device=weight.device, dtype=weight.dtype)
        if x.ndim != 1 or x.numel() == 0:
            raise InvalidRequest(f"reference audio must be one non-empty mono channel, "
                                 f"got shape {tuple(x.shape)}")
        # Only the kept codebooks are computed: residual VQ is sequential, so the first 16 of
        # 32 are the same either way.
        codes = self.encoder.encode(x[None, None], num_quantizers=self.config.valid_num_quantizers,
                                    return_dict=True).audio_codes[0]
        frames = self.num_frames(x.numel())
        if codes.shape[-1] < frames:
            raise RuntimeError(f"the encoder gave {codes.shape[-1]} frames for {x.numel()} "
                               f"samples, fewer than {frames}")
        return codes[:, :frames].T.to(torch.int64).contiguous()


def read_speech_encoder_config(directory: Path) -> SpeechEncoderConfig:
    """SpeechEncoderConfig from a speech tokenizer directory's config.json and
    preprocessor_config.json; absent top-level fields take the reference's defaults."""
    path = directory / CONFIG_FILE
    raw = read_json(path)
    encoder_config = raw.get("encoder_config")
    if not isinstance(encoder_config, dict):
        raise CheckpointError(f"{path}: no encoder_config object")
    try:
        config = SpeechEncoderConfig(
            encoder_config, int(raw.get("encoder_valid_num_quantizers", 16)),
            int(raw.get("input_sample_rate", 24000)), int(raw.get("encode_downsample_rate", 1920)))
        problem = config.problem()
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    pre_path = directory / PREPROCESSOR_FILE
    pre = read_json(pre_path)
    # The reference feeds the feature extractor's input_values to the encoder; with one mono
    # channel and no chunking those are the waveform itself, which is what encode() takes.
    if pre.get("feature_size", 1) != 1 or pre.get("chunk_length_s") is not None:
        raise CheckpointError(f"{pre_path}: expected a mono extractor without chunking "
                              f"(feature_size 1, chunk_length_s null)")
    if pre.get("sampling_rate", config.sample_rate) != config.sample_rate:
        raise CheckpointError(f"{pre_path}: sampling_rate {pre.get('sampling_rate')} != "
                              f"input_sample_rate {config.sample_rate} of {path}")
    return config


def load_speech_encoder(root: str | Path, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> SpeechEncoder:
    """The speech tokenizer's encoder from a Qwen3-TTS checkpoint directory (files under
    speech_tokenizer/), loaded strictly, in eval mode on `device` as `dtype`."""
    root = require_dir(root, "Qwen3-TTS")
    directory = root / TOKENIZER_DIR
    require_files(root, [f"{TOKENIZER_DIR}/{name}" for name in
                         (CONFIG_FILE, PREPROCESSOR_FILE, WEIGHTS_FILE)], "Qwen3-TTS")
    model = SpeechEncoder(read_speech_encoder_config(directory))
    load_strict(model, read_safetensors(directory / WEIGHTS_FILE, PREFIX),
                f"{directory / WEIGHTS_FILE} ({PREFIX}*)")
    model.forget_codebook_cache()
    return model.to(device=device, dtype=dtype).eval()
