"""Forced alignment with Qwen3-ForcedAligner (the layout of Qwen/Qwen3-ForcedAligner-0.6B,
read from a path), in plain PyTorch: the words of the request's text get start and end
times from one forward pass over the audio and the text, no decoding loop.

The checkpoint, as qwen-asr's `Qwen3ForcedAligner.from_pretrained` reads it:
  config.json              model_type "qwen3_asr"; `thinker_config` holds `audio_config`
                           (the audio encoder), `text_config` (a Qwen3 decoder), `classify_num`
                           (timestamp classes) and `audio_token_id`; at the top,
                           `timestamp_token_id`, `timestamp_segment_time` (ms per class) and
                           optionally `support_languages`
  model.safetensors        thinker.audio_tower.*, thinker.model.* (embed_tokens, layers, norm),
                           thinker.lm_head.weight [classify_num, hidden]
  vocab.json, merges.txt,  Qwen2's byte-level BPE, with <|audio_start|>, <|audio_pad|>,
  tokenizer_config.json    <|audio_end|> and <timestamp> among its added tokens
  preprocessor_config.json WhisperFeatureExtractor, 128 mel bins

What one pass computes (qwen-asr 0.0.6's `Qwen3ForcedAligner.align`):
  * the audio (16 kHz) as Whisper's log-mel over the audio itself (no 30 s padding);
  * the audio encoder: the mel frames cut into chunks of 2 * n_window (100) frames, the last
    one partial; three stride-2 3x3 conv2d + GELU over each chunk (a chunk of 100 frames
    gives 13 tokens), a linear to d_model, sinusoidal positions restarting in every chunk;
    the chunks' valid tokens concatenated, pre-LN transformer layers whose attention stays
    inside windows of (the longest chunk's tokens) * n_window_infer / (2 * n_window) tokens,
    then ln_post, proj1, GELU, proj2 to the decoder's width;
  * the text "<|audio_start|>" + one "<|audio_pad|>" per audio token + "<|audio_end|>" + the
    words joined by "<timestamp><timestamp>" + "<timestamp><timestamp>", tokenized; the pads'
    embeddings replaced by the encoder's tokens; a causal Qwen3 decoder (the config's
    multimodal RoPE sections all see the same positions, so it is plain 1-D RoPE); the head
    `lm_head` scores classify_num classes at every position;
  * at each <timestamp> (a word's start, then its end) the argmax class times
    timestamp_segment_time is a time in ms; times that run backwards are repaired
    (`repair_times`); here also clamped to the audio's length.

Languages: the checkpoint's `support_languages`, else the 11 the model card lists
(tritontts.alignment.languages). Words are
the request text's own (tritontts.alignment.words, split as vLLM-Omni splits them), for every
language; qwen-asr splits Japanese and Korean with nagisa and soynlp instead, which are not
dependencies here.

torch + transformers' tokenizer only; no Triton."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.mel import whisper_log_mel
from ..nn.qwen3 import Qwen3Stack
from ..nn.qwen3_shape import Qwen3Shape
from ..nn.sinusoids import sinusoid_table
from ..weights.checkpoint import CheckpointError
from .stream import WindowAligner

SAMPLE_RATE = 16000
MEL_HOP = 160
N_FFT = 400                     # Whisper's STFT window
WINDOW_SECONDS = 30             # audio aligned in one pass by the stream logic (tritontts.alignment.stream)
MAX_TEXT_TOKENS = 1000          # word tokens in one pass (a 30 s window holds far fewer words)
AUDIO_START, AUDIO_PAD, AUDIO_END, TIMESTAMP = "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>", "<timestamp>"
# The audio encoder's fields and qwen-asr's defaults for those a config leaves out.
ENCODER_DEFAULTS = dict(num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                        d_model=1280, n_window=100, output_dim=3584, n_window_infer=400,
                        downsample_hidden_size=480, activation_function="gelu")


@dataclass(frozen=True)
class AlignerConfig:
    encoder: dict
    text: Qwen3Shape
    classes: int
    audio_token_id: int
    timestamp_token_id: int
    segment_ms: float

    @classmethod
    def read(cls, root: Path) -> "AlignerConfig":
        path = Path(root) / "config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: {exc}") from None

        def need(table: dict, key: str, where: str):
            if key not in table:
                raise CheckpointError(f"{path}: {where}{key} is missing")
            return table[key]

        thinker = need(config, "thinker_config", "")
        text = need(thinker, "text_config", "thinker_config.")
        encoder = {**ENCODER_DEFAULTS, **{k: v for k, v in need(thinker, "audio_config", "thinker_config.").items()
                                          if k in ENCODER_DEFAULTS}}
        if encoder["activation_function"] != "gelu":
            raise CheckpointError(f"{path}: thinker_config.audio_config.activation_function "
                                         f"{encoder['activation_function']!r}: only gelu is implemented")
        sections = (text.get("rope_scaling") or {}).get("mrope_section")
        if sections is not None and sum(sections) * 2 != text.get("head_dim", 128):
            raise CheckpointError(f"{path}: text_config.rope_scaling.mrope_section {sections} does not "
                                         f"cover head_dim {text.get('head_dim')}")
        heads = need(text, "num_attention_heads", "thinker_config.text_config.")
        shape = Qwen3Shape(
            vocab_size=need(text, "vocab_size", "thinker_config.text_config."),
            hidden_size=need(text, "hidden_size", "thinker_config.text_config."),
            intermediate_size=need(text, "intermediate_size", "thinker_config.text_config."),
            num_hidden_layers=need(text, "num_hidden_layers", "thinker_config.text_config."),
            num_attention_heads=heads,
            num_key_value_heads=text.get("num_key_value_heads", heads),
            head_dim=text.get("head_dim", 128),
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            rope_theta=text.get("rope_theta", 5000000.0),
            attention_bias=bool(text.get("attention_bias", False)),
            max_position_embeddings=text.get("max_position_embeddings", 128000))
        return cls(encoder=encoder, text=shape, classes=need(thinker, "classify_num", "thinker_config."),
                   audio_token_id=thinker.get("audio_token_id", 151646),
                   timestamp_token_id=need(config, "timestamp_token_id", ""),
                   segment_ms=float(config.get("timestamp_segment_time", 80)))


def tokens_after_convs(frames: int) -> int:
    """Tokens the three stride-2 convolutions make of `frames` mel frames of one chunk."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


