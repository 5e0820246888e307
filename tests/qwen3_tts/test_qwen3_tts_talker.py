"""Qwen3-TTS talker, prompt and tokenization against the reference (qwen-tts-compat
0.1.1.post1) on the same random weights (tiny, float32): prefill logits, the prompt
embeddings of every task, the code predictor's codes and greedy frames."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tritontts.families.qwen3_tts.checkpoint import KINDS, open_checkpoint
from tritontts.families.qwen3_tts.prompt import (
    TextTokenizer, base_prompt, custom_voice_prompt, voice_design_prompt)
from tritontts.families.qwen3_tts.random_checkpoint import write_random_checkpoint
from tritontts.families.qwen3_tts.talker import TopKTopPSampler, greedy, load_talker
from tritontts.families.qwen3_tts.upstream import qwen_tts_module

TEXT = "Hello there, how are you today?"


class Side:
    """One checkpoint, opened by us and by the reference."""

    def __init__(self, root, ref):
        self.checkpoint = open_checkpoint(root)
        self.tokenizer = TextTokenizer(self.checkpoint)
        self.talker = load_talker(self.checkpoint)
        self.reference = ref.Qwen3TTSForConditionalGeneration(ref.Qwen3TTSConfig.from_pretrained(str(root))).eval()
        result = self.reference.load_state_dict(load_file(str(root / "model.safetensors")), strict=False)
        assert not result.missing_keys and not result.unexpected_keys
        self.ids = self.tokenizer.assistant_ids(TEXT)

    def reference_prompt(self, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's talker prompt and trailing text, caught where generate() hands them
        to the talker."""
        caught = {}

        class Caught(Exception):
            pass

        def spy(**talker_kwargs):
            caught.update(talker_kwargs)
            raise Caught

        self.reference.talker.generate = spy
        try:
            with pytest.raises(Caught):
                self.reference.generate(input_ids=[torch.tensor([self.ids])], max_new_tokens=2, **kwargs)
        finally:
            del self.reference.talker.generate
        return caught["inputs_embeds"][0], caught["trailing_text_hidden"][0]


@pytest.fixture(scope="module")
def sides(tmp_path_factory) -> dict[str, Side]:
    with qwen_tts_module("qwen_tts.core.models.modeling_qwen3_tts") as ref:
        return {kind: Side(write_random_checkpoint(tmp_path_factory.mktemp(f"qwen3-{kind}"), kind), ref)
                for kind in KINDS}


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def _ids(values) -> list[torch.Tensor | None]:
    return [None if values is None else torch.tensor([values])]


def test_tokenization_matches_the_reference_processor(sides):
    side = sides["custom_voice"]
    with qwen_tts_module("qwen_tts.core.models.processing_qwen3_tts") as ref:
        processor = ref.Qwen3TTSProcessor(tokenizer=side.tokenizer._tok)
    for ours, text in ((side.tokenizer.assistant_ids, f"<|im_start|>assistant\n{TEXT}<|im_end|>\n<|im_start|>assistant\n"),
                       (side.tokenizer.instruct_ids, "<|im_start|>user\nSpeak slowly.<|im_end|>\n"),
                       (side.tokenizer.ref_ids, "<|im_start|>assistant\nHi there.<|im_end|>\n")):
        theirs = processor(text=text, return_tensors="pt", padding=True)["input_ids"][0].tolist()
        arg = text.split("\n", 1)[1].split("<|im_end|>")[0]
        print(ours.__name__, ours(arg))
        assert ours(arg) == theirs
    assert side.tokenizer.assistant_ids(TEXT + "!") != side.ids     # negative control


def test_prefill_logits_match_the_reference_mrope(sides):
    """Our 1-D RoPE against the reference's MRoPE on a CustomVoice prompt: equal, because the
    reference's three position rows (temporal, height, width) are equal; with the height row
    made unequal its logits change, so the sections do matter when the rows differ."""
    side = sides["custom_voice"]
    prompt = custom_voice_prompt(side.talker, side.ids, "vivian", "english")
    embeds, n = prompt.embeds[None], prompt.embeds.shape[0]
    with torch.no_grad():
        ours = side.talker.codec_logits(side.talker(embeds))
        theirs = side.reference.talker(inputs_embeds=embeds, attention_mask=torch.ones(1, n, dtype=torch.long),
                                       use_cache=False).logits
        positions = torch.arange(n).view(1, 1, n).expand(3, 1, n)
        rows_equal = side.reference.talker.model(inputs_embeds=embeds, position_ids=positions, use_cache=False)
        # Not a uniform offset: RoPE sees only relative positions, so that would change nothing.
        height_zero = positions * torch.tensor([1, 0, 1]).view(3, 1, 1)
        rows_apart = side.reference.talker.model(inputs_embeds=embeds, position_ids=height_zero, use_cache=False)
    diff = _diff(ours, theirs)
    equal_rows = _diff(ours, side.reference.talker.codec_head(rows_equal.last_hidden_state))
    apart = _diff(ours, side.reference.talker.codec_head(rows_apart.last_hidden_state))
    print(f"prefill {n} rows: logits max|diff| {diff:.2e} (max|logit| {ours.abs().max():.2f}); explicit equal "
          f"position rows {equal_rows:.2e}; height row zeroed (negative control) {apart:.2e}")
    assert diff <= 1e-4 and equal_rows <= 1e-4
    assert apart > 1e-2


