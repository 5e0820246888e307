"""The audio side of AuK's condition encoder: Qwen2.5-Omni's thinker audio tower.

A reference clip (16 kHz mono) becomes Whisper log-mel features exactly as the released
Qwen2.5-Omni processor makes them, and the tower turns those into one embedding of the
thinker's text width per `<|AUDIO|>` placeholder of the ChatML prompt.

What the processor does to one clip (preprocessor_config.json of Qwen2.5-Omni-3B: a
WhisperFeatureExtractor with feature_size 128, n_fft 400, hop 160, chunk_length 300, so
n_samples 4,800,000; the processor forces padding="max_length" and leaves truncation at
the extractor's default, True):
  * the waveform is cut to 300 s (4,800,000 samples) -- anything later is dropped without
    a warning -- and zero-padded to exactly 300 s;
  * the log-mel is taken over the padded waveform (so the frames at the clip's end see
    zeros, not Whisper's reflection, and the log floor is 8 below the maximum over all
    30,000 frames);
  * the attention mask keeps ceil(samples / 160) frames, and the thinker drops the rest
    before the tower runs.
`audio_features` reproduces that without computing 300 s of spectrogram (see there).

The tower (transformers' Qwen2_5OmniAudioEncoder) cuts the frames into windows of
2 * n_window (200) mel frames, the last one partial, and runs each window on its own: conv1
(k3) + GELU, conv2 (k3, stride 2) + GELU, sinusoidal positions restarting at 0 in every
window, then pre-LN transformer layers whose attention never crosses a window. The windows'
tokens are concatenated again, averaged in pairs (an odd last token is dropped), and
ln_post + proj give [tokens, output_dim]. So one token covers 4 mel frames = 40 ms.

Weights: the checkpoint's `thinker.audio_tower.*` with the prefix stripped. The sinusoid
table is not among them (a non-persistent buffer in Qwen's code), and `audio_bos_eos_token`
is (an unused [2, output_dim] embedding that strict loading must still accept).

torch only; no Triton, no transformers at run time.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...weights.checkpoint import CheckpointError, load_strict
from ...nn.mel import whisper_log_mel
from ...nn.sinusoids import sinusoid_table

SAMPLE_RATE = 16000
HOP_LENGTH = 160
N_FFT = 400
N_MELS = 128
# preprocessor_config.json: chunk_length 300 (s) -> n_samples 4,800,000, nb_max_frames 30,000
MAX_SECONDS = 300
MAX_SAMPLES = MAX_SECONDS * SAMPLE_RATE

# Qwen2_5OmniAudioEncoderConfig's defaults, so that a config missing a field reads as it
# would in transformers (the released 3B sets output_dim 2048; 3584 is the 7B's).
DEFAULTS = dict(num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20,
                encoder_ffn_dim=5120, d_model=1280, max_source_positions=1500, n_window=100,
                output_dim=3584, activation_function="gelu")


def feature_frame_count(samples: int) -> int:
    """Mel frames the processor keeps for a clip of `samples` 16 kHz samples: its attention
    mask samples the (300 s-truncated) waveform mask every 160 samples, i.e. ceil(n / 160)."""
    return -(-min(int(samples), MAX_SAMPLES) // HOP_LENGTH)


def tokens_for_frames(frames: int) -> int:
    """Tower outputs for `frames` mel frames: the stride-2 conv gives (f - 1) // 2 + 1, the
    pair pooling (n - 2) // 2 + 1 (= n // 2 for n >= 1). The processor and the thinker's
    rope index use this same arithmetic for the number of `<|AUDIO|>` tokens."""
    after_conv = (frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


def audio_token_count(samples: int) -> int:
    """How many `<|AUDIO|>` placeholders one clip of `samples` 16 kHz samples expands to
    (0 up to 320 samples, i.e. two frames;
    7,500 at the 300 s cap and beyond)."""
    return tokens_for_frames(feature_frame_count(samples)) if samples > 0 else 0


def audio_features(audio16k: np.ndarray) -> torch.Tensor:
    """[128, ceil(n / 160)] float32 log-mel of one 16 kHz mono clip, equal to the processor's
    input_features for it with the attention mask's padding frames removed.

    The processor pads to 300 s before the STFT. Two consequences matter and are kept here
    with far less padding: (1) kept frames near the end see zeros past the clip, and
    (2) the floor uses the maximum over all frames, including those after the mask that
    still overlap the clip's tail (a frame centred at t * 160 reads [t*160 - 200, t*160 + 200)).
    Every frame that does not overlap the clip is all zeros, i.e. log10(1e-10) = -10, the
    smallest value there is, so it cannot move the maximum. Padding the clip with 400 zeros
    (never past 300 s) therefore computes every overlapping frame exactly as the processor
    does -- the STFT's reflection at the new end only reflects zeros -- and the floor comes
    out the same; at the 300 s cap the padded length is the processor's own.
    """
    audio = np.asarray(audio16k, dtype=np.float32).reshape(-1)[:MAX_SAMPLES]
    if audio.size == 0:
        raise ValueError("audio_features: the clip is empty")
    padded = np.zeros(min(audio.size + N_FFT, MAX_SAMPLES), dtype=np.float32)
    padded[:audio.size] = audio
    mel = whisper_log_mel(padded, n_mels=N_MELS, n_fft=N_FFT, hop_length=HOP_LENGTH)
    return torch.from_numpy(np.ascontiguousarray(mel[:, :feature_frame_count(audio.size)]))


class _SelfAttention(nn.Module):
    # Names as in the checkpoint; k_proj alone has no bias (Whisper's layout).
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
        # x: [windows, length, width]; key_valid: [windows, length] or None when all windows are full
        w, n, d = x.shape

        def split(t):
            return t.view(w, n, self.heads, d // self.heads).transpose(1, 2)

        mask = None if key_valid is None else key_valid[:, None, None, :]
        # SDPA's default scale is head_dim ** -0.5, the tower's own.
        out = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)),
                                             split(self.v_proj(x)), attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(w, n, d))


class _EncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int):
        super().__init__()
        self.self_attn = _SelfAttention(width, heads)
        self.self_attn_layer_norm = nn.LayerNorm(width)
        self.final_layer_norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, ffn)
        self.fc2 = nn.Linear(ffn, width)

    def forward(self, x: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), key_valid)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioTower(nn.Module):
    """Qwen2.5-Omni's thinker audio tower: forward([num_mel_bins, frames]) -> [tokens, output_dim]
    for one clip, tokens = tokens_for_frames(frames). `config` is the thinker config's
    audio_config (Qwen2_5OmniAudioEncoderConfig fields)."""

    def __init__(self, config: dict):
        super().__init__()
        c = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
        if c["activation_function"] != "gelu":
            raise CheckpointError(f"audio tower: activation_function {c['activation_function']!r} "
                                  "is not supported (the released model uses 'gelu')")
        width, heads = int(c["d_model"]), int(c["encoder_attention_heads"])
        if width % heads or (width // 2) < 2:
            raise CheckpointError(f"audio tower: d_model {width} must split into "
                                  f"{heads} heads and hold a sinusoid table")
        self.n_mels, self.window = int(c["num_mel_bins"]), 2 * int(c["n_window"])
        # tokens per full window after the stride-2 conv; their positions must be in the table
        window_tokens = (self.window - 1) // 2 + 1
        if window_tokens > int(c["max_source_positions"]):
            raise CheckpointError(f"audio tower: n_window {c['n_window']} needs {window_tokens} "
                                  f"positions; max_source_positions is {c['max_source_positions']}")
        self.conv1 = nn.Conv1d(self.n_mels, width, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(width, width, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positions", sinusoid_table(window_tokens, width), persistent=False)
        # In the checkpoint but never used by the thinker's forward.
        self.audio_bos_eos_token = nn.Embedding(2, int(c["output_dim"]))
        self.layers = nn.ModuleList(_EncoderLayer(width, heads, int(c["encoder_ffn_dim"]))
                                    for _ in range(int(c["encoder_layers"])))
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Linear(width, int(c["output_dim"]))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.dim() != 2 or features.shape[0] != self.n_mels or features.shape[1] < 1:
            raise ValueError(f"AudioTower: expected features [{self.n_mels}, frames >= 1], "
                             f"got {tuple(features.shape)}")
        frames = features.shape[1]
        dtype = self.conv1.weight.dtype
        # Windows of self.window frames as a batch; the last one zero-padded. Zero frames
        # behave exactly like the convolutions' own zero padding, as long as conv1's output
        # is zeroed there too before conv2 reads it (its bias and GELU would not be zero).
        count = -(-frames // self.window)
        lengths = torch.full((count,), self.window, device=features.device)
        lengths[-1] = frames - (count - 1) * self.window
        x = F.pad(features.to(dtype), (0, count * self.window - frames))
        x = x.view(self.n_mels, count, self.window).transpose(0, 1)
        frame_valid = torch.arange(self.window, device=x.device)[None, :] < lengths[:, None]
        x = F.gelu(self.conv1(x)) * frame_valid[:, None, :].to(dtype)
        x = F.gelu(self.conv2(x)).transpose(1, 2)                 # [windows, tokens, width]
        x = x + self.positions[: x.shape[1]].to(dtype)          # restart at 0 in every window

        token_lengths = (lengths - 1) // 2 + 1
        token_valid = torch.arange(x.shape[1], device=x.device)[None, :] < token_lengths[:, None]
        # Attention stays inside a window; only a partial last window needs a key mask
        # (decided from `frames`, a host int, so no device sync).
        key_valid = None if frames % self.window == 0 else token_valid
        for layer in self.layers:
            x = layer(x, key_valid)

        x = x[token_valid]                                      # the windows' tokens, in order
        pairs = x.shape[0] // 2
        x = x[: 2 * pairs].view(pairs, 2, -1).mean(dim=1)
        return self.proj(self.ln_post(x))


def load_audio_tower(tensors: dict, config: dict) -> AudioTower:
    """An AudioTower in eval mode from the checkpoint's audio tower tensors, `thinker.audio_tower.`
    stripped (read_tensors(path, "thinker.audio_tower.")); every name and shape must match."""
    tower = AudioTower(config)
    load_strict(tower, tensors, "the thinker's audio tower (thinker.audio_tower.*)")
    return tower.eval()