def audio_token_count(frames: int, n_window: int) -> int:
    """Audio tokens for `frames` mel frames: 13 per full chunk of 2 * n_window, plus the tail's."""
    chunk = 2 * n_window
    return (frames // chunk) * tokens_after_convs(chunk) + tokens_after_convs(frames % chunk)


class _WindowAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: Tensor, window: int) -> Tensor:
        """x [tokens, width]; attention within consecutive blocks of `window` tokens."""
        t, width = x.shape
        split = lambda proj: proj(x).view(t, self.heads, width // self.heads).transpose(0, 1)
        q, k, v = split(self.q_proj), split(self.k_proj), split(self.v_proj)
        blocks = [F.scaled_dot_product_attention(q[:, i:i + window], k[:, i:i + window], v[:, i:i + window])
                  for i in range(0, t, window)]
        return self.out_proj(torch.cat(blocks, dim=1).transpose(0, 1).reshape(t, width))


class _EncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int):
        super().__init__()
        self.self_attn = _WindowAttention(width, heads)
        self.self_attn_layer_norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, ffn)
        self.fc2 = nn.Linear(ffn, width)
        self.final_layer_norm = nn.LayerNorm(width)

    def forward(self, x: Tensor, window: int) -> Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), window)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    """Log-mel [mels, frames] -> [audio tokens, output_dim] (see the module's docstring).
    Parameter names are the checkpoint's under `thinker.audio_tower.`."""

    def __init__(self, cfg: dict):
        super().__init__()
        width, channels = cfg["d_model"], cfg["downsample_hidden_size"]
        self.n_window = cfg["n_window"]
        self.windows_per_attention = cfg["n_window_infer"] // (2 * self.n_window)
        self.conv2d1 = nn.Conv2d(1, channels, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(channels, channels, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(channels, channels, 3, 2, padding=1)
        self.conv_out = nn.Linear(channels * tokens_after_convs(cfg["num_mel_bins"]), width, bias=False)
        # Every chunk is padded to 2 * n_window frames, so its positions are always these.
        self.register_buffer("positions", sinusoid_table(tokens_after_convs(2 * self.n_window), width),
                             persistent=False)
        self.layers = nn.ModuleList(_EncoderLayer(width, cfg["encoder_attention_heads"], cfg["encoder_ffn_dim"])
                                    for _ in range(cfg["encoder_layers"]))
        self.ln_post = nn.LayerNorm(width)
        self.proj1 = nn.Linear(width, width)
        self.proj2 = nn.Linear(width, cfg["output_dim"])

    def forward(self, mel: Tensor) -> Tensor:
        mels, frames = mel.shape
        chunk = 2 * self.n_window
        count = max(1, math.ceil(frames / chunk))
        padded = F.pad(mel, (0, count * chunk - frames))
        x = padded.view(mels, count, chunk).permute(1, 0, 2).unsqueeze(1)     # [chunks, 1, mels, chunk]
        x = F.gelu(self.conv2d3(F.gelu(self.conv2d2(F.gelu(self.conv2d1(x))))))
        chunks, channels, bins, steps = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(chunks, steps, channels * bins))
        x = x + self.positions.to(x.dtype)
        kept = [tokens_after_convs(chunk)] * (count - 1) + [tokens_after_convs(frames - (count - 1) * chunk)]
        tokens = torch.cat([x[i, :n] for i, n in enumerate(kept)])
        window = max(kept) * self.windows_per_attention
        for layer in self.layers:
            tokens = layer(tokens, window)
        return self.proj2(F.gelu(self.proj1(self.ln_post(tokens))))


class ForcedAlignerNetwork(nn.Module):
    """Audio encoder, Qwen3 decoder and timestamp head: (token ids [T], log-mel) -> logits
    [T, classes]. Parameter names are the checkpoint's under `thinker.`."""

    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.audio_token_id = cfg.audio_token_id
        self.audio_tower = AudioEncoder(cfg.encoder)
        self.model = _TextModel(cfg.text)
        self.lm_head = nn.Linear(cfg.text.hidden_size, cfg.classes, bias=False)

    def forward(self, ids: Tensor, mel: Tensor) -> Tensor:
        audio = self.audio_tower(mel)
        embeds = self.model.embed_tokens(ids)
        at = ids == self.audio_token_id
        if int(at.sum()) != audio.shape[0]:
            raise ValueError(f"{int(at.sum())} audio placeholders for {audio.shape[0]} audio tokens")
        embeds = embeds.masked_scatter(at[:, None], audio.to(embeds.dtype))
        return self.lm_head(self.model(embeds[None])[0])


class _TextModel(Qwen3Stack):
    def __init__(self, shape: Qwen3Shape):
        super().__init__(shape)
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)


