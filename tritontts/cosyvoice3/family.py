"""What each CosyVoice3 stage does, Triton-free: the stages' model.py files stay thin.

The checkpoint path comes from TRITONTTS_COSYVOICE3_CHECKPOINT (set by
`python -m frontend --cosyvoice3-checkpoint PATH`).
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass

import numpy as np
import torch

from ..stage import InvalidRequest, check_text
from ..text import normalize, split_sentences
from .checkpoint import CheckpointError, CosyVoice3Checkpoint, open_checkpoint
from .prompt import PromptExtractor, VoicePrompt
from .request import parse_cosyvoice3_params
from .talker import TalkerVocab

CHECKPOINT_ENV = "TRITONTTS_COSYVOICE3_CHECKPOINT"
MIN_TOKEN_TEXT_RATIO, MAX_TOKEN_TEXT_RATIO = 2, 20   # upstream's generation length bounds
SEGMENT_TEXT_TOKENS = 80      # like upstream, long input is spoken segment by segment
TOKEN_MEL_RATIO = 2
SAMPLES_PER_FRAME = 480                               # 24 kHz audio, 50 Hz mel


def checkpoint_from_environment() -> CosyVoice3Checkpoint:
    path = os.environ.get(CHECKPOINT_ENV)
    if not path:
        raise CheckpointError(f"{CHECKPOINT_ENV} is not set: start with "
                              "`python -m frontend --families cosyvoice3 --cosyvoice3-checkpoint PATH`")
    return open_checkpoint(path)


@dataclass(frozen=True)
class Segment:
    """One talker generation: the voice prompt plus a stretch of the input text."""
    prompt_ids: list[int]
    min_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class TalkJob:
    segments: list[Segment]
    seed: int
    prompt: VoicePrompt
    stream_id: int


class CosyVoice3Frontend:
    def __init__(self, checkpoint: CosyVoice3Checkpoint):
        self.extractor = PromptExtractor(checkpoint)
        text_config = json.loads((checkpoint.text_model_dir / "config.json").read_text())
        self.vocab = TalkerVocab(speech_offset=int(text_config["vocab_size"]))

    @classmethod
    def from_environment(cls) -> "CosyVoice3Frontend":
        return cls(checkpoint_from_environment())

    def prepare(self, text: str, voice: str, params: dict) -> TalkJob:
        check_text(text)
        if voice not in ("", "default"):
            raise InvalidRequest(f"unknown voice {voice!r}: cosyvoice3 clones the voice of "
                                 "ref_audio; use voice 'default' with ref_audio and ref_text")
        p = parse_cosyvoice3_params(params)
        prompt = self.extractor.extract(p.ref_audio, p.ref_text)
        segments = [Segment(self.vocab.prompt_ids(prompt.text_ids + ids, prompt.speech_tokens.tolist()),
                            MIN_TOKEN_TEXT_RATIO * len(ids), MAX_TOKEN_TEXT_RATIO * len(ids))
                    for ids in self.text_segments(text)]
        return TalkJob(segments, seed=p.seed if p.seed is not None else secrets.randbits(62),
                       prompt=prompt, stream_id=secrets.randbits(63))

    def text_segments(self, text: str) -> list[list[int]]:
        """Token ids of the input, sentences merged up to SEGMENT_TEXT_TOKENS per segment."""
        segments: list[list[int]] = []
        for sentence in split_sentences(normalize(text)):
            ids = self.extractor.tokenizer.encode(sentence if not segments else " " + sentence)
            if segments and len(segments[-1]) + len(ids) <= SEGMENT_TEXT_TOKENS:
                segments[-1] += ids
            elif ids:
                segments.append(self.extractor.tokenizer.encode(sentence))
        if not segments:
            raise InvalidRequest("input has nothing to speak (no letters or digits)")
        return segments


class FlowRunner:
    """Speech tokens so far -> the mel of all of them (frames from 0), streaming attention."""

    def __init__(self, checkpoint: CosyVoice3Checkpoint):
        from .flow import build_flow, load_flow_state_dict

        self.flow = build_flow(checkpoint.config["flow"])
        load_flow_state_dict(self.flow, checkpoint.state_dict("flow.pt"))
        self.flow.eval()

    @torch.inference_mode()
    def mel(self, tokens: np.ndarray, prompt_tokens: np.ndarray, prompt_mel: np.ndarray,
            embedding: np.ndarray, finalize: bool) -> np.ndarray:
        """[frames, 80] for tokens (lookahead tokens give context only unless finalize)."""
        if tokens.size == 0:
            return np.zeros((0, 80), np.float32)
        token = torch.from_numpy(tokens.astype(np.int64))[None]
        prompt_token = torch.from_numpy(prompt_tokens.astype(np.int64))[None]
        feat = torch.from_numpy(prompt_mel.astype(np.float32))[None]
        mel, _ = self.flow.inference(
            token=token, token_len=torch.tensor([token.shape[1]]),
            prompt_token=prompt_token, prompt_token_len=torch.tensor([prompt_token.shape[1]]),
            prompt_feat=feat, prompt_feat_len=torch.tensor([feat.shape[1]]),
            embedding=torch.from_numpy(embedding.astype(np.float32))[None],
            streaming=True, finalize=finalize)
        return mel[0].T.contiguous().numpy()


class HiftRunner:
    """Full mel so far -> the audio not yet sent, stateless per chunk: what earlier chunks
    sent follows from token_offset (upstream's streaming contract, see hift.stream_hift)."""

    def __init__(self, checkpoint: CosyVoice3Checkpoint):
        from .hift import CausalHiFTGenerator, load_hift_state_dict

        self.hift = CausalHiFTGenerator.from_config(checkpoint.config["hift"])
        load_hift_state_dict(self.hift, checkpoint.state_dict("hift.pt"))
        self.hift.eval()
        self.sample_rate = int(checkpoint.config["sample_rate"])

    def sent_before(self, token_offset: int) -> int:
        frames = TOKEN_MEL_RATIO * token_offset
        return max(0, frames - self.hift.min_partial_frames) * SAMPLES_PER_FRAME

    @torch.inference_mode()
    def new_audio(self, mel: np.ndarray, token_offset: int, finalize: bool) -> np.ndarray:
        from .hift import stream_hift

        if mel.shape[0] == 0:
            return np.zeros(0, np.float32)
        audio, _ = stream_hift(self.hift, torch.from_numpy(mel.astype(np.float32)).T[None],
                               self.sent_before(token_offset), finalize)
        return audio[0].numpy().astype(np.float32)
