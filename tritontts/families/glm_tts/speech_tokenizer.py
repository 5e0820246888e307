"""GLM-TTS's speech tokenizer: a 16 kHz reference recording -> speech tokens (25 Hz, 32768).

The checkpoint's speech_tokenizer/ folder (GLM-4-Voice-tokenizer lineage) holds a WhisperVQ
model: config.json (Whisper's encoder fields plus the VQ ones), model.safetensors (tensors
`model.encoder.*`) and preprocessor_config.json (transformers' WhisperFeatureExtractor).
Ours, torch only, as upstream GLM-TTS computes it (utils/whisper_models/modeling_whisper.py,
utils/yaml_util.py's load_quantize_encoder, cosyvoice/cli/frontend.py's
SpeechTokenizer.extract_speech_token):

  audio -> 30 s segments -> Whisper log-mel of each, the waveform zero-padded to a whole
      number of tokens' samples (2 * pooling kernel * hop)            [mels, T]
    -> conv1 (k3) + GELU, conv2 (k3, stride 2) + GELU, + learned positions   [T/2, d]
    -> pre-LN Transformer layers 1..quantize_position, pooling (max or avg, kernel k)
       after layer pooling_position                                      [T/2k, d]
    -> nearest codebook row (squared L2) -> the tokens of real, not padding, frames

Details of upstream that the tokens depend on, kept here:
- encoder_causal_convolution: both convs pad 2 frames on the left only, none on the right.
- quantize_causal_block_size b (conv frames): a frame attends to every earlier frame and to
  its own block of b; after pooling the blocks are b // k. quantize_causal_encoder or
  encoder_causal_attention instead make attention plainly causal (and then upstream applies
  no padding mask at all: SDPA's is_causal replaces it).
- Padding frames go through the layers like real ones and the pooling window that straddles
  the end of the audio averages (or maxes) them in.
- The segments of one recording are padded together to the longest (upstream encodes them
  as one batch, up to 128), so a short last segment is padded to 30 s.
vLLM-Omni 0.30's WhisperVQEncoder implements none of these four (it zeroes padding frames
and pools each segment's real frames alone); where none applies the tokens agree.

Only what the tokens need is read: conv1, conv2, embed_positions, the layers before
quantize_position and the codebook. Later layers, layer_norm, embed_positions2 (used only
after the quantizer) and the EMA buffers of codebook training are left in the file.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...weights.checkpoint import (
    CheckpointError, ConfigFields, load_strict, read_json, require_dir, require_files)
from ...nn.mel import whisper_log_mel

WHAT = "GLM-TTS speech tokenizer"
CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
WEIGHTS_FILE = "model.safetensors"
PREFIX = "model.encoder."
SAMPLE_RATE = 16000
# Upstream slices recordings into 30 s pieces with literal constants, whatever the
# preprocessor's chunk_length, and encodes up to 128 of them as one padded batch.
SEGMENT_SAMPLES = 30 * SAMPLE_RATE
SEGMENTS_PER_BATCH = 128
CONV_STRIDE = 2             # conv1 stride 1 times conv2 stride 2, fixed by the architecture


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    num_mel_bins: int
    d_model: int
    attention_heads: int
    ffn_dim: int
    max_source_positions: int
    quantize_position: int          # layers kept; the codebook follows the last one
    vocab_size: int                 # codebook rows
    pooling_kernel: int             # 1: no pooling
    pooling_type: str               # "max" | "avg"
    pooling_position: int           # pooling follows this layer (1-based)
    causal_convolution: bool
    causal_attention: bool
    block_size: int | None          # block-causal attention, in conv frames
    # preprocessor_config.json
    n_fft: int
    hop_length: int
    chunk_samples: int              # the feature extractor's max_length (chunk_length * rate)
    padding_value: float

    @property
    def samples_per_token(self) -> int:
        return CONV_STRIDE * self.pooling_kernel * self.hop_length

    @property
    def token_rate(self) -> float:
        return SAMPLE_RATE / self.samples_per_token

    def padded_length(self, longest: int) -> int:
        """Samples the feature extractor pads a batch whose longest member has `longest`
        samples to (after its truncation to chunk_samples, itself rounded up)."""
        step = self.samples_per_token
        longest = min(longest, -(-self.chunk_samples // step) * step)
        return -(-longest // step) * step


def parse_config(root: Path) -> SpeechTokenizerConfig:
    """config.json and preprocessor_config.json of a speech_tokenizer/ folder, read as data.
    Absent optional fields take the defaults of upstream's WhisperVQConfig and transformers'
    WhisperFeatureExtractor, as upstream's from_pretrained would."""
    model = ConfigFields(read_json(root / CONFIG_FILE), root / CONFIG_FILE)
    pre = ConfigFields(read_json(root / PREPROCESSOR_FILE), root / PREPROCESSOR_FILE)
    d_model = model.int("d_model", low=1)
    heads = model.int("encoder_attention_heads", low=1)
    if d_model % heads:
        model.fail("encoder_attention_heads", f"({heads}) must divide d_model ({d_model})")
    if model.str("activation_function", "gelu") != "gelu":
        model.fail("activation_function", "must be gelu (the only one this encoder implements)")
    quantize_position = model.int("quantize_position", 16, low=1)
    encoder_layers = model.int("encoder_layers", None, low=1)
    if encoder_layers is not None and quantize_position > encoder_layers:
        model.fail("quantize_position", f"({quantize_position}) exceeds encoder_layers ({encoder_layers})")
    kernel = model.int("pooling_kernel_size", None, low=1)
    pooling_type = model.str("pooling_type", "max", choices=("max", "avg"))
    pooling_position = model.int("pooling_position", 0, low=0)
    # Upstream pools only after a layer (position >= 1) but always strides the token mask by
    # the kernel: another position would leave tokens and mask of different lengths.
    if kernel is not None and not 1 <= pooling_position <= quantize_position:
        model.fail("pooling_position", f"must be between 1 and quantize_position "
                   f"({quantize_position}) when pooling_kernel_size is set, got {pooling_position}")
    block = model.int("quantize_causal_block_size", None, low=1)
    if block is not None and kernel is not None and pooling_position < quantize_position \
            and block < kernel:
        model.fail("quantize_causal_block_size", f"({block}) is under pooling_kernel_size "
                   f"({kernel}): no block would be left after pooling")
    causal_attention = bool(model.bool("encoder_causal_attention", False)
                            or model.bool("quantize_causal_encoder", False))
    rate = pre.int("sampling_rate", 16000)
    if rate != SAMPLE_RATE:
        pre.fail("sampling_rate", f"must be {SAMPLE_RATE}, got {rate}")
    if pre.float("dither", 0.0) != 0.0:
        pre.fail("dither", "must be 0 (dithered features would make the tokens random)")
    pre.str("padding_side", "right", choices=("right",))
    n_mels = model.int("num_mel_bins", low=1)
    feature_size = pre.int("feature_size", 80, low=1)
    if feature_size != n_mels:
        pre.fail("feature_size", f"({feature_size}) differs from {CONFIG_FILE}'s num_mel_bins ({n_mels})")
    cfg = SpeechTokenizerConfig(
        num_mel_bins=n_mels, d_model=d_model, attention_heads=heads,
        ffn_dim=model.int("encoder_ffn_dim", low=1),
        max_source_positions=model.int("max_source_positions", 1500, low=1),
        quantize_position=quantize_position,
        vocab_size=model.int("quantize_vocab_size", low=1),
        pooling_kernel=kernel or 1, pooling_type=pooling_type,
        pooling_position=pooling_position if kernel is not None else 0,
        causal_convolution=model.bool("encoder_causal_convolution", False),
        causal_attention=causal_attention, block_size=block,
        n_fft=pre.int("n_fft", 400, low=2), hop_length=pre.int("hop_length", 160, low=1),
        chunk_samples=pre.int("chunk_length", 30, low=1) * SAMPLE_RATE,
        padding_value=pre.float("padding_value", 0.0))
    positions = cfg.padded_length(SEGMENT_SAMPLES) // cfg.hop_length // CONV_STRIDE
    if positions > cfg.max_source_positions:
        model.fail("max_source_positions", f"({cfg.max_source_positions}) is too small: a 30 s "
                   f"segment takes {positions} positions")
    return cfg