def repair_times(times: list[float]) -> list[int]:
    """Predicted times (ms, a word's start then its end, word after word) made non-decreasing
    as qwen-asr makes them: the longest non-decreasing subsequence is kept (the first one the
    O(n^2) search finds, ties to the earliest predecessor); a run of at most two other
    times takes its nearer kept neighbour's value (the left one on a tie), a longer run is
    spread evenly between its kept neighbours (or takes the one it has); then int()."""
    n = len(times)
    if n == 0:
        return []
    length, before = [1] * n, [-1] * n
    for i in range(n):
        for j in range(i):
            if times[j] <= times[i] and length[j] + 1 > length[i]:
                length[i], before[i] = length[j] + 1, j
    kept = [False] * n
    at = length.index(max(length))
    while at != -1:
        kept[at], at = True, before[at]
    out = list(times)
    i = 0
    while i < n:
        if kept[i]:
            i += 1
            continue
        j = i
        while j < n and not kept[j]:
            j += 1
        left = next((out[k] for k in range(i - 1, -1, -1) if kept[k]), None)
        right = next((out[k] for k in range(j, n) if kept[k]), None)
        for k in range(i, j):
            if left is None or right is None:
                out[k] = right if left is None else left
            elif j - i <= 2:
                out[k] = left if k - i + 1 <= j - k else right
            else:
                out[k] = left + (right - left) / (j - i + 1) * (k - i + 1)
        i = j
    return [int(t) for t in out]


