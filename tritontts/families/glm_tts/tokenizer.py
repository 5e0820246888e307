"""The GLM-TTS text tokenizer (`vq32k-phoneme-tokenizer/`), read as data.

Upstream loads it with `AutoTokenizer(..., trust_remote_code=True)`, which runs the
`tokenization_chatglm.py` shipped beside it: a ChatGLM4 tokenizer, i.e. a tiktoken byte-level
BPE whose ranks are in `tokenizer.model` (one "base64(token) rank" per line), plus the added
tokens of `tokenizer_config.json` (`added_tokens_decoder`: <|endoftext|>, <|user|>,
<|begin_of_audio|>, the 32768 <|audio_N|> speech tokens, ...). We never run that file; this
module rebuilds the same tokenizer from the two data files with the tiktoken package.

What upstream's own checks pin down (glmtts_inference.get_special_token_ids): every special
token encodes to exactly one id, so `encode` adds no prefix tokens (unlike GLM-4 chat, which
prepends [gMASK]<sop>), and the audio tokens <|audio_0|> .. <|audio_32767|> are consecutive.
The split pattern is ChatGLM4's; tokenizer_config.json may carry its own as "pat_str".
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

from ...weights.checkpoint import CheckpointError

# ChatGLM4's pre-tokenisation pattern (contractions, letter runs, 1-3 digits, punctuation,
# newlines, spaces).
GLM4_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
AUDIO_TOKENS = 32768
SPECIAL = {"ats": "<|audio_0|>", "ate": f"<|audio_{AUDIO_TOKENS - 1}|>",
           "boa": "<|begin_of_audio|>", "eoa": "<|user|>", "pad": "<|endoftext|>"}


@dataclass(frozen=True)
class SpeechIds:
    """Where the talker's speech vocabulary sits: audio token N is id ats + N; eoa (<|user|>)
    ends a generation; boa (<|begin_of_audio|>) opens the speech part of the prompt."""
    ats: int
    boa: int
    eoa: int
    pad: int

    def speech(self, token_id: int) -> int:
        return token_id - self.ats


class GLMTextTokenizer:
    def __init__(self, folder: str | Path):
        import tiktoken

        folder = Path(folder)
        model, config_path = folder / "tokenizer.model", folder / "tokenizer_config.json"
        for path in (model, config_path):
            if not path.is_file():
                raise CheckpointError(f"{path}: missing (the GLM-TTS text tokenizer needs it)")
        ranks: dict[bytes, int] = {}
        for n, line in enumerate(model.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError:
                raise CheckpointError(f"{model}:{n}: expected 'base64-token rank'") from None
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
            added = {str(entry["content"]): int(token_id)
                     for token_id, entry in config.get("added_tokens_decoder", {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{config_path}: unreadable added_tokens_decoder ({exc})") from None
        clash = sorted(set(added.values()) & set(ranks.values()))
        if clash:
            raise CheckpointError(f"{config_path}: added token ids {clash[:5]} collide with BPE ranks")
        self.encoding = tiktoken.Encoding(name=f"glm-tts:{folder}", pat_str=config.get("pat_str", GLM4_PATTERN),
                                          mergeable_ranks=ranks, special_tokens=added)
        self.added = added
        missing = [token for token in SPECIAL.values() if token not in added]
        if missing:
            raise CheckpointError(f"{config_path}: added_tokens_decoder lacks {missing}")
        ids = {key: added[token] for key, token in SPECIAL.items()}
        for n in (1, AUDIO_TOKENS // 2, AUDIO_TOKENS - 1):
            if added.get(f"<|audio_{n}|>") != ids["ats"] + n:
                raise CheckpointError(f"{config_path}: <|audio_N|> ids are not consecutive from "
                                      f"<|audio_0|> = {ids['ats']}")
        self.ids = SpeechIds(ats=ids["ats"], boa=ids["boa"], eoa=ids["eoa"], pad=ids["pad"])

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        """Text -> ids; added tokens written in the text become their ids (as upstream's
        slow tokenizer splits on them), no prefix or suffix ids."""
        return self.encoding.encode(text, allowed_special="all")

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)
