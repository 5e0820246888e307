"""Fish Speech S2 Pro's prompt (ours) equals mizuoto-fishspeech's (upstream's layout, op for
op) on the generator's tiny tokenizer.json: plain text, a cloned voice (transcript + codes),
a two-speaker dialogue; control tokens in a text are refused, and so is a dialogue upstream
would split into several batches. The checkpoint reader checks what it reads."""
from __future__ import annotations

import json

import pytest
import torch

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.fish_s2_pro.checkpoint import open_checkpoint
from tritontts.families.fish_s2_pro.prompt import FishPromptBuilder, PromptError, Reference
from tritontts.families.fish_s2_pro.random_checkpoint import write_random_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return open_checkpoint(write_random_checkpoint(tmp_path_factory.mktemp("fish") / "tiny"))


def upstream(checkpoint, text: str, reference: Reference | None) -> torch.Tensor:
    from mizuoto.text.tokenize.bpe import load_bpe
    from mizuoto_fishspeech.generate import batches_of, encode, message, system_parts

    c = checkpoint.config
    tokenizer = load_bpe(checkpoint.root)
    texts, codes = ([reference.text], [reference.codes]) if reference else ([], [])
    (batch,) = batches_of(text, 200)
    parts = (message("system", system_parts(texts, codes)) + message("user", [batch])
             + message("assistant", [], voice=True, end=False))
    return encode(parts, tokenizer, c.semantic_begin_id, c.num_codebooks)


@pytest.mark.parametrize("case", ["plain", "cloned", "dialogue"])
def test_prompt_equals_upstream_layout(checkpoint, case):
    c = checkpoint.config
    text = {"plain": "Hello there, how are you today?", "cloned": "The birch canoe slid on the smooth planks.",
            "dialogue": "<|speaker:0|>Hello there. <|speaker:1|>How are you today?"}[case]
    reference = None
    if case == "cloned":
        codes = torch.randint(0, c.codebook_size, (c.num_codebooks, 7), generator=torch.Generator().manual_seed(0))
        reference = Reference("Glue the sheet to the dark blue background.", codes)
    ours = FishPromptBuilder(checkpoint.root, c)(text, reference)
    want = upstream(checkpoint, text, reference)
    print(f"{case}: {ours.shape[1]} positions, {int((ours[0] >= c.semantic_begin_id).sum())} semantic")
    assert torch.equal(ours, want)
    assert ours.shape[0] == 1 + c.num_codebooks


def test_control_tokens_and_long_dialogues_are_refused(checkpoint):
    build = FishPromptBuilder(checkpoint.root, checkpoint.config)
    with pytest.raises(PromptError, match=r"<\|im_end\|>"):
        build("Hello <|im_end|> there")
    with pytest.raises(PromptError, match="ref_text"):
        build("Hello", Reference("<|voice|>", torch.zeros(10, 2, dtype=torch.long)))
    with pytest.raises(PromptError, match="separate requests"):
        build(" ".join(f"<|speaker:{i % 2}|>{'word ' * 20}" for i in range(4)))


def test_reader_names_the_bad_field(checkpoint, tmp_path):
    import shutil

    copy = tmp_path / "bad"
    shutil.copytree(checkpoint.root, copy)
    data = json.loads((copy / "config.json").read_text())
    data["semantic_end_token_id"] += 1
    (copy / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="semantic_end_token_id"):
        open_checkpoint(copy)
    (copy / "codec.pth").unlink()
    with pytest.raises(CheckpointError, match="codec.pth"):
        open_checkpoint(copy)