class Qwen3ForcedAligner(WindowAligner):
    """`align_window(audio16k, words)` -> (start, end) in seconds for each of the words it
    holds (as WhisperAligner's), from one pass of the network."""

    window_seconds = WINDOW_SECONDS

    def __init__(self, root: str | Path, threads: int | None = None, dtype: torch.dtype = torch.float32):
        """`threads`: torch's intra-op threads for this process (None: left as they are)."""
        from transformers import AutoTokenizer

        from ..weights.checkpoint import load_strict, read_tensors, safetensors_files

        self.root = Path(root)
        self.config = AlignerConfig.read(self.root)
        if threads is not None:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.root), local_files_only=True)
        for token in (AUDIO_START, AUDIO_PAD, AUDIO_END, TIMESTAMP):
            if self.tokenizer.convert_tokens_to_ids(token) in (None, self.tokenizer.unk_token_id):
                raise CheckpointError(f"{self.root}: the tokenizer has no {token} token")
        if self.tokenizer.convert_tokens_to_ids(TIMESTAMP) != self.config.timestamp_token_id:
            raise CheckpointError(f"{self.root}: config.json's timestamp_token_id "
                                         f"{self.config.timestamp_token_id} is not the tokenizer's {TIMESTAMP}")
        thinker: dict = {}
        for path in safetensors_files(self.root, "Qwen3-ForcedAligner"):
            thinker.update(read_tensors(path, "thinker."))
        network = ForcedAlignerNetwork(self.config)
        load_strict(network, thinker, f"{self.root}: the aligner (thinker.*)")
        self.network = network.to(dtype).eval()

    def input_ids(self, words: list[str], audio_tokens: int) -> list[int]:
        text = (AUDIO_START + AUDIO_PAD * audio_tokens + AUDIO_END
                + (TIMESTAMP * 2).join(words) + TIMESTAMP * 2)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def word_token_count(self, word: str) -> int:
        return len(self.tokenizer(word, add_special_tokens=False)["input_ids"])

    @torch.inference_mode()
    def predicted_ms(self, window: np.ndarray, words: list[str]) -> list[float]:
        """The raw times (ms) at each <timestamp>: argmax class x timestamp_segment_time."""
        if window.size < N_FFT:     # the centred STFT's reflection needs more than n_fft / 2 samples
            window = np.pad(window, (0, N_FFT - window.size))
        mel = torch.from_numpy(whisper_log_mel(window, self.config.encoder["num_mel_bins"]))
        tokens = audio_token_count(mel.shape[1], self.config.encoder["n_window"])
        ids = torch.tensor(self.input_ids(words, tokens))
        logits = self.network(ids, mel.to(next(self.network.parameters()).dtype))
        classes = logits[ids == self.config.timestamp_token_id].argmax(-1)
        return (classes.float() * self.config.segment_ms).tolist()

    def align_window(self, window: np.ndarray, words: list[str]) -> list[tuple[float, float]]:
        held, total = [], 0
        for word in words:
            count = self.word_token_count(word) + 2
            if held and total + count > MAX_TEXT_TOKENS:
                break
            held.append(word)
            total += count
        if not held or window.size < MEL_HOP:
            return [(0.0, 0.0)] * len(held)
        times = repair_times(self.predicted_ms(np.asarray(window, np.float32), held))
        limit = window.size / SAMPLE_RATE
        spans = [(min(times[2 * i] / 1000, limit), min(times[2 * i + 1] / 1000, limit)) for i in range(len(held))]
        return [(a, max(a, b)) for a, b in spans]
