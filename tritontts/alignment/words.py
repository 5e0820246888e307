"""The words of a request's text, as word timestamps report them.

vLLM-Omni's rule, kept so that clients see the same words from either server: split on
white space, keep only letters, digits and apostrophes in each piece, drop pieces left
empty, and make each CJK ideograph a word of its own."""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass

# CJK Unified Ideographs and their extensions, and the compatibility ideographs.
_CJK_RANGES = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2A6DF),
               (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF))


def is_cjk(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in _CJK_RANGES)


def _kept(char: str) -> bool:
    return char == "'" or unicodedata.category(char)[0] in ("L", "N")


def split_words(text: str) -> list[str]:
    """The words of `text` in order ("Hello, world!" -> ["Hello", "world"])."""
    words: list[str] = []
    for piece in text.split():
        run = ""
        for char in piece:
            if not _kept(char):
                continue
            if is_cjk(char):
                if run:
                    words.append(run)
                    run = ""
                words.append(char)
            else:
                run += char
        if run:
            words.append(run)
    return words


@dataclass(frozen=True)
class WordTiming:
    """One word's place in the delivered audio, in milliseconds from its first sample."""
    word: str
    start_ms: int
    end_ms: int

    def as_json(self) -> dict:
        return {"word": self.word, "start_ms": self.start_ms, "end_ms": self.end_ms}
