"""The hop schedule: when the talker hands tokens to the flow stage. First audio after
`first_hop` tokens plus the flow's lookahead, then hops that grow by `scale` up to `max_hop`
(as CosyVoice's own runtime and vLLM-Omni do). The first hop is padded so prompt + first
hop ends on a hop boundary, keeping later chunks aligned with the DiT's static attention
chunks. The numbers come from the talker's model.json (hops) and the checkpoint (lookahead =
the flow's pre_lookahead_len); nothing here has defaults of its own."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HopSchedule:
    first_hop: int
    max_hop: int
    scale: int
    lookahead: int


@dataclass(frozen=True)
class TokenChunk:
    tokens_upto: int      # flow runs on tokens[:tokens_upto] (lookahead included)
    token_offset: int     # tokens already turned into audio by earlier chunks
    segment_end: bool     # the segment's last chunk: no lookahead held back, vocoder flushes


class TokenChunker:
    """Feed it the running token count; it says when a chunk is due."""

    def __init__(self, schedule: HopSchedule, prompt_tokens: int):
        self.schedule = schedule
        self.prompt_pad = math.ceil(prompt_tokens / schedule.first_hop) * schedule.first_hop - prompt_tokens
        self.emitted = 0
        self.hop = schedule.first_hop

    def poll(self, n_tokens: int) -> TokenChunk | None:
        """A chunk if `n_tokens` generated tokens complete the next hop (+ lookahead)."""
        this_hop = self.hop + (self.prompt_pad if self.emitted == 0 else 0)
        if n_tokens - self.emitted < this_hop + self.schedule.lookahead:
            return None
        chunk = TokenChunk(self.emitted + this_hop + self.schedule.lookahead, self.emitted, False)
        self.emitted += this_hop
        self.hop = min(self.schedule.max_hop, self.hop * self.schedule.scale)
        return chunk

    def finish(self, n_tokens: int) -> TokenChunk:
        """The segment's last chunk: everything left, no lookahead held back."""
        return TokenChunk(n_tokens, self.emitted, True)
