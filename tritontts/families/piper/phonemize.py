"""Text -> phoneme ids per sentence, through piper-tts's phonemizers (espeak-ng bridge)."""
from __future__ import annotations

from typing import Iterator

from piper.voice import PiperVoice

from ...protocol import InvalidRequest
from ...text import normalize, split_sentences


class PiperPhonemizer:
    """One per voice config. Phonemization needs no ONNX session, only the voice config."""

    def __init__(self, config):
        # PiperVoice.phonemize/phonemes_to_ids read only .config (and espeak data paths).
        self._voice = PiperVoice(session=None, config=config)

    def sentences(self, text: str) -> list[str]:
        sentences = split_sentences(normalize(text))
        if not sentences:
            raise InvalidRequest("input has nothing to speak (no letters or digits)")
        return sentences

    def phoneme_ids(self, sentence: str) -> list[int]:
        # espeak may split one of our sentences further (e.g. at ';'): keep it one chunk.
        phonemes: list[str] = []
        for part in self._voice.phonemize(sentence):
            if phonemes and part:
                phonemes.append(" ")
            phonemes.extend(part)
        return self._voice.phonemes_to_ids(phonemes) if phonemes else []

    def sentence_phoneme_ids(self, text: str) -> Iterator[list[int]]:
        """Phoneme ids sentence by sentence, lazily (sentences without phonemes skipped)."""
        for sentence in self.sentences(text):
            ids = self.phoneme_ids(sentence)
            if ids:
                yield ids
