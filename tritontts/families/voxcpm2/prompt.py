"""VoxCPM2's prompt: the text tokenizer and the talker's input sequence for each cloning mode
(upstream voxcpm 2.0.3, VoxCPM2Model._generate and _make_ref_prefix).

A sequence is T positions, each either text (a token id, embedded) or audio (a patch of
latents, embedded by the local encoder): `ids`, `text_mask`, `audio_mask`, `feats` [T, P, D]
(zeros where text). The modes:

  zero-shot     text + <audio_start>
  reference     <ref_audio_start> reference patches <ref_audio_end>, text + <audio_start>:
                the voice is isolated from the text (upstream's "reference_wav_path")
  continuation  (prompt transcript + text) + <audio_start>, then the prompt's patches: the
                model continues the prompt recording ("prompt_wav_path" + "prompt_text")
  both          the reference prefix, then the continuation layout (both paths given)

Reference audio is padded at the end to whole patches, a continuation prompt at the start
(so its last patch ends where the recording does). In the continuation modes upstream
decodes the last up to 3 prompt patches ahead of the generated ones and cuts their audio
(`context`); the VAE stage does the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

# Upstream's VoxCPM2Model hard-codes these ids.
AUDIO_START, AUDIO_END, REF_AUDIO_START, REF_AUDIO_END = 101, 102, 103, 104
# Upstream's streaming_prefix_len: continuation decodes prefix_len - 1 prompt patches first.
STREAMING_PREFIX_LEN = 4
# Upstream's _generate caps the steps at len(target text tokens) * 6 + 10 (its
# retry_badcase_ratio_threshold), and at max_len.
STEPS_PER_TEXT_TOKEN = 6.0
EXTRA_STEPS = 10
MODES = ("zero_shot", "reference", "continuation", "both")


class TextTokenizer:
    """The checkpoint's Llama tokenizer as upstream wraps it (mask_multichar_chinese_tokens):
    tokens without specials (no BOS), and a token whose text, "▁" removed, is a vocabulary
    entry of two or more CJK characters is replaced by its single characters."""

    def __init__(self, root: str | Path) -> None:
        from transformers import LlamaTokenizerFast

        self.tokenizer = LlamaTokenizerFast.from_pretrained(str(root))
        self.multichar = {t for t in self.tokenizer.get_vocab()
                          if len(t) >= 2 and all("\u4e00" <= c <= "\u9fff" for c in t)}

    def __call__(self, text: str) -> list[int]:
        tokens: list[str] = []
        for token in self.tokenizer.tokenize(text):
            bare = token.replace("▁", "")
            tokens.extend(bare if bare in self.multichar else [token])
        return self.tokenizer.convert_tokens_to_ids(tokens)


@dataclass
class TalkerPrompt:
    ids: Tensor          # [T] int64 (0 at audio positions)
    audio_mask: Tensor   # [T] float32: 1 at audio positions, 0 at text ones
    feats: Tensor        # [T, P, D] float32
    context: Tensor      # [c, P, D]: prompt patches decoded ahead of the generated ones

    @property
    def text_mask(self) -> Tensor:
        """Every position is text or audio (in all of upstream's layouts)."""
        return 1.0 - self.audio_mask

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])


def max_steps(target_ids: int, max_len: int) -> int:
    """Upstream's step budget for a target text of `target_ids` tokens."""
    return max(1, min(int(target_ids * STEPS_PER_TEXT_TOKEN + EXTRA_STEPS), max_len))


def build_prompt(text_ids: list[int], patch_size: int, feat_dim: int, *,
                 reference: Tensor | None = None, continuation: Tensor | None = None) -> TalkerPrompt:
    """The sequence for `text_ids` (the target text's ids; with a continuation prompt, the
    ids of prompt transcript + target text, tokenized as one string), a reference's patches
    [R, P, D] and a continuation prompt's patches [Q, P, D] (either or both or neither)."""
    parts: list[tuple[list[int], float, Tensor]] = []     # (ids, is_text, feats)

    def zeros(n: int) -> Tensor:
        return torch.zeros(n, patch_size, feat_dim)

    if reference is not None:
        parts += [([REF_AUDIO_START], 1.0, zeros(1)), ([0] * reference.shape[0], 0.0, reference.float()),
                  ([REF_AUDIO_END], 1.0, zeros(1))]
    text = list(text_ids) + [AUDIO_START]
    parts.append((text, 1.0, zeros(len(text))))
    if continuation is not None:
        parts.append(([0] * continuation.shape[0], 0.0, continuation.float()))
    ids = torch.tensor([i for p, _, _ in parts for i in p], dtype=torch.long)
    audio_mask = 1.0 - torch.cat([torch.full((len(p),), t) for p, t, _ in parts])
    feats = torch.cat([f for _, _, f in parts])
    context = feats[:0]
    if continuation is not None:
        audio_positions = audio_mask.nonzero()[:, 0]
        keep = min(STREAMING_PREFIX_LEN - 1, audio_positions.numel())
        context = feats[audio_positions[audio_positions.numel() - keep:]]
    return TalkerPrompt(ids, audio_mask, feats, context)


def pad_to_patches(audio: Tensor, patch_samples: int, at_start: bool) -> Tensor:
    """Zero-pad audio [N] to whole patches: at the end (a reference), or at the start (a
    continuation prompt), as upstream's _encode_wav."""
    short = -audio.shape[-1] % patch_samples
    return torch.nn.functional.pad(audio, (short, 0) if at_start else (0, short))


def encode_patches(vae, audio: Tensor, patch_size: int, at_start: bool) -> Tensor:
    """Audio [N] at the VAE's input rate -> latent patches [n, P, D]."""
    audio = pad_to_patches(audio.float(), patch_size * vae.config.encode_hop, at_start)
    latents = vae.encode(audio[None].to(next(vae.parameters()).device))[0].cpu()    # [D, n * P]
    return latents.view(latents.shape[0], -1, patch_size).permute(1, 2, 0).contiguous()
