"""Random-weight Voxtral TTS checkpoints in the released (Mistral) layout. So far: the
tokenizer, `tekken.json`, with its audio section (the rest of the layout comes with the
talker: params.json, consolidated.safetensors, voice_embedding/*.pt).

A tekken.json is tiktoken ranks (byte-level BPE, base64 token bytes) + special tokens by
name + an `audio` section; mistral-common reads it (MistralTokenizer.from_file) and lays out
speech requests from it, so the special tokens sit at the released ids (SPECIAL_TOKENS).
"""
from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path

# mistral-common's instruct tokenizer looks the control tokens up by name: the first 20 as
# every Tekken file has them, then the speech ones at the released ids (the others in
# between are named fillers here).
SPECIAL_TOKENS = dict(enumerate([
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
    "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]))
SPECIAL_TOKENS.update({20: "[ARGS]", 21: "[CALL_ID]", 24: "[AUDIO]", 25: "[BEGIN_AUDIO]",
                       26: "[TRANSCRIBE]", 35: "[REPEAT_AUDIO_TEXT]", 36: "[NEXT_AUDIO_TEXT]"})
# tiktoken's split before BPE: words with their leading space, numbers, punctuation runs.
PATTERN = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_CORPUS = ("Hello there, how are you today? The birch canoe slid on the smooth planks. "
           "Glue the sheet to the dark blue background. It's easy to tell the depth of a well. "
           "These days a chicken leg is a rare dish. One more sentence for speech synthesis: 0123456789!")


def byte_pair_ranks(corpus: str, merges: int) -> list[bytes]:
    """Token bytes in rank order: the 256 single bytes, then `merges` pairs learned greedily
    from `corpus` (most frequent adjacent pair first), each a concatenation of two earlier
    tokens, as tiktoken's merging needs."""
    import regex

    ranks = [bytes([b]) for b in range(256)]
    words = [[bytes([b]) for b in w.encode()] for w in regex.findall(PATTERN, corpus)]
    for _ in range(merges):
        pairs = Counter((a, b) for w in words for a, b in zip(w, w[1:]))
        if not pairs:
            break
        (a, b), _count = pairs.most_common(1)[0]
        ranks.append(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return ranks


def write_tekken(path: str | Path, voices: dict[str, int], num_special: int = 100, merges: int = 200,
                 sampling_rate: int = 24000, frame_rate: float = 12.5) -> Path:
    """A tekken.json (version v13) with the speech special tokens at their released ids and
    an audio section whose voice_num_audio_tokens are `voices` (name -> placeholder count)."""
    path = Path(path)
    ranks = byte_pair_ranks(_CORPUS * 4, merges)
    vocab = []
    for rank, token in enumerate(ranks):
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        vocab.append({"rank": rank, "token_bytes": base64.b64encode(token).decode(), "token_str": text})
    specials = [{"rank": i, "token_str": SPECIAL_TOKENS.get(i, f"<SPECIAL_{i}>"), "is_control": True}
                for i in range(num_special)]
    data = {
        "config": {"pattern": PATTERN, "num_vocab_tokens": len(vocab),
                   "default_vocab_size": num_special + len(vocab),
                   "default_num_special_tokens": num_special, "version": "v13"},
        "vocab": vocab,
        "special_tokens": specials,
        "audio": {"sampling_rate": sampling_rate, "frame_rate": frame_rate,
                  # The spectrogram settings only serve a reference clip's encoder (not
                  # in the released checkpoint); mistral-common requires valid ones.
                  "audio_encoding_config": {"num_mel_bins": 128, "hop_length": 160, "window_size": 400},
                  "voice_num_audio_tokens": dict(voices)},
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path