# ------------------------------------------------------------------------------ encoder

class _SelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)   # Whisper's keys have no bias
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape

        def heads(t):
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)),
                                           heads(self.v_proj(x)), attn_mask=allowed)
        return self.out_proj(y.transpose(1, 2).reshape(b, s, d))


class _Layer(nn.Module):
    def __init__(self, cfg: SpeechTokenizerConfig):
        super().__init__()
        self.self_attn = _SelfAttention(cfg.d_model, cfg.attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), allowed)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WhisperVQEncoder(nn.Module):
    """Whisper's encoder up to the quantizer, plus the codebook. Parameter names are the
    checkpoint's without `model.encoder.`."""

    def __init__(self, cfg: SpeechTokenizerConfig):
        super().__init__()
        self.cfg = cfg
        # Padding is applied in forward: centered or, for causal convolutions, left only.
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, cfg.d_model, 3)
        self.conv2 = nn.Conv1d(cfg.d_model, cfg.d_model, 3, stride=CONV_STRIDE)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, cfg.d_model)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.quantize_position))
        self.codebook = nn.Embedding(cfg.vocab_size, cfg.d_model)

    def _conv(self, conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(conv(F.pad(x, (2, 0) if self.cfg.causal_convolution else (1, 1))))

    def _allowed(self, valid: torch.Tensor, block: int | None) -> torch.Tensor:
        """Which keys each query may attend to, [B, 1, S or 1, S] (True: may)."""
        s = valid.shape[1]
        i = torch.arange(s, device=valid.device)
        earlier = i[None, :] <= i[:, None]
        if self.cfg.causal_attention:
            return earlier[None, None]
        keys = valid[:, None, None, :]
        if block is None:
            return keys
        return (earlier | (i[:, None] // block == i[None, :] // block))[None, None] & keys

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        k = self.cfg.pooling_kernel
        x = F.pad(x.transpose(1, 2), (0, -x.shape[1] % k))
        pool = F.max_pool1d if self.cfg.pooling_type == "max" else F.avg_pool1d
        return pool(x, k).transpose(1, 2)

    def forward(self, features: torch.Tensor, frame_valid: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-mel [B, mels, T] and which of its frames are real [B, T] -> the quantizer's
        input [B, T / (2 k), d] and which of its positions are real."""
        cfg = self.cfg
        x = self._conv(self.conv2, self._conv(self.conv1, features)).transpose(1, 2)
        if x.shape[1] > cfg.max_source_positions:
            raise ValueError(f"{x.shape[1]} encoder positions; the model has {cfg.max_source_positions}")
        x = x + self.embed_positions.weight[:x.shape[1]]
        valid = frame_valid[:, ::CONV_STRIDE]
        block = cfg.block_size
        allowed = self._allowed(valid, block)
        for index, layer in enumerate(self.layers, start=1):
            x = layer(x, allowed)
            if index == cfg.pooling_position:
                x, valid = self._pool(x), valid[:, ::cfg.pooling_kernel]
                block = None if block is None else block // cfg.pooling_kernel
                allowed = self._allowed(valid, block)
        return x, valid

    def quantize(self, hidden: torch.Tensor) -> torch.Tensor:
        """Nearest codebook rows of [..., d], by |c|^2 + |h|^2 - 2 h.c as upstream computes
        it (the same rounding, so near-ties resolve alike)."""
        codebook = self.codebook.weight
        flat = hidden.reshape(-1, codebook.shape[1])
        distances = torch.addmm((codebook ** 2).sum(dim=1) + (flat ** 2).sum(dim=1, keepdim=True),
                                flat, codebook.t(), alpha=-2.0, beta=1.0)
        return distances.min(dim=1).indices.view(hidden.shape[:-1])


# ---------------------------------------------------------------------------- tokenizer

@dataclass(frozen=True)
class SpeechTokens:
    tokens: np.ndarray      # int32 [N]
    hidden: np.ndarray      # float32 [N, d]: the quantizer's input at those N positions


def _weight_files(root: Path) -> list[Path]:
    # Upstream reads every model*.safetensors (a sharded file included).
    files = sorted(p for p in root.glob("model*.safetensors") if p.is_file())
    if not files:
        require_files(root, (WEIGHTS_FILE,), WHAT)
    return files


def _read_weights(files: list[Path], wanted: set[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    tensors = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for key in f.keys():
                    name = key[len(PREFIX):] if key.startswith(PREFIX) else None
                    if name in wanted:
                        tensors[name] = f.get_tensor(key).float()
        except Exception as exc:  # noqa: BLE001 - any failure is a bad file
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    return tensors


class WhisperVQSpeechTokenizer:
    """A speech_tokenizer/ folder, loaded: `tokens(audio_16k)` gives its speech tokens."""

    def __init__(self, checkpoint_dir: str | Path, device: str | torch.device = "cpu"):
        root = require_dir(checkpoint_dir, WHAT)
        require_files(root, (CONFIG_FILE, PREPROCESSOR_FILE), WHAT)
        self.root = root
        self.config = parse_config(root)
        files = _weight_files(root)
        encoder = WhisperVQEncoder(self.config)
        tensors = _read_weights(files, set(encoder.state_dict()))
        where = files[0] if len(files) == 1 else root / "model*.safetensors"
        load_strict(encoder, tensors, f"{where} (tensors under {PREFIX!r})")
        self.device = torch.device(device)
        self.encoder = encoder.to(self.device).eval()

    def segment_features(self, audio_16k: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per 30 s segment: its log-mel [mels, T] and which frames are real [T] (bool), as
        WhisperFeatureExtractor gives them for upstream's batches (padding "longest",
        pad_to_multiple_of one token's samples, the attention mask at frame rate)."""
        cfg = self.config
        audio = np.asarray(audio_16k, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"expected mono audio [samples], got shape {audio.shape}")
        segments = [audio[i:i + SEGMENT_SAMPLES] for i in range(0, audio.size, SEGMENT_SAMPLES)]
        out = []
        for start in range(0, len(segments), SEGMENTS_PER_BATCH):
            batch = segments[start:start + SEGMENTS_PER_BATCH]
            length = cfg.padded_length(max(s.size for s in batch))
            for segment in batch:
                segment = segment[:length]
                padded = np.full(length, cfg.padding_value, np.float32)
                padded[:segment.size] = segment
                features = whisper_log_mel(padded, cfg.num_mel_bins, cfg.n_fft, cfg.hop_length)
                out.append((features, np.arange(features.shape[1]) * cfg.hop_length < segment.size))
        return out

    @torch.inference_mode()
    def encode(self, audio_16k: np.ndarray) -> SpeechTokens:
        """The tokens of `audio_16k` (mono, 16 kHz) and the quantizer's input at each."""
        tokens, hidden = [], []
        for features, frame_valid in self.segment_features(audio_16k):
            x, valid = self.encoder(torch.from_numpy(features)[None].to(self.device),
                                    torch.from_numpy(frame_valid)[None].to(self.device))
            # Quantize every position, padding too, as upstream does: a matmul over other
            # rows could round a near-tie differently.
            ids = self.encoder.quantize(x)
            tokens.append(ids[valid].to(torch.int32).cpu())
            hidden.append(x[valid].float().cpu())
        d = self.config.d_model
        return SpeechTokens(
            torch.cat(tokens).numpy() if tokens else np.zeros(0, np.int32),
            torch.cat(hidden).numpy() if hidden else np.zeros((0, d), np.float32))

    def tokens(self, audio_16k: np.ndarray) -> np.ndarray:
        """Speech tokens (int32 [N], about 25 per second) of mono 16 kHz audio."""
        return self.encode(audio_16k).tokens


# ------------------------------------------------------------------ random checkpoints

# The released GLM-TTS speech tokenizer's config is not published outside the checkpoint.
# Known: it is GLM-4-Voice-tokenizer's WhisperVQ (whisper-large-v3 encoder: d_model 1280,
# 20 heads, ffn 5120, 32 layers, 1500 positions, 128 mel bins; quantizer after layer 16)
# retrained for 25 Hz tokens from a 32768-row codebook (GLM-TTS's LLM vocabulary). Inferred:
# pooling kernel 2 (16000 / (160 * 2 * 2) = 25 Hz), and the rest as GLM-4-Voice-tokenizer's
# config.json has it (average pooling after layer 16, causal convolutions, 200-frame
# block-causal attention, EMA codebook training with decay 0.99).
_RELEASED = dict(d_model=1280, encoder_attention_heads=20, encoder_ffn_dim=5120,
                 encoder_layers=32, quantize_position=16, pooling_position=16,
                 quantize_vocab_size=32768)
# Tiny widths, the released flags; the pooling sits between two layers (position 2 of 3)
# so that the block size after pooling is used too.
_TINY = dict(d_model=64, encoder_attention_heads=4, encoder_ffn_dim=128, encoder_layers=4,
             quantize_position=3, pooling_position=2, quantize_vocab_size=512)


def random_speech_tokenizer_config(size: str = "tiny", overrides: dict | None = None
                                   ) -> tuple[dict, dict]:
    """config.json and preprocessor_config.json of a random speech tokenizer, all fields
    as transformers' save_pretrained writes the released kind."""
    if size not in ("tiny", "released"):
        raise ValueError(f"size must be 'tiny' or 'released', got {size!r}")
    sizes = _TINY if size == "tiny" else _RELEASED
    config = {
        "architectures": ["WhisperVQEncoder"], "model_type": "whisper",
        "activation_function": "gelu", "activation_dropout": 0.0, "attention_dropout": 0.0,
        "dropout": 0.0, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
        "apply_spec_augment": False, "scale_embedding": False, "init_std": 0.02,
        "num_mel_bins": 128, "max_source_positions": 1500, "max_target_positions": 448,
        "vocab_size": 51866, "pad_token_id": 50256, "bos_token_id": 50257,
        "eos_token_id": 50257, "decoder_start_token_id": 50258,
        "decoder_layers": sizes["encoder_layers"],
        "decoder_attention_heads": sizes["encoder_attention_heads"],
        "decoder_ffn_dim": sizes["encoder_ffn_dim"], "num_hidden_layers": sizes["encoder_layers"],
        "d_model": sizes["d_model"], "encoder_attention_heads": sizes["encoder_attention_heads"],
        "encoder_ffn_dim": sizes["encoder_ffn_dim"], "encoder_layers": sizes["encoder_layers"],
        "pooling_kernel_size": 2, "pooling_type": "avg",
        "pooling_position": sizes["pooling_position"],
        "quantize_vocab_size": sizes["quantize_vocab_size"],
        "quantize_position": sizes["quantize_position"],
        "quantize_commit_coefficient": 0.25, "quantize_loss_scale": 10.0,
        "quantize_ema_decay": 0.99, "quantize_restart_interval": 100,
        "quantize_encoder_only": False, "quantize_causal_encoder": False,
        "quantize_causal_block_size": 200, "encoder_causal_attention": False,
        "encoder_causal_convolution": True, "skip_language_detection": True,
        "torch_dtype": "float32", "use_cache": True,
    }
    config.update(overrides or {})
    preprocessor = {
        "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": config["num_mel_bins"], "hop_length": 160, "n_fft": 400,
        "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
        "padding_value": 0.0, "processor_class": "WhisperProcessor",
        "return_attention_mask": False, "sampling_rate": 16000,
    }
    return config, preprocessor


def checkpoint_shapes(config: dict, layers: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor of model.safetensors for `config` (a config.json dict): the encoder's
    first `layers` layers (default all; layer_norm only with all of them), the codebook,
    embed_positions2 and, with quantize_ema_decay, the EMA buffers."""
    d, ffn, vocab = config["d_model"], config["encoder_ffn_dim"], config["quantize_vocab_size"]
    positions = config["max_source_positions"]
    total = config["encoder_layers"]
    layers = total if layers is None else layers
    shapes = {"conv1.weight": (d, config["num_mel_bins"], 3), "conv1.bias": (d,),
              "conv2.weight": (d, d, 3), "conv2.bias": (d,), "embed_positions.weight": (positions, d)}
    for i in range(layers):
        for name, shape in (("self_attn.q_proj.weight", (d, d)), ("self_attn.q_proj.bias", (d,)),
                            ("self_attn.k_proj.weight", (d, d)), ("self_attn.v_proj.weight", (d, d)),
                            ("self_attn.v_proj.bias", (d,)), ("self_attn.out_proj.weight", (d, d)),
                            ("self_attn.out_proj.bias", (d,)), ("self_attn_layer_norm.weight", (d,)),
                            ("self_attn_layer_norm.bias", (d,)), ("fc1.weight", (ffn, d)),
                            ("fc1.bias", (ffn,)), ("fc2.weight", (d, ffn)), ("fc2.bias", (d,)),
                            ("final_layer_norm.weight", (d,)), ("final_layer_norm.bias", (d,))):
            shapes[f"layers.{i}.{name}"] = shape
    if layers == total:
        shapes.update({"layer_norm.weight": (d,), "layer_norm.bias": (d,)})
    kernel = config.get("pooling_kernel_size") or 1
    shapes.update({"codebook.weight": (vocab, d),
                   "embed_positions2.weight": (math.ceil(positions / kernel), d)})
    if config.get("quantize_ema_decay") is not None:
        shapes.update({"ema_count": (vocab,), "ema_weight": (vocab, d)})
    return {PREFIX + k: v for k, v in shapes.items()}


def _random_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for key, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        if key.endswith("norm.weight"):
            tensors[key] = 1.0 + 0.1 * noise
        elif key.endswith("ema_count"):
            tensors[key] = 1.0 + noise.abs()
        else:
            tensors[key] = 0.05 * noise
    # As upstream initialises them: the post-quantizer positions start as the encoder's,
    # the EMA sums as the codebook times the counts.
    pos2 = PREFIX + "embed_positions2.weight"
    tensors[pos2] = tensors[PREFIX + "embed_positions.weight"][:shapes[pos2][0]].clone()
    if PREFIX + "ema_weight" in tensors:
        tensors[PREFIX + "ema_weight"] = (tensors[PREFIX + "codebook.weight"]
                                          * tensors[PREFIX + "ema_count"][:, None])
    return tensors


def write_random_speech_tokenizer(out_dir: str | Path, seed: int = 0, size: str = "tiny",
                                  overrides: dict | None = None, weights: bool = True) -> Path:
    """A speech_tokenizer/ folder with seeded random float32 weights, in the released layout
    (config.json, model.safetensors with `model.encoder.*`, preprocessor_config.json).
    size "tiny" (d_model 64, 3 of 4 layers before the quantizer, 512 codes; the released
    flags) or "released" (see _RELEASED; about 1.6 GB). `overrides` replace config.json
    fields. The tiny file holds the whole encoder (later layers, layer_norm), as a full
    WhisperVQ checkpoint would; the released one stops at the quantizer, to stay smaller.
    weights=False writes the two JSON files only. Returns the folder."""
    from ...weights.random_weights import save_safetensors

    config, preprocessor = random_speech_tokenizer_config(size, overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    (out / PREPROCESSOR_FILE).write_text(json.dumps(preprocessor, indent=2) + "\n")
    if weights:
        layers = None if size == "tiny" else config["quantize_position"]
        tensors = _random_tensors(checkpoint_shapes(config, layers), seed)
        _spread_codebook(parse_config(out), tensors, seed)
        save_safetensors(tensors, out / WEIGHTS_FILE, torch.float32)
    return out


@torch.no_grad()
def _spread_codebook(cfg: SpeechTokenizerConfig, tensors: dict[str, torch.Tensor], seed: int) -> None:
    """Redraw the codebook from the distribution of the quantizer's inputs on a test signal
    (per-dimension mean and spread), as a trained codebook follows them. Random rows instead
    sit far from those inputs, whose shared mean then picks the same two or three codes
    for every frame, and a parity test would compare little."""
    with torch.device("meta"):
        encoder = WhisperVQEncoder(cfg)
    encoder.load_state_dict({k: tensors[PREFIX + k] for k in encoder.state_dict()}, assign=True)
    generator = torch.Generator().manual_seed(seed + 1)
    t = torch.arange(2 * SAMPLE_RATE) / SAMPLE_RATE
    audio = (0.3 * torch.sin(2 * math.pi * (150 + 100 * torch.sin(2 * math.pi * 0.7 * t)) * t)
             * (1 + torch.sin(2 * math.pi * 3 * t)) + 0.05 * torch.randn(t.shape, generator=generator))
    features = whisper_log_mel(audio.numpy(), cfg.num_mel_bins, cfg.n_fft, cfg.hop_length)
    hidden, _ = encoder(torch.from_numpy(features)[None], torch.ones(1, features.shape[1], dtype=torch.bool))
    hidden = hidden[0]
    noise = torch.randn((cfg.vocab_size, cfg.d_model), generator=generator)
    codebook = hidden.mean(dim=0) + hidden.std(dim=0) * noise
    tensors[PREFIX + "codebook.weight"] = codebook
    if PREFIX + "ema_weight" in tensors:
        tensors[PREFIX + "ema_weight"] = codebook * tensors[PREFIX + "ema_count"][:, None]


__all__ = ["SpeechTokenizerConfig", "SpeechTokens", "WhisperVQEncoder", "WhisperVQSpeechTokenizer",
           "checkpoint_shapes", "parse_config", "random_speech_tokenizer_config",
           "write_random_speech_tokenizer"]
