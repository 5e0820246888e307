"""OmniVoice's generator against the reference package (omnivoice 0.2.1) on the same random
weights: the prompt sequence, one forward's logits (fp32, max-abs-diff), and the codes of
the whole unmasking loop with the same seeded Gumbel noise (equal), for the automatic
voice, voice design and cloning; each with a negative control."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritontts.families.omnivoice.generator import (
    UnmaskJob, UnmaskSettings, load_generator, unmask, unmask_schedule)
from tritontts.families.omnivoice.prompt import TextTokenizer, build_sequence
from tritontts.families.omnivoice.text import resolve_instructions
from tritontts.families.omnivoice.upstream import omnivoice_module

TOLERANCE = 1e-4
TEXT = "The birch canoe slid on the smooth planks."


@pytest.fixture(scope="module")
def ours(checkpoint):
    return load_generator(checkpoint)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return TextTokenizer(checkpoint.root)


@pytest.fixture(scope="module")
def reference(checkpoint, tokenizer):
    """The package's OmniVoice on the same weights (its from_pretrained would also load
    the codec and an ASR model; the generator needs the config, weights and tokenizer)."""
    from safetensors.torch import load_file

    with omnivoice_module("omnivoice.models.omnivoice") as module:
        import json

        config = module.OmniVoiceConfig(**json.loads((checkpoint.root / "config.json").read_text()))
        config.llm_config._attn_implementation = "sdpa"
        model = module.OmniVoice(config).eval()
        model.load_state_dict(load_file(str(checkpoint.path("model.safetensors"))), strict=True)
        model.text_tokenizer = tokenizer.tokenizer
        yield module, model


def _task(module, text, frames, language=None, instruct=None, ref_text=None, ref_codes=None):
    return module.GenerationTask(
        batch_size=1, texts=[text], target_lens=[frames], langs=[language], instructs=[instruct],
        ref_texts=[ref_text], ref_audio_tokens=[None if ref_codes is None else torch.from_numpy(ref_codes)],
        ref_rms=[None])


def _sequence(checkpoint, tokenizer, text, frames, language=None, instructions=None, ref_text=None,
              ref_codes=None):
    cfg = checkpoint.config
    return build_sequence(tokenizer, cfg.num_audio_codebook, cfg.audio_mask_id, text, language,
                          instructions, ref_text, ref_codes, frames=frames)


CASES = {
    "auto": dict(),
    "design": dict(language="en", instructions="female, low pitch, british accent"),
    "clone": dict(language="en", ref_text="This is the reference voice.", clone=True),
}


def _case(name):
    case = dict(CASES[name])
    ref_codes = None
    if case.pop("clone", False):
        ref_codes = np.random.default_rng(3).integers(0, 1024, (8, 30)).astype(np.int64)
    if case.get("instructions"):
        case["instructions"] = resolve_instructions(case["instructions"], TEXT)
    return case, ref_codes


@pytest.mark.parametrize("name", sorted(CASES))
def test_sequence_equals_the_package_prompt(checkpoint, tokenizer, reference, name):
    _, model = reference
    case, ref_codes = _case(name)
    seq = _sequence(checkpoint, tokenizer, TEXT, 20, ref_codes=ref_codes, **case)
    expected = model._prepare_inference_inputs(
        TEXT, 20, case.get("ref_text"), None if ref_codes is None else torch.from_numpy(ref_codes),
        case.get("language"), case.get("instructions"), denoise=True)
    assert np.array_equal(seq.ids, expected["input_ids"][0].numpy())
    audio = expected["audio_mask"][0].numpy()
    assert seq.audio_start == int(np.argmax(audio)) and audio[seq.audio_start:].all()


def test_logits_match_the_package_forward_within_1e_4(checkpoint, tokenizer, ours, reference):
    _, model = reference
    case, ref_codes = _case("clone")
    seq = _sequence(checkpoint, tokenizer, TEXT, 20, ref_codes=ref_codes, **case)
    ids = torch.from_numpy(seq.ids)
    n = ids.shape[1]
    audio = torch.arange(n) >= seq.audio_start
    with torch.no_grad():
        got = ours.logits(ids[None], audio[None], torch.zeros(1, n, dtype=torch.long), torch.arange(n)[None])[0]
        expected = model(input_ids=ids[None], audio_mask=audio[None],
                         attention_mask=torch.ones(1, 1, n, n, dtype=torch.bool)).logits[0]
        diff = float((got - expected).abs().max())
        assert diff <= TOLERANCE, diff
        # Negative control: one changed weight moves the logits past the bound.
        original = ours.llm.layers[0].mlp.down_proj.weight.clone()
        ours.llm.layers[0].mlp.down_proj.weight.add_(0.05)
        try:
            perturbed = ours.logits(ids[None], audio[None], torch.zeros(1, n, dtype=torch.long),
                                    torch.arange(n)[None])[0]
        finally:
            ours.llm.layers[0].mlp.down_proj.weight.copy_(original)
        assert float((perturbed - expected).abs().max()) > TOLERANCE


def _reference_codes(module, model, seed, steps, **task):
    torch.manual_seed(seed)   # the package draws its Gumbel noise from torch's global generator
    config = module.OmniVoiceGenerationConfig(num_step=steps)
    return model._generate_iterative(_task(module, **task), config)[0].numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_unmasked_codes_equal_the_package_with_the_same_seeded_noise(checkpoint, tokenizer, ours,
                                                                       reference, name):
    module, model = reference
    case, ref_codes = _case(name)
    frames, steps, seed = 24, 8, 1234
    seq = _sequence(checkpoint, tokenizer, TEXT, frames, ref_codes=ref_codes, **case)
    got = unmask(ours, [UnmaskJob(torch.from_numpy(seq.ids), seq.audio_start, frames, seed,
                                  UnmaskSettings(num_steps=steps))])[0].numpy()
    expected = _reference_codes(module, model, seed, steps, text=TEXT, frames=frames,
                                language=case.get("language"), instruct=case.get("instructions"),
                                ref_text=case.get("ref_text"), ref_codes=ref_codes)
    assert got.shape == (8, frames) and (got != checkpoint.config.audio_mask_id).all()
    assert np.array_equal(got, expected), f"{int((got != expected).sum())} of {got.size} codes differ"
    # Negative control: another seed's noise gives other codes.
    other = _reference_codes(module, model, seed + 1, steps, text=TEXT, frames=frames,
                             language=case.get("language"), instruct=case.get("instructions"),
                             ref_text=case.get("ref_text"), ref_codes=ref_codes)
    assert not np.array_equal(got, other)


def test_batched_jobs_give_each_job_its_single_codes(checkpoint, tokenizer, ours, monkeypatch):
    """Packing keeps sequences apart and each job draws its own noise: a request's codes do
    not depend on what it was batched with (guidance on and off, other lengths; rows small
    enough that the batch spans several rows, with padding)."""
    import tritontts.families.omnivoice.generator as generator

    monkeypatch.setattr(generator, "ROW_TOKENS", 64)
    case, ref_codes = _case("clone")
    a = _sequence(checkpoint, tokenizer, TEXT, 18, ref_codes=ref_codes, **case)
    b = _sequence(checkpoint, tokenizer, "Glue the sheet to the dark blue background.", 27)
    jobs = [UnmaskJob(torch.from_numpy(a.ids), a.audio_start, 18, 7, UnmaskSettings(num_steps=8)),
            UnmaskJob(torch.from_numpy(b.ids), b.audio_start, 27, 8,
                      UnmaskSettings(num_steps=8, guidance_scale=0.0))]
    together = unmask(ours, jobs)
    for job, codes in zip(jobs, together):
        assert torch.equal(codes, unmask(ours, [job])[0])


def test_schedule_unmasks_every_cell_exactly_once():
    for frames in (1, 7, 100):
        counts = unmask_schedule(frames, 8, 32, 0.1)
        assert sum(counts) == frames * 8 and all(c >= 0 for c in counts) and len(counts) == 32


def test_one_batch_with_two_step_counts_is_refused(checkpoint, tokenizer, ours):
    seq = _sequence(checkpoint, tokenizer, TEXT, 5)
    jobs = [UnmaskJob(torch.from_numpy(seq.ids), seq.audio_start, 5, 1, UnmaskSettings(num_steps=s))
            for s in (4, 8)]
    with pytest.raises(ValueError, match="num_steps"):
        unmask(ours, jobs)


def test_the_step_network_on_onnxruntime_matches_pytorch_and_gives_the_same_codes(
        checkpoint, tokenizer, ours, tmp_path, monkeypatch):
    """The generator's step exported (build/export.py, a GPU profile's TensorRT) computes
    the same logits, and with them the same codes."""
    pytest.importorskip("onnxruntime")
    from tritontts.families.omnivoice.generator import logits_graph
    from tritontts.nn.runtime import compare, select_runner

    monkeypatch.setenv("TRITONTTS_CACHE", str(tmp_path))
    graph = logits_graph(ours, max_rows=4, max_tokens=1024)
    runner = select_runner(graph, "onnxruntime")
    assert runner.runtime == "onnxruntime"
    for rows, tokens in ((1, 1), (1, 77), (3, 300)):
        diff, peak = compare(graph, runner, {"rows": rows, "tokens": tokens})
        assert diff <= TOLERANCE, (rows, tokens, diff, peak)
    case, ref_codes = _case("clone")
    seq = _sequence(checkpoint, tokenizer, TEXT, 20, ref_codes=ref_codes, **case)
    job = UnmaskJob(torch.from_numpy(seq.ids), seq.audio_start, 20, 5, UnmaskSettings(num_steps=8))
    eager = unmask(ours, [job])[0]
    ours.logits_runner = runner
    try:
        exported = unmask(ours, [job])[0]
    finally:
        ours.logits_runner = None
    assert torch.equal(eager, exported)
