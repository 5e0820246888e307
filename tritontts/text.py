"""Text front-end shared by every family: normalization and sentence splitting.

Sentences are the streaming unit of the text stages: each one becomes one chunk, so the
first audio is ready after the first sentence, not after the whole input.
"""
from __future__ import annotations

import re
import unicodedata

# Abbreviations whose trailing period does not end a sentence.
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "etc", "e.g", "i.e",
    "no", "fig", "approx", "dept", "inc", "ltd", "co", "jan", "feb", "mar", "apr", "jun",
    "jul", "aug", "sep", "sept", "oct", "nov", "dec",
}

_TRANSLATE = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2013": ", ", "\u2014": ", ", "\u2026": "...", "\u00a0": " ",
})

# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) and whitespace,
# or at CJK full stops, or at a blank line.
_BOUNDARY = re.compile(r"""([.!?]+["')\]]*)\s+|([。！？]+)|\n\s*\n""")

# Very long sentences are cut at clause boundaries so a chunk never grows unbounded.
MAX_SENTENCE_CHARS = 400


def normalize(text: str) -> str:
    """Unicode-normalize, map typographic punctuation to ASCII, drop control
    characters and collapse runs of spaces (newlines are kept for paragraph splits)."""
    text = unicodedata.normalize("NFKC", text).translate(_TRANSLATE)
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C")
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" *\n *", "\n", text)
    text = re.sub(r" +([,;:])", r"\1", text)
    return text.strip()


def _ends_with_abbreviation(fragment: str) -> bool:
    words = fragment.rstrip(".!?\"')]").split()
    if not words:
        return False
    word = words[-1].lower().strip("(\"'")
    # Known abbreviations, initials ("J."), and dotted acronyms ("U.S.", "e.g.").
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()) or "." in word


def _cut_long(sentence: str) -> list[str]:
    if len(sentence) <= MAX_SENTENCE_CHARS:
        return [sentence]
    parts, current = [], ""
    for piece in re.split(r"(?<=[,;:])\s+", sentence):
        if current and len(current) + 1 + len(piece) > MAX_SENTENCE_CHARS:
            parts.append(current)
            current = piece
        else:
            current = f"{current} {piece}" if current else piece
    if current:
        parts.append(current)
    # A clause with no punctuation at all still gets cut, at word boundaries.
    out = []
    for part in parts:
        while len(part) > MAX_SENTENCE_CHARS:
            cut = part.rfind(" ", 0, MAX_SENTENCE_CHARS)
            cut = cut if cut > 0 else MAX_SENTENCE_CHARS
            out.append(part[:cut].strip())
            part = part[cut:].strip()
        if part:
            out.append(part)
    return out


def split_sentences(text: str) -> list[str]:
    """Split normalized text into sentences, keeping their final punctuation."""
    sentences: list[str] = []
    pending = ""
    pos = 0
    for match in _BOUNDARY.finditer(text):
        end = match.end(1) if match.group(1) else match.end()
        fragment = pending + text[pos:end]
        pos = match.end()
        if match.group(1) and match.group(1).startswith(".") and _ends_with_abbreviation(fragment):
            pending = fragment + " "
            continue
        pending = ""
        fragment = fragment.strip()
        if fragment:
            sentences.append(fragment)
    tail = (pending + text[pos:]).strip()
    if tail:
        sentences.append(tail)
    sentences = [" ".join(s.split()) for s in sentences]
    return [part for s in sentences for part in _cut_long(s) if _speakable(part)]


def _speakable(sentence: str) -> bool:
    return any(ch.isalnum() for ch in sentence)
