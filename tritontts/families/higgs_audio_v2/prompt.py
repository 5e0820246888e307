"""The talker's prompt and the delay pattern, Triton-free.

The prompt is what the checkpoint's chat template renders for a TTS conversation (the
template is Jinja; it is never executed here: its two shapes are built directly):

  <|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n
  Generate audio following instruction.<|eot_id|>
  [cloning: <|start_header_id|>user<|end_header_id|>\\n\\n{ref_text}<|eot_id|>
            <|start_header_id|>assistant<|end_header_id|>\\n\\n
            <|audio_out_bos|>{<|AUDIO_OUT|> x (R + 2)}{delay token x 7}<|audio_eos|><|eot_id|>]
  <|start_header_id|>user<|end_header_id|>\\n\\n{text}<|eot_id|>
  <|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|>

Each <|AUDIO_OUT|> / delay position of the reference takes one frame of the reference's
codes in the delay pattern (below): R frames, wrapped in the stream bos and eos frames,
stretched by num_codebooks - 1. The talker embeds those positions as frames; everything else
is text.

Delay pattern (MusicGen's): codebook k runs k steps behind codebook 0. A sequence of T
frames [T, K] becomes T + K - 1 steps, codebook k's codes at steps k..k+T-1, the stream bos
before them and the stream eos after.
"""
from __future__ import annotations

import re

import numpy as np

from ...protocol import InvalidRequest
from .checkpoint import (AUDIO_DELAY, AUDIO_EOS, AUDIO_OUT, AUDIO_OUT_BOS, BEGIN_OF_TEXT, END_HEADER,
                         END_OF_TURN, PROMPT_TOKENS, START_HEADER, TOKENIZER_FILE,
                         HiggsAudioV2Checkpoint)

SYSTEM_PROMPT = "Generate audio following instruction."
# The multi-speaker dialogue tags of the reference ([SPEAKER0], [SPEAKER1], ...): the model
# was trained with them in a system message describing each speaker, not served here.
SPEAKER_TAG = re.compile(r"\[SPEAKER\d+\]", re.IGNORECASE)


def apply_delay(codes: np.ndarray, bos: int, eos: int) -> np.ndarray:
    """[T, K] frames -> [T + K - 1, K] steps: codebook k shifted down by k, bos above, eos
    below."""
    frames, k = codes.shape
    out = np.empty((frames + k - 1, k), dtype=codes.dtype)
    for q in range(k):
        out[:q, q] = bos
        out[q:q + frames, q] = codes[:, q]
        out[q + frames:, q] = eos
    return out


def undo_delay(steps: np.ndarray) -> np.ndarray:
    """[S, K] steps -> [S - K + 1, K] frames (frame i's codebook k is at step i + k)."""
    count, k = steps.shape
    frames = count - k + 1
    if frames <= 0:
        return np.zeros((0, k), dtype=steps.dtype)
    return np.stack([steps[q:q + frames, q] for q in range(k)], axis=1)


def reference_steps(codes: np.ndarray, bos: int, eos: int) -> np.ndarray:
    """A reference's [R, K] codes as the prompt carries them: the stream bos frame, the
    codes, the stream eos frame, in the delay pattern: [R + 2 + K - 1, K]."""
    k = codes.shape[1]
    wrapped = np.concatenate([np.full((1, k), bos, codes.dtype), codes, np.full((1, k), eos, codes.dtype)])
    return apply_delay(wrapped, bos, eos)


class TextTokenizer:
    """The checkpoint's tokenizer.json, with the prompt's special tokens checked against
    config.json (a tokenizer whose audio tokens are not the model's would prompt it wrongly)."""

    def __init__(self, checkpoint: HiggsAudioV2Checkpoint):
        from tokenizers import Tokenizer

        from ...weights.checkpoint import CheckpointError

        path = checkpoint.path(TOKENIZER_FILE)
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - any failure is a bad file
            raise CheckpointError(f"{path}: not a readable tokenizer ({exc})") from None
        self.ids = {}
        for token in PROMPT_TOKENS:
            token_id = self.tokenizer.token_to_id(token)
            if token_id is None:
                raise CheckpointError(f"{path}: no {token} token (the prompt needs it)")
            self.ids[token] = token_id
        cfg = checkpoint.config
        for token, field in ((AUDIO_OUT, "audio_token_id"), (AUDIO_OUT_BOS, "audio_bos_token_id"),
                             (AUDIO_DELAY, "audio_delay_token_id"), (END_OF_TURN, "eos_token_id")):
            if self.ids[token] != getattr(cfg, field):
                raise CheckpointError(f"{path}: {token} is id {self.ids[token]} but config.json's "
                                      f"{field} is {getattr(cfg, field)}")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def turn(self, role: str, content: str) -> list[int]:
        """One chat turn with text content (trimmed, as the template trims it)."""
        return self.encode(f"{START_HEADER}{role}{END_HEADER}\n\n{content.strip()}{END_OF_TURN}")


def build_prompt(tokenizer: TextTokenizer, text: str, num_codebooks: int,
                 ref_text: str | None = None, ref_steps: int = 0) -> list[int]:
    """The prompt's token ids; with a reference, `ref_steps` placeholder positions (the
    reference's frames in the delay pattern, reference_steps) after its transcript."""
    ids = tokenizer.ids
    prompt = [ids[BEGIN_OF_TEXT]] + tokenizer.encode(
        f"{START_HEADER}system{END_HEADER}\n\n{SYSTEM_PROMPT}{END_OF_TURN}")
    if ref_text is not None:
        delays = num_codebooks - 1
        if ref_steps <= delays + 2:
            raise InvalidRequest("the reference recording is too short to clone from")
        prompt += tokenizer.turn("user", ref_text)
        prompt += tokenizer.encode(f"{START_HEADER}assistant{END_HEADER}\n\n")
        prompt += ([ids[AUDIO_OUT_BOS]] + [ids[AUDIO_OUT]] * (ref_steps - delays)
                   + [ids[AUDIO_DELAY]] * delays + [ids[AUDIO_EOS], ids[END_OF_TURN]])
    prompt += tokenizer.turn("user", text)
    prompt += tokenizer.encode(f"{START_HEADER}assistant{END_HEADER}\n\n") + [ids[AUDIO_OUT_BOS]]
    return prompt
