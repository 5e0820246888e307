"""Forced alignment with Whisper (CTranslate2, as faster-whisper loads it): the words of the
request's text are placed on the audio by the decoder's cross-attention over the audio
(CTranslate2's `Whisper.align`, a DTW over the alignment heads), not transcribed. Every word
gets a place, also where the audio is not intelligible speech (a random checkpoint's), and
the words are the text's own (tritontts.alignment.words), never a recognizer's guesses.

Whisper hears 30 s at a time and its decoder holds 448 tokens; longer audio or text is
aligned window by window, and a stream's audio as it arrives (tritontts.alignment.stream).
Word edges are then moved off silence
(a word's start onto its first voiced 10 ms frame, its end after its last), since the
attention places a word's end at the next word's start."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .stream import WindowAligner

SAMPLE_RATE = 16000             # Whisper's input rate
WINDOW_SECONDS = 30             # one encoder pass
MEL_HOP = 160                   # samples per mel frame (100 frames/s)
ENCODER_FRAMES_PER_SECOND = 50  # the encoder halves the mel frames
ENCODER_STEP_SECONDS = 10       # the encoder's input, padded up to a multiple of this
MAX_TEXT_TOKENS = 400           # of the decoder's 448 positions, with the start sequence and eot
VOICED_DB = -40.0               # a 10 ms frame is voiced above this, relative to the loudest frame


class WhisperAligner(WindowAligner):
    """`align_window(window, words)`: Whisper's placement of words in one window."""

    window_seconds = WINDOW_SECONDS

    def __init__(self, model_dir: str | Path, threads: int = 1):
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        self.whisper = WhisperModel(str(model_dir), device="cpu", compute_type="int8",
                                    cpu_threads=threads)
        multilingual = self.whisper.model.is_multilingual
        self.tokenizer = Tokenizer(self.whisper.hf_tokenizer, multilingual, task="transcribe",
                                   language="en" if multilingual else None)

    def word_tokens(self, word: str) -> list[int]:
        return self.tokenizer.encode(" " + word)

    def align_window(self, window: np.ndarray, words: list[str]) -> list[tuple[float, float]]:
        """(start, end) in seconds from the window's start for as many of `words` as the
        decoder holds, in order."""
        tokens: list[list[int]] = []
        total = 0
        for word in words:
            ids = self.word_tokens(word)
            if tokens and total + len(ids) > MAX_TEXT_TOKENS:
                break
            tokens.append(ids)
            total += len(ids)
        # The encoder hears the window padded to the next ENCODER_STEP_SECONDS, not to 30 s:
        # CTranslate2 takes shorter features, and a stream's windows are mostly a few
        # seconds (10 s instead of 30 s: 5x faster, the same onsets; 5 s steps lost
        # accuracy: p95 148 ms for 122 streamed, measured in
        # tritontts.benchmark.word_alignment).
        steps = max(1, math.ceil(window.size / (ENCODER_STEP_SECONDS * SAMPLE_RATE)))
        seconds = min(WINDOW_SECONDS, ENCODER_STEP_SECONDS * steps)
        padded = np.zeros(seconds * SAMPLE_RATE, np.float32)
        padded[:window.size] = window
        features = self.whisper.feature_extractor(padded)[:, :seconds * 100]
        frames = window.size // MEL_HOP
        encoded = self.whisper.encode(features)
        flat = [t for ids in tokens for t in ids]
        result = self.whisper.model.align(encoded, self.tokenizer.sot_sequence, [flat], frames)[0]
        times = _token_start_times(result.alignments, len(flat) + 1)   # + eot
        firsts = np.cumsum([0] + [len(ids) for ids in tokens])         # each word's first token
        spans = [(times[firsts[i]], times[firsts[i + 1]]) for i in range(len(tokens))]
        return _off_silence(spans, window)


def _token_start_times(alignments, count: int) -> np.ndarray:
    """The time (s) at which the DTW path first reaches each of `count` tokens; a token the
    path skips takes the next one's time."""
    times = np.full(count, np.nan)
    for text_index, time_index in alignments:
        if 0 <= text_index < count and np.isnan(times[text_index]):
            times[text_index] = time_index / ENCODER_FRAMES_PER_SECOND
    last = times[~np.isnan(times)].max() if np.any(~np.isnan(times)) else 0.0
    for i in range(count - 1, -1, -1):          # back-fill from the right
        if np.isnan(times[i]):
            times[i] = times[i + 1] if i + 1 < count else last
    return np.maximum.accumulate(times)


def _off_silence(spans: list[tuple[float, float]], audio: np.ndarray) -> list[tuple[float, float]]:
    """Each span's start moved forward to its first voiced 10 ms frame and its end back to
    just after its last; a span without a voiced frame stays as it was."""
    frame = SAMPLE_RATE // 100
    count = audio.size // frame
    if count == 0:
        return spans
    rms = np.sqrt(np.mean(audio[:count * frame].reshape(count, frame) ** 2, axis=1) + 1e-12)
    voiced = 20 * np.log10(rms / rms.max()) > VOICED_DB if rms.max() > 1e-6 else np.zeros(count, bool)
    moved = []
    for begin, end in spans:
        first, last = int(begin * 100), min(int(np.ceil(end * 100)), count)
        hits = np.flatnonzero(voiced[first:last])
        if hits.size:
            moved.append((max(begin, (first + hits[0]) / 100), min((first + hits[-1] + 1) / 100, end)))
        else:
            moved.append((begin, end))
    return moved
