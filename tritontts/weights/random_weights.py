"""What every family's random-checkpoint writer shares: random tensors for a module, a
safetensors writer, and a small Qwen2-style byte-level BPE tokenizer in the released file
layout (vocab.json, merges.txt, tokenizer_config.json with the special tokens after the
vocabulary, as the released Qwen tokenizers keep them)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch


def randomize(module: torch.nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random values for every tensor: norm scales near 1 (not exactly, so that a norm whose
    weight went unused shows), biases and weights small."""
    state = {}
    for name, tensor in module.state_dict().items():
        noise = torch.randn(tensor.shape, generator=generator)
        if tensor.ndim == 1 and "norm" in name:
            value = 1.0 + 0.1 * noise
        else:
            value = 0.05 * noise
        state[name] = value.to(tensor.dtype) if tensor.is_floating_point() else tensor
    return state


def save_safetensors(state: dict[str, torch.Tensor], path: Path, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    save_file({k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()},
              str(path), metadata={"format": "pt"})


def train_byte_level_bpe(pieces, split_regex: str, vocab_size: int):
    """A byte-level BPE (tokenizers.Tokenizer) trained on `pieces` (text between special
    tokens, each seen 16 times) with `split_regex` as the pre-tokenizer's split (Qwen2's,
    Llama 3's) and a byte-level decoder, as the released Qwen / Llama tokenizers are built."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(pieces) * 16, trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def write_qwen2_tokenizer(out: Path, special_tokens: tuple[str, ...], corpus: str,
                          single_tokens: tuple[str, ...] = (), vocab_size: int = 480,
                          eos_token: str | None = None) -> dict[str, int]:
    """vocab.json, merges.txt and tokenizer_config.json of a small BPE trained on `corpus`
    with the Qwen2 pre-tokenizer; `special_tokens` follow the vocabulary in the given order.
    `single_tokens` (byte-level spelling: "Ċ" is "\\n") must come out as one token each.
    Returns the special tokens' ids."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # Special tokens are split off before BPE runs, so train on the pieces between them.
    pieces = [p for p in re.split("|".join(re.escape(t) for t in special_tokens), corpus) if p]
    tok = train_byte_level_bpe(pieces, PRETOKENIZE_REGEX, vocab_size)
    tok.model.save(str(out))
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    for word in single_tokens:
        if word not in vocab:
            raise RuntimeError(f"the tokenizer corpus did not make {word!r} one token")
    ids = {token: len(vocab) + i for i, token in enumerate(special_tokens)}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False, "bos_token": None, "eos_token": eos_token,
        "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace",
        "clean_up_tokenization_spaces": False, "model_max_length": 131072,
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": {str(i): {"content": token, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for token, i in ids.items()},
    }, indent=2, ensure_ascii=False), encoding="utf-8")
    return ids


def random_checkpoint_cli(doc: str, sizes, write, argv=None) -> None:
    """`python -m tritontts.families.<family>.random_checkpoint OUT [--size S] [--seed N]`: the
    family's writer `write(out, seed, size)`, the path printed."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--size", choices=sorted(sizes), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write(args.out, args.seed, args.size))
