"""The CosyVoice3 talker on stock vLLM.

Why a converted checkpoint rather than a registered model class: CosyVoice3LM is Qwen2 with
two extra tables, `speech_embedding` (6561+200 rows, input side) and `llm_decoder` (a
bias-free Linear to 6561+200 logits, output side). Appending the speech rows to Qwen2's
vocabulary (embed_tokens ++ speech_embedding; lm_head = zeros for text rows ++ llm_decoder)
gives a plain Qwen2ForCausalLM that vLLM serves natively, with its own kernels, batching and
prefix handling, and no vLLM internals to track. The prompt becomes ordinary token ids
([sos] text [task] prompt-speech), so no prompt_embeds are needed; sampling is restricted
to the speech rows with allowed_token_ids, and upstream's repetition-aware sampling (RAS)
is an exact per-step distribution computed by tritontts.engine.vllm_ras.RasLogitsProcessor.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ...weights.checkpoint import cache_root as checkpoint_cache_root

SPEECH_TOKEN_SIZE = 6561      # FSQ speech codes 0..6560
SPEECH_VOCAB = SPEECH_TOKEN_SIZE + 200   # + sos, eos, task, fill, and unused stop ids
TALKER_META = "tritontts_talker.json"


@dataclass(frozen=True)
class TalkerVocab:
    """Where the speech rows sit in the merged vocabulary."""

    speech_offset: int                 # = number of text rows (Qwen2 embed_tokens)
    speech_token_size: int = SPEECH_TOKEN_SIZE

    @property
    def sos(self) -> int:
        return self.speech_offset + self.speech_token_size

    @property
    def task_id(self) -> int:
        return self.speech_offset + self.speech_token_size + 2

    @property
    def stop_ids(self) -> list[int]:
        """Every id >= 6561 in the speech table ends generation (as upstream)."""
        return list(range(self.sos, self.speech_offset + SPEECH_VOCAB))

    @property
    def allowed_ids(self) -> list[int]:
        return list(range(self.speech_offset, self.speech_offset + SPEECH_VOCAB))

    @property
    def vocab_size(self) -> int:
        return self.speech_offset + SPEECH_VOCAB

    def prompt_ids(self, text_ids: list[int], prompt_speech_tokens: list[int]) -> list[int]:
        """[sos] prompt-text + text [task] prompt-speech-tokens (upstream's lm_input order)."""
        return ([self.sos, *text_ids, self.task_id]
                + [self.speech_offset + t for t in prompt_speech_tokens])

    def to_speech(self, token_id: int) -> int:
        return token_id - self.speech_offset


def convert_llm_checkpoint(llm_state: dict, text_config: dict, out_dir: str | Path) -> TalkerVocab:
    """Write a Qwen2ForCausalLM checkpoint (config.json + model.safetensors) for vLLM."""
    from safetensors.torch import save_file

    prefix = "llm.model."
    required = (f"{prefix}model.embed_tokens.weight", "speech_embedding.weight", "llm_decoder.weight")
    missing = [k for k in required if k not in llm_state]
    if missing:
        raise ValueError(f"llm.pt: missing {missing}")
    embed = llm_state[f"{prefix}model.embed_tokens.weight"].float()
    speech_embedding = llm_state["speech_embedding.weight"].float()
    decoder = llm_state["llm_decoder.weight"].float()
    hidden = embed.shape[1]
    if speech_embedding.shape != (SPEECH_VOCAB, hidden) or decoder.shape != (SPEECH_VOCAB, hidden):
        raise ValueError(f"llm.pt: speech_embedding {tuple(speech_embedding.shape)} / llm_decoder "
                         f"{tuple(decoder.shape)}, expected ({SPEECH_VOCAB}, {hidden})")
    vocab = TalkerVocab(speech_offset=embed.shape[0])

    weights = {k[len(prefix):]: v.float().contiguous() for k, v in llm_state.items()
               if k.startswith(prefix + "model.")}
    weights["model.embed_tokens.weight"] = torch.cat([embed, speech_embedding]).contiguous()
    # Text rows of lm_head are never sampled (allowed_token_ids): zeros keep them inert.
    weights["lm_head.weight"] = torch.cat([torch.zeros_like(embed), decoder]).contiguous()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = dict(text_config)
    config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                  vocab_size=vocab.vocab_size, tie_word_embeddings=False, torch_dtype="float32",
                  eos_token_id=vocab.speech_offset + SPEECH_TOKEN_SIZE + 1,
                  bos_token_id=vocab.sos)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(weights, str(out / "model.safetensors"))
    (out / TALKER_META).write_text(json.dumps(asdict(vocab)))
    return vocab


def ensure_talker_checkpoint(ckpt, cache_root: str | Path | None = None) -> Path:
    """The vLLM-native talker for a CosyVoice3Checkpoint, converted once and cached (keyed
    by the checkpoint's path and llm.pt's size and mtime) under TRITONTTS_CACHE."""
    llm = ckpt.path("llm.pt")
    stat = llm.stat()
    key = hashlib.sha256(f"{llm.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    root = checkpoint_cache_root(cache_root)
    out = root / "cosyvoice3-talker" / key
    if not (out / TALKER_META).is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        text_config = json.loads((ckpt.text_model_dir / "config.json").read_text())
        convert_llm_checkpoint(ckpt.state_dict("llm.pt"), text_config, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another instance converted it first
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_talker_vocab(talker_dir: str | Path) -> TalkerVocab:
    return TalkerVocab(**json.loads((Path(talker_dir) / TALKER_META).read_text()))