def test_prompt_embeddings_match_the_reference(sides):
    cases = []
    cv, vd, base = sides["custom_voice"], sides["voice_design"], sides["base"]
    instruct = cv.tokenizer.instruct_ids("Speak slowly, in a warm voice.")
    for language, speaker, instruction in (("English", "Vivian", None), ("Auto", "eric", instruct),
                                           ("Chinese", "DYLAN", None), ("Japanese", "ryan", instruct)):
        for non_streaming in (False, True):
            cases.append((f"CustomVoice {language}/{speaker}{' +instruct' if instruction else ''} ns={non_streaming}",
                          custom_voice_prompt(cv.talker, cv.ids, speaker, language, instruction, non_streaming),
                          cv.reference_prompt(instruct_ids=_ids(instruction), languages=[language],
                                              speakers=[speaker], non_streaming_mode=non_streaming)))
    design = vd.tokenizer.instruct_ids("A deep, calm male voice.")
    for non_streaming in (False, True):
        cases.append((f"VoiceDesign ns={non_streaming}",
                      voice_design_prompt(vd.talker, vd.ids, design, "English", non_streaming),
                      vd.reference_prompt(instruct_ids=_ids(design), languages=["English"],
                                          non_streaming_mode=non_streaming)))
    g = torch.Generator().manual_seed(5)
    xvec = torch.randn(base.talker.config.talker.hidden_size, generator=g)
    cases.append(("Base x-vector", base_prompt(base.talker, base.ids, xvec, "English"),
                  base.reference_prompt(languages=["English"], voice_clone_prompt=dict(
                      ref_code=[None], ref_spk_embedding=[xvec], x_vector_only_mode=[True], icl_mode=[False]))))
    for frames, transcript in ((3, "Hi there, this is me."), (24, "Hello.")):  # text longer / shorter than codes
        codes = torch.randint(0, 2048, (frames, 16), generator=g)
        ref_ids = base.tokenizer.ref_ids(transcript)
        for non_streaming in (False, True):
            cases.append((f"Base ICL {frames} frames ns={non_streaming}",
                          base_prompt(base.talker, base.ids, xvec, "Auto", ref_ids, codes, non_streaming),
                          base.reference_prompt(languages=["Auto"], ref_ids=[torch.tensor([ref_ids])],
                                                non_streaming_mode=non_streaming, voice_clone_prompt=dict(
                                                    ref_code=[codes], ref_spk_embedding=[xvec],
                                                    x_vector_only_mode=[False], icl_mode=[True]))))
    for name, ours, (embeds, trailing) in cases:
        d_prompt, d_trailing = _diff(ours.embeds, embeds), _diff(ours.trailing_text, trailing)
        print(f"{name}: prompt {tuple(embeds.shape)} {d_prompt:.1e}, trailing {tuple(trailing.shape)} {d_trailing:.1e}")
        assert d_prompt <= 1e-5 and d_trailing <= 1e-5
    # Negative control: Eric is a Sichuan-dialect speaker; with English he is not.
    english = custom_voice_prompt(cv.talker, cv.ids, "eric", "English")
    auto, _ = cv.reference_prompt(languages=["Auto"], speakers=["eric"])
    assert _diff(english.embeds, auto) > 1e-2


def test_code_predictor_matches_the_reference(sides):
    side = sides["base"]
    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(4, side.talker.config.talker.hidden_size, generator=g)
    code0 = torch.randint(0, 2048, (4,), generator=g)
    ours = side.talker.predict_codes(hidden, code0, greedy)
    talker = side.reference.talker
    with torch.no_grad():
        theirs = talker.code_predictor.generate(
            inputs_embeds=torch.cat([hidden[:, None], talker.get_input_embeddings()(code0[:, None])], dim=1),
            max_new_tokens=15, do_sample=False, output_hidden_states=True, return_dict_in_generate=True).sequences
    print("predicted codes (4 rows, batched):\n", ours)
    assert torch.equal(ours[:, 0], code0) and torch.equal(ours[:, 1:], theirs)
    # Negative control: another code 0 gives other codes.
    assert not torch.equal(side.talker.predict_codes(hidden, (code0 + 1) % 2048, greedy), ours)
    # The sampler seam: top-k 1 is greedy; a draw stays inside the top k.
    assert torch.equal(side.talker.predict_codes(hidden, code0, TopKTopPSampler(top_k=1)), ours)
    logits = torch.randn(3, 2048, generator=g)
    draws = TopKTopPSampler(top_k=5, generator=g)(logits.repeat(50, 1), 0).view(50, 3)
    top = logits.topk(5).indices
    assert all(int(d) in top[j] for row in draws for j, d in enumerate(row))


def test_greedy_frames_match_reference_generate(sides):
    side = sides["custom_voice"]
    prompt = custom_voice_prompt(side.talker, side.ids, "vivian", "English")
    ours = side.talker.generate_greedy(prompt.embeds, prompt.trailing_text, max_frames=8)
    with torch.no_grad():
        theirs, _ = side.reference.generate(input_ids=[torch.tensor([side.ids])], languages=["English"],
                                            speakers=["vivian"], non_streaming_mode=False, max_new_tokens=9,
                                            do_sample=False, subtalker_dosample=False)
    print(f"greedy frames: ours {tuple(ours.shape)}, reference {tuple(theirs[0].shape)}; code 0: {ours[:, 0].tolist()}")
    assert ours.shape[0] >= 4 and torch.equal(ours, theirs[0])
    # Negative control: another speaker gives other frames.
    other = custom_voice_prompt(side.talker, side.ids, "ryan", "English")
    assert not torch.equal(side.talker.generate_greedy(other.embeds, other.trailing_text, max_frames=8), ours)
