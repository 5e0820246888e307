"""Fish Speech S2 Pro's prompt, as upstream lays it out (a chat in its tokens):

  <|im_start|>system\\n  convert the provided text to speech  <|im_end|>\\n
  <|im_start|>user\\n  TEXT  <|im_end|>\\n
  <|im_start|>assistant\\n<|voice|>

With a reference recording the system message becomes "convert the provided text to speech
reference to the following:\\n\\nText:\\n" + the transcript (tagged <|speaker:0|> unless it
has a speaker tag) + "\\n\\nSpeech:\\n" + the recording's frames: one position per frame
whose main token is <|semantic:code 0|>, its 10 codes carried beside it. Each text part is
tokenised on its own (tokenizer.json; special tokens in a part are recognised), as upstream
does, so BPE never merges across the parts.

The result is [1 + K, T]: row 0 the main tokens, rows 1.. each position's codes (0 at text
positions). Text may carry <|speaker:N|> tags (a dialogue: upstream's turns, grouped as it
groups them); any other special token in a text is refused, so no request can close the
user's turn itself.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .checkpoint import TOKENIZER_FILE, FishConfig

IM_START, IM_END, VOICE = "<|im_start|>", "<|im_end|>", "<|voice|>"
SYSTEM = "convert the provided text to speech"
CLONE_SYSTEM = "convert the provided text to speech reference to the following:\n\nText:\n"
CLONE_SPEECH = "\n\nSpeech:\n"
SPEAKER = re.compile(r"<\|speaker:\d+\|>")
SPECIAL = re.compile(r"<\|[^|<>]*\|>")
# Upstream groups a dialogue's turns into batches of at most 5 speakers and 200 bytes (its
# chunk_length default) and generates them one after another; one batch is served here.
MAX_SPEAKERS, MAX_BATCH_BYTES = 5, 200


class PromptError(ValueError):
    """A text the prompt cannot take (the message says what to change)."""


def check_text(text: str, field: str) -> None:
    for token in SPECIAL.findall(text):
        if not SPEAKER.fullmatch(token):
            raise PromptError(f"`{field}` contains the control token {token}: only <|speaker:N|> tags may appear")


def dialogue_text(text: str) -> str:
    """The user turn's text: as given; with speaker tags, upstream's turns (each tag with the
    text after it; text before the first tag dropped) joined by newlines, if they make one
    batch of its grouping."""
    if not SPEAKER.search(text):
        return text
    pieces = SPEAKER.split(text)
    tags = SPEAKER.findall(text)
    turns = [(tag + piece).strip() for tag, piece in zip(tags, pieces[1:])]
    if len(turns) > MAX_SPEAKERS or (len(turns) > 1 and sum(len(t.encode()) for t in turns) > MAX_BATCH_BYTES):
        raise PromptError(f"`input` is a dialogue of {len(turns)} turns and "
                          f"{sum(len(t.encode()) for t in turns)} bytes: upstream would generate it in "
                          f"several batches (at most {MAX_SPEAKERS} turns and {MAX_BATCH_BYTES} bytes each); "
                          "send them as separate requests")
    return "\n".join(turns)


@dataclass(frozen=True)
class Reference:
    text: str
    codes: Tensor       # [K, frames] from the codec's encoder


def parts(text: str, reference: Reference | None = None) -> list[str | Tensor]:
    """The prompt's parts in order: strings, and the reference's codes [K, n]."""
    if reference is None:
        system: list[str | Tensor] = [SYSTEM]
    else:
        transcript = reference.text if SPEAKER.search(reference.text) else f"<|speaker:0|>{reference.text}"
        system = [CLONE_SYSTEM, transcript, CLONE_SPEECH, reference.codes]
    return ([f"{IM_START}system\n", *system, f"{IM_END}\n", f"{IM_START}user\n", dialogue_text(text), f"{IM_END}\n",
             f"{IM_START}assistant\n{VOICE}"])


class FishPromptBuilder:
    def __init__(self, root: Path, config: FishConfig) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(root) / TOKENIZER_FILE))
        self.config = config

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def __call__(self, text: str, reference: Reference | None = None) -> Tensor:
        check_text(text, "input")
        if reference is not None:
            check_text(reference.text, "ref_text")
        c = self.config
        rows = []
        for part in parts(text, reference):
            if isinstance(part, str):
                tokens = torch.tensor(self.ids(part), dtype=torch.long)
                rows.append(torch.cat([tokens[None], torch.zeros(c.num_codebooks, len(tokens), dtype=torch.long)]))
            else:
                codes = part.long()
                rows.append(torch.cat([codes[:1] + c.semantic_begin_id, codes]))
        return torch.cat(rows, dim=1)
