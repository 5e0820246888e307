"""An OmniVoice request as the generator's input: one sequence of ids [8, L].

  [style tokens | text tokens | reference codes | frames x mask]
   <|denoise|> (cloning only) <|lang_start|>en<|lang_end|><|instruct_start|>...<|instruct_end|>
   <|text_start|>{reference transcript} {text}<|text_end|>

Text tokens repeat in all 8 rows (only row 0 is embedded); audio starts at the reference
codes (or at the target when there is none). The target's length is the duration
estimate (duration.py) of the text against the reference's transcript and frame count.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .duration import estimate_frames
from .text import prompt_token_ids, style_text, text_part


@dataclass(frozen=True)
class Sequence:
    ids: np.ndarray          # [C, L] int64
    audio_start: int         # first audio column (reference codes, then the target)
    frames: int              # target frames (the last columns)


class TextTokenizer:
    """The checkpoint's tokenizer (Qwen3's, with OmniVoice's control tokens)."""

    def __init__(self, root):
        from transformers import AutoTokenizer

        from ...weights.checkpoint import CheckpointError
        from .checkpoint import CONTROL_TOKENS

        self.tokenizer = AutoTokenizer.from_pretrained(str(root), local_files_only=True)
        for token in CONTROL_TOKENS:
            if len(self.tokenizer(token, add_special_tokens=False).input_ids) != 1:
                raise CheckpointError(f"{root}: the tokenizer does not keep {token} as one token")

    def style_ids(self, text: str) -> list[int]:
        return self.tokenizer(text).input_ids

    def text_ids(self, text: str) -> list[int]:
        return prompt_token_ids(self.tokenizer, text)


def build_sequence(tokenizer: TextTokenizer, codebooks: int, mask_id: int, text: str,
                   language: str | None, instructions: str | None, ref_text: str | None,
                   ref_codes: np.ndarray | None, speed: float = 1.0,
                   frames: int | None = None) -> Sequence:
    """The conditional sequence for `text` (ref_codes [C, R] when cloning). `frames` fixes
    the target length; otherwise it is estimated, divided by `speed`."""
    cloning = ref_codes is not None
    if frames is None:
        frames = estimate_frames(text, ref_text if cloning else None,
                                 ref_codes.shape[1] if cloning else None, speed)
    style = tokenizer.style_ids(style_text(language, instructions, denoise=cloning))
    words = tokenizer.text_ids(text_part(text, ref_text if cloning else None))
    parts = [np.tile(np.asarray(style + words, np.int64), (codebooks, 1))]
    if cloning:
        parts.append(np.asarray(ref_codes, np.int64))
    parts.append(np.full((codebooks, frames), mask_id, np.int64))
    ids = np.concatenate(parts, axis=1)
    audio_start = ids.shape[1] - frames - (ref_codes.shape[1] if cloning else 0)
    return Sequence(ids, audio_start, frames)
