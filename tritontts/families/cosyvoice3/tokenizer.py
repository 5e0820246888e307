"""CosyVoice3's text tokenizer: CosyVoice-BlankEN's Qwen2 BPE plus the special tokens the
checkpoint was trained with (special_tokens.json, in the order that fixes their ids:
<|endofprompt|> must become id 151646 on the released tokenizer)."""
from __future__ import annotations

import json
from pathlib import Path

END_OF_PROMPT = "<|endofprompt|>"
# CosyVoice3 prompts carry an instruction ending in <|endofprompt|> before the transcript.
DEFAULT_INSTRUCTION = "You are a helpful assistant." + END_OF_PROMPT
SPECIAL_TOKENS = json.loads(Path(__file__).with_name("special_tokens.json").read_text(encoding="utf-8"))


class CosyVoice3TextTokenizer:
    def __init__(self, text_model_dir: str | Path):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(text_model_dir), local_files_only=True)
        self._tok.add_special_tokens(SPECIAL_TOKENS)
        self.end_of_prompt_id = self._tok.convert_tokens_to_ids(END_OF_PROMPT)

    def encode(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def prompt_text_ids(self, ref_text: str) -> list[int]:
        """The reference transcript as CosyVoice3 expects it: an instruction ending in
        <|endofprompt|>, then the transcript (kept as given when it has its own)."""
        if END_OF_PROMPT not in ref_text:
            ref_text = DEFAULT_INSTRUCTION + ref_text
        return self.encode(ref_text)

    def __len__(self) -> int:
        return len(self._tok)
