"""A stream's words placed as its audio arrives, by any forced aligner that places words in
a window of 16 kHz audio (`align_window(window, words)` -> (start, end) s per word it holds,
in order; `window_seconds`): tritontts.alignment.whisper.WhisperAligner,
tritontts.alignment.qwen3_forced_aligner.Qwen3ForcedAligner. A window's words that end
well inside it are kept, and the next window starts where the last kept word ends."""
from __future__ import annotations

import numpy as np

from .words import WordTiming, split_words

SAMPLE_RATE = 16000             # the aligners' input rate
MEL_HOP = 160                   # the shortest audio worth aligning: one 10 ms mel frame
KEEP_MARGIN_SECONDS = 1.0       # a window's words are kept if they end this far before its end


class WindowAligner:
    """What an aligner provides (`window_seconds`, `align_window`) and what it gets here:
    `align(audio, sample_rate, text)`, the text's words with their times in `audio`, window by
    window as a stream's would be placed."""

    window_seconds: float

    def align_window(self, window: np.ndarray, words: list[str]) -> list[tuple[float, float]]:
        """(start, end) in seconds from the window's start for as many of `words` as one pass
        holds, in order."""
        raise NotImplementedError

    def align(self, audio: np.ndarray, sample_rate: int, text: str) -> list[WordTiming]:
        return StreamAlignment(self, text, sample_rate).add(audio, final=True)


class StreamAlignment:
    """One stream's words placed as its audio arrives: `add(chunk, final)` returns the words
    placed for good by this chunk (times from the stream's first sample). Audio is aligned
    once `every_seconds` of it wait unplaced, or at the end; a word is placed once it ends
    KEEP_MARGIN_SECONDS before the audio heard so far does (its successors may still be
    unspoken), and at the end every word left is placed."""

    def __init__(self, aligner: WindowAligner, text: str, sample_rate: int, every_seconds: float = 4.0):
        import soxr

        self.aligner, self.words, self.placed = aligner, split_words(text), 0
        self.window = int(aligner.window_seconds * SAMPLE_RATE)
        self.every = int(every_seconds * SAMPLE_RATE)
        self.resampler = (soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32")
                          if sample_rate != SAMPLE_RATE else None)
        self.pending = np.zeros(0, np.float32)      # 16 kHz audio not yet behind a placed word
        self.offset = 0                             # samples of the stream before `pending`

    def add(self, chunk: np.ndarray, final: bool = False) -> list[WordTiming]:
        chunk = np.asarray(chunk, np.float32).reshape(-1)
        if self.resampler is not None:
            chunk = self.resampler.resample_chunk(chunk, last=final)
        self.pending = np.concatenate([self.pending, chunk])
        out: list[WordTiming] = []
        if not final and self.pending.size < self.every:
            return out
        while self.placed < len(self.words):
            window = self.pending[:self.window]
            if window.size < MEL_HOP:
                if final:       # no audio left: the rest end where the audio ends
                    end = _ms((self.offset + self.pending.size) / SAMPLE_RATE)
                    out += self._place([(end, end)] * (len(self.words) - self.placed))
                break
            everything = final and window.size == self.pending.size
            spans = every_span = self.aligner.align_window(window, self.words[self.placed:])
            if not everything:
                inside = window.size / SAMPLE_RATE - KEEP_MARGIN_SECONDS
                spans = [s for s in every_span if s[1] <= inside]
                if not spans and window.size == self.window:
                    spans = every_span[:1]      # a full window places at least one word
            start_s = self.offset / SAMPLE_RATE
            out += self._place([(_ms(start_s + a), _ms(start_s + b)) for a, b in spans])
            if not spans:
                break           # wait for more audio
            cut = max(MEL_HOP, int(round(out[-1].end_ms / 1000 * SAMPLE_RATE)) - self.offset)
            self.pending, self.offset = self.pending[cut:], self.offset + cut
            if not final and self.pending.size < self.every:
                break
        return out

    def _place(self, spans: list[tuple[int, int]]) -> list[WordTiming]:
        words = self.words[self.placed:self.placed + len(spans)]
        self.placed += len(words)
        return [WordTiming(w, a, b) for w, (a, b) in zip(words, spans)]


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))
