"""Gepard's prompt: [speaker slots] + [SOT, text, EOT] x (R - 1) + [SOT, text, EOT, SOS].

The speaker slots (tokeniser_length + i) are where the talker puts null_prefix's rows (the
default voice). Only the last copy of the text ends in start_of_speech, where the first frame
is drawn; a short text is repeated (R > 1) because a few text tokens weigh too little against
the speaker rows: the sidecar's text_repetition block gives the rule the model was trained
with (repeat when shorter than apply_below and than target_text_tokens, up to max_repeats,
about target_text_tokens in all).
"""
from __future__ import annotations

import math
from pathlib import Path

from .checkpoint import GepardConfig


def repeats(n: int, config: GepardConfig) -> int:
    if not config.repetition_enabled or n >= config.repetition_below or n >= config.repetition_target:
        return 1
    return max(1, min(math.ceil(config.repetition_target / n), config.repetition_max))


def prompt_ids(text_ids: list[int], config: GepardConfig) -> list[int]:
    if not text_ids:
        raise ValueError("the text has no tokens to speak")
    block = [config.start_of_text, *text_ids, config.end_of_text]
    slots = [config.speaker_base + i for i in range(config.speaker_slots)]
    return slots + block * repeats(len(text_ids), config) + [config.start_of_speech]


class GepardPromptBuilder:
    """text -> the talker's prompt ids, with the checkpoint's tokenizer (no special tokens
    added: the layout above is the whole prompt)."""

    def __init__(self, root: Path, config: GepardConfig):
        from transformers import AutoTokenizer

        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(str(root), local_files_only=True)

    def text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, text: str) -> list[int]:
        return prompt_ids(self.text_ids(text), self.config)
