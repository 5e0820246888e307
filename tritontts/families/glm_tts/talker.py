"""The GLM-TTS talker's prompt, history and chunk plan (Triton-free; the stage runs them).

The talker is a plain Llama whose vocabulary holds the 32768 speech tokens as <|audio_N|>,
so stock vLLM serves `llm/` as it is. Per text segment upstream (glmtts_inference and
llm/glmtts.py) builds

    [prompt text ids] [segment text ids] <|begin_of_audio|> [prompt speech as <|audio_N|>]

and samples speech tokens with repetition-aware sampling until <|user|> (eoa), between 2 and
20 tokens per text token. Long input is spoken segment by segment, and every segment after
the first also sees the segments before it: their texts join the prompt text and their
speech tokens the prompt speech (upstream's `use_cache`), the oldest dropped first (never the
reference itself) while the speech part would pass 750 tokens.

Chunks (upstream Token2Wav.token2wav_stream): the flow re-runs on all tokens so far at 25,
75, 275, 475, ... tokens (blocks of 25, 50, then 200); each run leaves half a block of tokens
(12, 25, 100) as look-ahead whose audio the next run replaces.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_PROMPT_SPEECH = 750          # upstream's MAX_LLM_SEQ_INP_LEN
MIN_TOKEN_TEXT_RATIO, MAX_TOKEN_TEXT_RATIO = 2, 20
BLOCK_SIZES = (25, 50, 200)      # tokens per chunk; the last repeats
LOOK_AHEAD = (12, 25, 100)       # tokens of each chunk's audio the next chunk redoes
# RAS knobs upstream uses (cosyvoice.utils.common.ras_sampling defaults). GLM-TTS's copy of
# ras_sampling redraws a repeated token from the full softmax without banning it (CosyVoice
# bans it), hence ban_repeated False (tritontts.nn.ras.ras_distribution).
RAS_DEFAULTS = {"top_p": 0.8, "top_k": 25, "win_size": 10, "tau_r": 0.1, "ban_repeated": False}


@dataclass
class History:
    """Earlier segments of one request: their text ids and generated speech tokens."""
    texts: list[list[int]] = field(default_factory=list)
    speech: list[list[int]] = field(default_factory=list)

    def add(self, text_ids: list[int], speech: list[int]) -> None:
        self.texts.append(list(text_ids))
        self.speech.append(list(speech))

    def prune(self, prompt_text: list[int], prompt_speech: list[int], next_text: list[int]) -> None:
        """Drop the oldest segments while prompt + history speech + the next segment's
        estimated speech passes 750. The estimate is taken once, at the ratio of speech to
        text tokens before any is dropped, as upstream's get_cached_prompt does (re-estimating
        after each drop would drop other segments than upstream)."""
        if not self.texts:
            return
        text_len = len(prompt_text) + sum(map(len, self.texts))
        speech_len = len(prompt_speech) + sum(map(len, self.speech))
        estimate = int(speech_len / max(text_len, 1) * len(next_text))
        while self.texts and speech_len + estimate > MAX_PROMPT_SPEECH:
            self.texts.pop(0)
            speech_len -= len(self.speech.pop(0))


def segment_prompt(prompt_text: list[int], prompt_speech: list[int], text: list[int],
                   history: History, boa: int, ats: int) -> list[int]:
    """The talker's input ids for one segment (speech tokens as vocabulary ids ats + N)."""
    texts = prompt_text + [i for t in history.texts for i in t]
    speech = prompt_speech + [s for seg in history.speech for s in seg]
    return texts + text + [boa] + [ats + s for s in speech]


def token_bounds(text_tokens: int) -> tuple[int, int]:
    return MIN_TOKEN_TEXT_RATIO * text_tokens, MAX_TOKEN_TEXT_RATIO * text_tokens


@dataclass(frozen=True)
class Chunk:
    index: int           # within the segment
    tokens: int          # the flow runs on the segment's first `tokens` speech tokens
    last: bool           # the segment's last chunk: no look-ahead held back
    look_ahead: int      # tokens at the end whose audio the next chunk redoes (0 if last)


class Chunker:
    """Feed it the running token count; it says when a chunk is due. A chunk boundary is
    only passed on once a token beyond it exists (or generation ended), so the segment's
    last chunk is always known to be last, as in upstream's offline chunking."""

    def __init__(self, block_sizes=BLOCK_SIZES, look_ahead=LOOK_AHEAD):
        self.block_sizes, self.look_ahead = tuple(block_sizes), tuple(look_ahead)
        self.index = 0
        self.boundary = self.block_sizes[0]

    def _chunk(self, tokens: int, last: bool) -> Chunk:
        ahead = 0 if last else self.look_ahead[min(self.index, len(self.look_ahead) - 1)]
        chunk = Chunk(self.index, tokens, last, ahead)
        self.index += 1
        self.boundary += self.block_sizes[min(self.index, len(self.block_sizes) - 1)]
        return chunk

    def poll(self, tokens: int) -> Chunk | None:
        if tokens > self.boundary:
            return self._chunk(self.boundary, False)
        return None

    def finish(self, tokens: int) -> Chunk:
        return self._chunk(tokens, True)
