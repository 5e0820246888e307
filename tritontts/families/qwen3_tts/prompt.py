"""The talker's prompt for the three Qwen3-TTS tasks, laid out as the reference's
Qwen3TTSForConditionalGeneration.generate lays it out (vLLM-Omni's prompt builder agrees).

Text goes in through the checkpoint's Qwen2 BPE wrapped in chat-template strings (the
reference wrapper's): the text to speak as an assistant turn followed by an open assistant
turn, an instruction as a user turn, a reference transcript as a closed assistant turn.

Each prompt row is the sum of a text-track embedding (text_projection(text_embedding(id)))
and a codec-track embedding (codec_embedding(id)), in this order:

  [instruction]   embed_text(<|im_start|>user\\n{instruct}<|im_end|>\\n)   (if any; text only)
  role            embed_text(<|im_start|> assistant \\n)                  (3 rows, text only)
  codec prefix    codec: think, think_bos, language, think_eos   (language given)
                     or  nothink, think_bos, think_eos            ("auto")
                  then the speaker row (CustomVoice: codec_embedding(spk_id); Base: the
                  x-vector itself), then codec_pad; the text track is tts_pad on every row
                  but the last, which is tts_bos
  then, streaming text (non_streaming=False, the reference generate()'s default):
    first text    embed_text(first text token) + codec_embedding(codec_bos)
    trailing      embed_text(the other text tokens), tts_eos: added one per decode step to
                  the frame's embedding, tts_pad once they run out
  or, non_streaming=True (the reference wrapper's default for CustomVoice / VoiceDesign):
    all text      embed_text(text tokens), tts_eos, each + codec_embedding(codec_pad)
    start         tts_pad + codec_embedding(codec_bos); trailing is tts_pad
  or, Base in-context (ICL) with reference codes [R, 16] and transcript:
    text track    embed_text(transcript tokens, text tokens), tts_eos      (L rows)
    codec track   codec_embedding(codec_bos), frame_embedding(each reference frame) (1 + R)
    streaming     the first 1 + R rows summed (text padded with tts_pad if L < 1 + R);
                  the text rows beyond 1 + R are the trailing text (else tts_pad)
    non-streaming the L text rows + codec_pad, then the 1 + R codec rows + tts_pad

Dialect speakers: with language Chinese or Auto, a CustomVoice speaker whose spk_is_dialect
names a dialect takes that dialect's language id instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ...weights.checkpoint import CheckpointError
from .checkpoint import AUTO_LANGUAGE, Qwen3TTSCheckpoint, Qwen3TTSConfig, lookup
from .talker import Qwen3TTSTalker

# Token counts the reference slices by (Qwen2 BPE: <|im_start|>, "assistant", "\n").
ROLE_TOKENS = 3
ASSISTANT_TAIL = 5      # <|im_end|> \n <|im_start|> assistant \n after the text
REF_TAIL = 2            # <|im_end|> \n after a reference transcript


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def ref_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruct_text(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n"


class TextTokenizer:
    """The checkpoint's Qwen2 BPE (vocab.json + merges.txt and/or tokenizer.json,
    tokenizer_config.json), loaded with transformers from the directory, offline."""

    SPECIAL = (("<|im_start|>", "im_start_token_id"), ("<|im_end|>", "im_end_token_id"),
               ("<tts_pad>", "tts_pad_token_id"), ("<tts_text_bos>", "tts_bos_token_id"),
               ("<tts_text_eod>", "tts_eos_token_id"))

    def __init__(self, checkpoint: Qwen3TTSCheckpoint):
        # The reference's processor holds this class (Qwen3TTSProcessor.tokenizer_class).
        from transformers import Qwen2Tokenizer

        try:
            self._tok = Qwen2Tokenizer.from_pretrained(str(checkpoint.root), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure is a bad tokenizer file
            raise CheckpointError(f"{checkpoint.root}: the text tokenizer does not load ({exc})") from None
        vocab = self._tok.get_vocab()
        for token, field in self.SPECIAL:
            # The chat template needs <|im_start|>/<|im_end|>; the tts_* ids are used by
            # number, but a tokenizer that disagrees with config.json means mixed-up files.
            if token in vocab or field.startswith("im_"):
                if vocab.get(token) != getattr(checkpoint.config, field):
                    raise CheckpointError(
                        f"{checkpoint.root}: tokenizer id of {token} is {vocab.get(token)}, "
                        f"config.json {field} is {getattr(checkpoint.config, field)}")

    def encode(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def assistant_ids(self, text: str) -> list[int]:
        return self.encode(assistant_text(text))

    def ref_ids(self, text: str) -> list[int]:
        return self.encode(ref_text(text))

    def instruct_ids(self, text: str) -> list[int]:
        return self.encode(instruct_text(text))


@dataclass(frozen=True)
class TalkerPrompt:
    embeds: Tensor           # [T, H] the prefill
    trailing_text: Tensor    # [N, H] added to decode step k's input for k < N; tts_pad after


def codec_language_id(config: Qwen3TTSConfig, language: str, speaker: str | None = None) -> int | None:
    """The language row of the codec prefix: None for "auto" (the nothink prefix), else the
    language's codec id; a dialect speaker with Chinese or Auto takes its dialect's id.
    KeyError for a language the checkpoint does not have."""
    t = config.talker
    language = language.lower()
    lang_id = None
    if language != AUTO_LANGUAGE:
        lang_id = lookup(t.codec_language_id, language)
        if lang_id is None:
            raise KeyError(language)
    if speaker and language in ("chinese", AUTO_LANGUAGE):
        dialect = lookup(t.spk_is_dialect, speaker)
        if dialect is not None:
            lang_id = lookup(t.codec_language_id, dialect)
    return lang_id


def _check_assistant_ids(config: Qwen3TTSConfig, ids: Sequence[int]) -> None:
    if len(ids) < ROLE_TOKENS + 1 + ASSISTANT_TAIL:
        raise ValueError(f"{len(ids)} token ids: the assistant turn needs its role, at least one "
                         f"text token and its tail (assistant_text())")
    if ids[0] != config.im_start_token_id or ids[-ASSISTANT_TAIL] != config.im_end_token_id:
        raise ValueError("token ids are not an assistant turn (assistant_text()): "
                         f"start {ids[0]}, end {ids[-ASSISTANT_TAIL]}")


@torch.no_grad()
def build_prompt(talker: Qwen3TTSTalker, input_ids: Sequence[int], language_id: int | None,
                 speaker_embed: Tensor | None = None, instruct_ids: Sequence[int] | None = None,
                 ref_ids: Sequence[int] | None = None, ref_codes: Tensor | None = None,
                 non_streaming: bool = False) -> TalkerPrompt:
    """The prompt in general form (see the module docstring): `speaker_embed` [H] is the
    speaker row (None: VoiceDesign, no row), `ref_ids` + `ref_codes` [R, G] select Base
    in-context cloning. The task functions below pick these per task."""
    cfg = talker.config
    t = cfg.talker
    _check_assistant_ids(cfg, input_ids)
    ids = talker.ids(input_ids)
    text = talker.embed_text
    tts_bos, tts_eos, tts_pad = talker.tts_embeds()

    control = ([t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id] if language_id is None
               else [t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id])
    codec = [talker.embed_codec(control)]
    if speaker_embed is not None:
        codec.append(speaker_embed.to(device=talker.device, dtype=talker.dtype).reshape(1, -1))
    codec.append(talker.embed_codec([t.codec_pad_id, t.codec_bos_id]))
    codec = torch.cat(codec)                                        # [C, H], codec_bos last

    parts = []
    if instruct_ids is not None and len(instruct_ids):
        parts.append(text(instruct_ids))
    parts.append(text(ids[:ROLE_TOKENS]))
    # The codec prefix but its final codec_bos, under tts_pad ... tts_pad, tts_bos.
    text_track = torch.cat([tts_pad.expand(codec.shape[0] - 2, -1), tts_bos[None]])
    parts.append(text_track + codec[:-1])
    codec_bos = codec[-1:]
    body = ids[ROLE_TOKENS:-ASSISTANT_TAIL]                         # the text to speak

    if ref_codes is not None:
        if ref_ids is None or not len(ref_ids):
            raise ValueError("in-context cloning needs the reference transcript's ids (ref_ids)")
        transcript = talker.ids(ref_ids)[ROLE_TOKENS:-REF_TAIL]
        text_rows = torch.cat([text(torch.cat([transcript, body])), tts_eos[None]])
        codec_rows = torch.cat([codec_bos, talker.frame_embedding(ref_codes)])
        n_text, n_codec = text_rows.shape[0], codec_rows.shape[0]
        if non_streaming:
            parts += [text_rows + talker.embed_codec([t.codec_pad_id] * n_text), codec_rows + tts_pad]
            trailing = tts_pad[None]
        elif n_text > n_codec:
            parts.append(text_rows[:n_codec] + codec_rows)
            trailing = text_rows[n_codec:]
        else:
            parts.append(torch.cat([text_rows, tts_pad.expand(n_codec - n_text, -1)]) + codec_rows)
            trailing = tts_pad[None]
    elif non_streaming:
        text_rows = torch.cat([text(body), tts_eos[None]])
        parts += [text_rows + talker.embed_codec([t.codec_pad_id] * text_rows.shape[0]),
                  tts_pad[None] + codec_bos]
        trailing = tts_pad[None]
    else:
        parts.append(text(body[:1]) + codec_bos)
        trailing = torch.cat([text(body[1:]), tts_eos[None]])
    return TalkerPrompt(torch.cat(parts), trailing)


def custom_voice_prompt(talker: Qwen3TTSTalker, input_ids: Sequence[int], speaker: str,
                        language: str = AUTO_LANGUAGE, instruct_ids: Sequence[int] | None = None,
                        non_streaming: bool = False) -> TalkerPrompt:
    """CustomVoice: a built-in speaker (spk_id, any case) and optional instructions."""
    cfg = talker.config
    spk = lookup(cfg.talker.spk_id, speaker)
    if spk is None:
        raise KeyError(speaker)
    return build_prompt(talker, input_ids, codec_language_id(cfg, language, speaker),
                        talker.embed_codec(spk), instruct_ids, non_streaming=non_streaming)


def speaker_row_prompt(talker: Qwen3TTSTalker, input_ids: Sequence[int], speaker_row: Tensor,
                       language: str = AUTO_LANGUAGE, instruct_ids: Sequence[int] | None = None,
                       non_streaming: bool = False) -> TalkerPrompt:
    """CustomVoice with the speaker row given as a vector [H] (a stored voice, e.g. a blend
    of presets) in place of a preset's codec_embedding row; a preset's own row gives exactly
    its custom_voice_prompt (but for a dialect speaker's language id: a row has no dialect)."""
    dim = talker.config.talker.hidden_size
    if speaker_row.numel() != dim:
        raise ValueError(f"speaker row has {speaker_row.numel()} values; this checkpoint's talker needs {dim}")
    return build_prompt(talker, input_ids, codec_language_id(talker.config, language), speaker_row,
                        instruct_ids, non_streaming=non_streaming)


def voice_design_prompt(talker: Qwen3TTSTalker, input_ids: Sequence[int],
                        instruct_ids: Sequence[int] | None, language: str = AUTO_LANGUAGE,
                        non_streaming: bool = False) -> TalkerPrompt:
    """VoiceDesign: the instruction describes the voice; there is no speaker row."""
    return build_prompt(talker, input_ids, codec_language_id(talker.config, language), None,
                        instruct_ids, non_streaming=non_streaming)


def base_prompt(talker: Qwen3TTSTalker, input_ids: Sequence[int], speaker_embedding: Tensor,
                language: str = AUTO_LANGUAGE, ref_ids: Sequence[int] | None = None,
                ref_codes: Tensor | None = None, non_streaming: bool = False) -> TalkerPrompt:
    """Base: the x-vector [H] is the speaker row; with `ref_codes` [R, 16] and `ref_ids`
    (the transcript, ref_text()) the reference is also prompted in context (ICL), without
    them it is x_vector_only_mode."""
    dim = talker.config.talker.hidden_size
    if speaker_embedding.numel() != dim:
        raise ValueError(f"speaker embedding has {speaker_embedding.numel()} values; this "
                         f"checkpoint's talker needs {dim}")
    return build_prompt(talker, input_ids, codec_language_id(talker.config, language),
                        speaker_embedding, None, ref_ids, ref_codes, non_streaming)
