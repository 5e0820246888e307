"""What the thinker reads: the instruction, rendered as one ChatML user turn.

The prompt is Qwen2.5-Omni's chat template for one user turn with its default system turn:

  <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n
  <|im_start|>user\\n{instruction}[<|audio_bos|><|AUDIO|> x n<|audio_eos|>]<|im_end|>\\n
  <|im_start|>assistant\\n

A request without a clip ends its instruction with the marker |<no_prompt_audio>| (AuK was
trained with it). With a clip, its n audio-tower embeddings take the <|AUDIO|> places.

The user's text is tokenized with special tokens split (a "<|im_end|>" typed in an
instruction stays text): nothing a request says can change the turn structure or the number
of audio places. The template's fixed parts are tokenized apart from it; Qwen's
pre-tokenizer splits at the newline before the instruction and the special token after it,
so the ids equal those of the whole rendered string (tests check this).

By default `input` is the whole instruction, as vLLM-Omni reads it (input_mode
"instruction"): `input` or `instructions`, whichever is given (both: a 400 asking for one).
With input_mode "speech", `input` is text to speak, turned into an instruction here as
sglang-omni's AuK front does:
  input, no clip          Generate speech based on the following description: "{voice}".
                          The content to speak is: "{input}".   (voice: `instructions`, or
                          a clear, natural voice)
  input and a clip        Say the following with the same voice: "{input}"
  instructions only       the instruction as given (with or without a clip)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...protocol import InvalidRequest
from .request import SPEECH, AuKParams

SYSTEM = "You are a helpful assistant."
NO_PROMPT_AUDIO = "|<no_prompt_audio>|"
DEFAULT_VOICE = "A clear, natural voice."
AUDIO_TOKEN, AUDIO_BOS, AUDIO_EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Speech without a given length: about 13 characters a second (read English), plus a breath.
SECONDS_PER_CHAR, SPEECH_PAD_SECONDS = 0.075, 0.5
MIN_SPEECH_SECONDS = 1.0


def instruction_for(text: str, params: AuKParams, has_clip: bool) -> str:
    text = text.strip()
    if not text:
        if params.instructions is None:
            raise InvalidRequest("input is empty: give the text to speak, or the whole instruction in instructions")
        return params.instructions
    if params.input_mode != SPEECH:
        if params.instructions is not None:
            raise InvalidRequest("input is the whole instruction (input_mode \"instruction\", vLLM-Omni's): send "
                                 "it in input or in instructions, not both; or set input_mode \"speech\" to "
                                 "speak input in the voice instructions describe")
        return text
    if has_clip:
        if params.instructions is not None:
            raise InvalidRequest("with ref_audio, put the whole instruction in instructions and leave input empty, "
                                 "or omit instructions to speak input in the clip's voice")
        return f'Say the following with the same voice: "{text}"'
    voice = params.instructions or DEFAULT_VOICE
    return (f'Generate speech based on the following description: "{voice}". '
            f'The content to speak is: "{text}".')


def rendered(instruction: str, audio_tokens: int) -> str:
    """The prompt as text (what the reference tokenizes whole); audio_tokens 0: no clip."""
    if audio_tokens:
        user = instruction + AUDIO_BOS + AUDIO_TOKEN * audio_tokens + AUDIO_EOS
    else:
        user = instruction if instruction.endswith(NO_PROMPT_AUDIO) else instruction + NO_PROMPT_AUDIO
    return (f"{IM_START}system\n{SYSTEM}{IM_END}\n{IM_START}user\n{user}{IM_END}\n"
            f"{IM_START}assistant\n")


def output_frames(text: str, params: AuKParams, clip_frames: int, frames_for) -> int:
    """The output's latent frames: duration_seconds; else an instruction on a clip keeps the
    clip's length (an edit, as vLLM-Omni does); else it is sized from the text, speech's or
    the instruction's (about 13 characters a second, at least a second)."""
    if params.duration_seconds is not None:
        return frames_for(params.duration_seconds)
    speech = params.input_mode == SPEECH and text.strip()
    if clip_frames and not speech:
        return clip_frames
    from .request import MAX_SECONDS

    words = text.strip() or params.instructions or ""
    seconds = SPEECH_PAD_SECONDS + SECONDS_PER_CHAR * len(words)
    return frames_for(min(MAX_SECONDS, max(MIN_SPEECH_SECONDS, seconds)))


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    audio_start: int          # index of the first <|AUDIO|> place (== len(ids) without a clip)
    audio_tokens: int


class PromptBuilder:
    """The checkpoint's tokenizer (Qwen2.5-Omni's), with the special tokens by name."""

    def __init__(self, root: Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(root), local_files_only=True)
        self.special = {t: self._special_id(t) for t in (IM_START, IM_END, AUDIO_TOKEN, AUDIO_BOS, AUDIO_EOS)}

    def _special_id(self, token: str) -> int:
        ids = self.tokenizer.convert_tokens_to_ids([token])
        if not ids or ids[0] is None or ids[0] == self.tokenizer.unk_token_id:
            raise ValueError(f"the thinker's tokenizer has no {token} token")
        return int(ids[0])

    def _fixed(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _user_text(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def __call__(self, instruction: str, audio_tokens: int = 0) -> Prompt:
        user = instruction if audio_tokens or instruction.endswith(NO_PROMPT_AUDIO) else instruction + NO_PROMPT_AUDIO
        ids = self._fixed(f"{IM_START}system\n{SYSTEM}{IM_END}\n{IM_START}user\n") + self._user_text(user)
        audio_start = len(ids) + 1 if audio_tokens else None
        if audio_tokens:
            s = self.special
            ids += [s[AUDIO_BOS]] + [s[AUDIO_TOKEN]] * audio_tokens + [s[AUDIO_EOS]]
        ids += self._fixed(f"{IM_END}\n{IM_START}assistant\n")
        return Prompt(ids, audio_start if audio_start is not None else len(ids), audio_tokens)
