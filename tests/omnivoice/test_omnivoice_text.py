"""OmniVoice's text-side rules (tritontts.families.omnivoice.duration and .text) against the references:
omnivoice 0.2.1 (OmniVoice's private helpers, called with a stand-in `self`) and vLLM-Omni
0.30's copy of the duration estimator. No model and no Triton: a tiny byte-level BPE
tokenizer in Qwen2's layout, with OmniVoice's control tokens, stands in for the checkpoint's.
"""
from __future__ import annotations

import importlib
import random
from types import SimpleNamespace

import pytest

from tritontts.families.omnivoice import text as ovtext
from tritontts.families.omnivoice.duration import char_weight, estimate_frames, text_weight
from tritontts.families.omnivoice.text import (
    add_punctuation, combine_text, languages, prompt_token_ids, resolve_instructions,
    resolve_language, style_text, text_part)
from tritontts.protocol import InvalidRequest
from tritontts.families.omnivoice.upstream import omnivoice_module
from tritontts.upstream import vllm_omni_module

CONTROL_TOKENS = ("<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>",
                  "<|instruct_end|>", "<|text_start|>", "<|text_end|>")

# Scripts, categories and edge cases the weight table distinguishes; long entries push the
# estimate past the 50-frame boost threshold, short ones stay under it.
CORPUS = [
    "", " ", "\n", "\t\r\n", "\u200b", "\u0301", "\u0640", "...", "!?", "\u3000",
    "Hello, world.", "Nice to meet you.",
    "The quick brown fox jumps over the lazy dog, and then it naps in the warm afternoon sun.",
    "Chào thế giới, tôi là một trợ lý ảo.", "Grüße aus München!", "e\u0301te\u0301 cafe\u0301",
    "a\u20dd\u0302\u0303", "Ωμέγα και άλφα", "Привет, как дела?", "Բարեւ Ձեզ", "გამარჯობა",
    "שלום עולם", "مَرْحَبًا بِالْعَالَم", "عـــربي", "سلام دنیا",
    "नमस्ते दुनिया", "হ্যালো বিশ্ব", "வணக்கம்", "สวัสดีครับ ยินดีที่ได้รู้จัก", "ສະບາຍດີ",
    "សួស្តី", "မင်္ဂလာပါ", "བཀྲ་ཤིས་བདེ་ལེགས།", "ሰላም ለዓለም", "ꆈꌠꉙ", "ᏣᎳᎩ", "ᠮᠣᠩᠭᠣᠯ",
    "你好，世界！", "今天天气很好，我们一起去公园散步吧。然后在湖边喝杯茶，聊聊最近读过的书。",
    "（括号）测试", "안녕하세요, 만나서 반갑습니다.", "\u1100\u1161\u11a8", "ㄱㄴㄷ", "ㄅㄆㄇ",
    "こんにちは、カタカナ", "ｶﾀｶﾅ ＡＢＣ １２３", "ἀρχή",
    "1234567890", "٣٤٥", "½ Ⅻ ²", "Call 555-0100 at 9:30, ok?", "— «quoted» “text” ¿sí?",
    "Hello 🌍! This is fun 🎉", "👍🏽 👨\u200d👩\u200d👧", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "\U00020000", "\U00020001\U0002A6A5", "𪚥𰀀", "\U000F0000\U000E0041", "\ufff0\U0001FFFF",
    "\ud800", "\x00\x07\x7f",
    "Mixed: 你好 hello 안녕 こんにちは مرحبا नमस्ते 123 🎉!",
    " ".join(["A much longer paragraph that keeps going well past the short-output boost."] * 6),
]
# (ref_text, ref_frames): none, usual references, and the ones upstream treats specially
# (empty transcript -> the stock reference; zero weight or zero frames -> estimate 0).
REFERENCES = [(None, None), ("Hello, world.", 38), ("你好，世界！", 30), ("", 50),
              ("Nice", None), ("\u0640\u0301", 40), ("Some text", 0),
              ("A longer reference transcript of about this many characters.", 310)]
SPEEDS = (0.5, 1.0, 2.0, 1.5, 0.0, -1.0)


@pytest.fixture(scope="module")
def ov():
    """omnivoice.models.omnivoice, kept imported while this module's tests run (its helpers
    import lang_map lazily)."""
    with omnivoice_module("omnivoice.models.omnivoice") as module:
        yield module


@pytest.fixture(scope="module")
def vo():
    with vllm_omni_module("vllm_omni.model_executor.models.omnivoice.duration") as module:
        yield module


def reference_frames(ov, estimator):
    """OmniVoice._estimate_target_tokens with `estimator` as its duration estimator."""
    owner = SimpleNamespace(duration_estimator=estimator)
    return lambda text, ref_text, ref_frames, speed: ov.OmniVoice._estimate_target_tokens(
        owner, text, ref_text, ref_frames, speed=speed)


def frame_mismatches(expected):
    return [(t, rt, rf, s) for t in CORPUS for rt, rf in REFERENCES for s in SPEEDS
            if estimate_frames(t, rt, rf, s) != expected(t, rt, rf, s)]


# --- duration ------------------------------------------------------------------------------

def test_char_weight_equals_both_references_for_every_code_point(ov, vo):
    chars = [chr(cp) for cp in range(0x110000)]
    ours = [char_weight.__wrapped__(c) for c in chars]      # uncached: 1.1M distinct chars
    for estimator in (ov.RuleDurationEstimator(), vo.RuleDurationEstimator()):
        weigh = estimator._get_char_weight.__wrapped__
        wrong = [hex(ord(c)) for c, w in zip(chars, ours) if w != weigh(estimator, c)]
        assert wrong == [], f"{type(estimator).__module__}: {wrong[:10]}"


def test_text_weight_equals_both_references_within_1e9_over_the_corpus(ov, vo):
    for estimator in (ov.RuleDurationEstimator(), vo.RuleDurationEstimator()):
        for text in CORPUS:
            assert abs(text_weight(text) - estimator.calculate_total_weight(text)) <= 1e-9, text


def test_estimate_frames_equals_omnivoice_estimate_target_tokens_for_all_refs_and_speeds(ov):
    assert frame_mismatches(reference_frames(ov, ov.RuleDurationEstimator())) == []


def test_estimate_frames_equals_vllm_omni_estimator_for_all_refs_and_speeds(ov, vo):
    assert frame_mismatches(reference_frames(ov, vo.RuleDurationEstimator())) == []


def test_estimate_frames_without_reference_equals_vllm_omni_serving_rule(vo):
    # vLLM-Omni's generator always paces against the stock reference at speed 1.
    estimator = vo.RuleDurationEstimator()
    for text in CORPUS:
        expected = max(1, int(estimator.estimate_duration(text, "Nice to meet you.", 25)))
        assert estimate_frames(text, None, None) == expected, text


def test_corpus_covers_both_sides_of_the_boost_threshold_and_the_one_frame_floor():
    frames = [estimate_frames(t, rt, rf) for t in CORPUS for rt, rf in REFERENCES]
    assert min(frames) == 1 and any(1 < f < 50 for f in frames) and max(frames) > 100


def test_frame_comparison_fails_when_a_reference_weight_changes(ov):
    # Negative control: the same comparison must notice a 0.1 change in one weight.
    estimator = ov.RuleDurationEstimator()
    estimator.weights = {**estimator.weights, "digit": 3.4}
    assert frame_mismatches(reference_frames(ov, estimator)) != []


# --- language ------------------------------------------------------------------------------

def assert_language_like_reference(ov, value):
    expected = ov._resolve_language(value)
    if expected is None and value and value.lower() != "none":
        # upstream warns and drops the language; we answer 400 naming the field
        with pytest.raises(InvalidRequest, match="^language .*ISO 639 code"):
            resolve_language(value)
    else:
        assert resolve_language(value) == expected, value


def test_resolve_language_equals_reference_for_every_code_and_name_in_any_case(ov):
    name_to_id = importlib.import_module("omnivoice.utils.lang_map").LANG_NAME_TO_ID
    for code in set(name_to_id.values()):
        assert resolve_language(code) == ov._resolve_language(code) == code
    for name, code in name_to_id.items():
        for variant in (name, name.upper(), name.title(), name.capitalize()):
            assert_language_like_reference(ov, variant)
        assert resolve_language(name.title()) == code


def test_resolve_language_gives_none_for_none_and_empty_like_reference(ov):
    for value in (None, "none", "None", "NONE", ""):
        assert resolve_language(value) is None and ov._resolve_language(value) is None


def test_resolve_language_rejects_unknown_as_invalid_request_where_reference_drops_it(ov):
    for value in ("xx", "Klingon", "EN", " en", "english ", "en-US", "x" * 500):
        assert_language_like_reference(ov, value)
    with pytest.raises(InvalidRequest) as caught:
        resolve_language("x" * 500)
    assert len(str(caught.value)) < 200


def test_languages_are_the_reference_codes_sorted_and_names_match_reference_names(ov):
    lang_map = importlib.import_module("omnivoice.utils.lang_map")
    assert languages() == sorted(lang_map.LANG_IDS)
    codes, by_name = ovtext._language_table()
    assert by_name == lang_map.LANG_NAME_TO_ID


# --- voice-design instructions ---------------------------------------------------------------

TEXTS = ("Hello there.", "你好，世界。", "", "こんにちは", "Mixed 中 text")


def reference_instructions(ov, value, text):
    use_zh = bool(text and ov._ZH_RE.search(text))
    return ov._resolve_instruct(value, use_zh=use_zh)


def assert_instructions_like_reference(ov, value, text):
    try:
        expected = reference_instructions(ov, value, text)
    except ValueError:
        with pytest.raises(InvalidRequest) as caught:
            resolve_instructions(value, text)
        message = str(caught.value)
        assert message.startswith("instructions") and len(message) <= 600, message
        return
    # only commas: upstream gives "", which its prompt writes as "None", like our None
    assert resolve_instructions(value, text) == (expected or None), (value, text)


@pytest.mark.parametrize("value", [
    None, "", "   ", ",", " ，, ", "male", "Female", "male, young adult", "MALE,Elderly",
    "female， low pitch，whisper", "男，青年", "女, 老年", "male，中年, high pitch",
    " , male, british accent , ", "indian accent, female, very high pitch", "四川话，男",
    "东北话, female, 极低音调", "child, moderate pitch, whisper, american accent",
    "middle-aged", "teenager ,  very low pitch",
])
def test_resolve_instructions_normalises_valid_items_like_reference(ov, value):
    for text in TEXTS:
        assert_instructions_like_reference(ov, value, text)


@pytest.mark.parametrize("value", [
    "mael", "male; female", "loud", "male, female", "男，female", "male, 男",
    "british accent, 四川话", "american accent, indian accent", "河南话，陕西话",
    "child, elderly", "low pitch, high pitch", "whisper, 耳语", "very  low pitch",
    "young-adult", "male、女", "x" * 300 + ", " + "y" * 300 + ", z, w",
])
def test_resolve_instructions_raises_invalid_request_where_reference_raises(ov, value):
    with pytest.raises(ValueError):
        reference_instructions(ov, value, "Hello.")
    for text in TEXTS:
        assert_instructions_like_reference(ov, value, text)


def test_resolve_instructions_matches_reference_on_random_item_mixes(ov):
    rng = random.Random(0)
    pool = sorted(ovtext._CATEGORY) + ["mael", "loud", "Whisper ", "YOUNG ADULT", "男 ", ""]
    separators = (", ", ",", "，", " ， ", " ,", ",,", "，,")
    for _ in range(400):
        items = [rng.choice(pool) for _ in range(rng.randint(1, 4))]
        items = [i.upper() if rng.random() < 0.2 else i for i in items]
        value = "".join(i + rng.choice(separators) for i in items[:-1]) + items[-1]
        if rng.random() < 0.2:
            value = " , " + value + "， "
        assert_instructions_like_reference(ov, value, rng.choice(TEXTS))


def test_invalid_instructions_message_lists_every_valid_item():
    with pytest.raises(InvalidRequest) as caught:
        resolve_instructions("mael", "Hello.")
    message = str(caught.value)
    assert "did you mean 'male'" in message
    for item in ovtext._CATEGORY:
        stem = item.removesuffix(" accent").removesuffix(" pitch").removeprefix("very ")
        assert stem in message, item


# --- prompt text -------------------------------------------------------------------------------

def test_combine_text_equals_reference_on_fixed_and_random_strings(ov):
    cases = [("Hello  world\n", None), ("  text ", "  ref text  "), ("a\r\nb", ""),
             ("你 好 ， 世界", "我 是 ref"), ("（括号） and\ttabs", "ref\t\t here"),
             ("中\u3000文\xa0a", None), ("x", "   "), ("", "only ref"), ("", None)]
    rng = random.Random(1)
    alphabet = ["a", "b", " ", "\t", "\n", "\r", "中", "文", "（", "）", "\u3000", "\xa0", "."]
    for _ in range(400):
        make = lambda: "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))  # noqa: E731
        cases.append((make(), rng.choice([None, "", make()])))
    for text, ref_text in cases:
        assert combine_text(text, ref_text) == ov._combine_text(text, ref_text), (text, ref_text)


def test_add_punctuation_equals_reference(ov):
    for text in ("", "  ", "Hello", "Hello.", "你好", "你好。", "Hi 你好", "ok)", "wait…",
                 "quote'", "》", "」", " spaced ", "数字123", "end、"):
        assert add_punctuation(text) == ov.add_punctuation(text), text


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tiny byte-level BPE in Qwen2's layout (its pre-split regex), with OmniVoice's
    control tokens as added special tokens, saved and loaded back with AutoTokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", *CONTROL_TOKENS]
    # "]haha" in training gives it merges that a standalone "]" cannot use
    corpus = ["Hello world, nice to meet you. [laughter] haha [sigh] 你好世界 question surprise",
              "[laughter]haha [sigh]haha"]
    bpe.train_from_iterator(corpus * 10, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("qwen2-style-tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                            pad_token="<|endoftext|>",
                            additional_special_tokens=list(CONTROL_TOKENS)).save_pretrained(path)
    loaded = AutoTokenizer.from_pretrained(str(path))
    for token in CONTROL_TOKENS:
        assert len(loaded(token, add_special_tokens=False).input_ids) == 1, token
    return loaded


TAGGED = ["", "no tags at all", "<|text_start|>Hello [laughter] world<|text_end|>",
          "[laughter]haha", "haha[sigh]", "[sigh][laughter]", "[unknown] tag", "[LAUGHTER]",
          "你好[laughter]世界", "[question-en]?", "a [laughter", "[[sigh]]",
          " ".join(f"x[{t}]y" for t in ovtext.NONVERBAL_TAGS)]


def test_prompt_token_ids_equals_reference_tokenize_with_nonverbal_tags(ov, tokenizer):
    for text in TAGGED:
        expected = ov._tokenize_with_nonverbal_tags(text, tokenizer)[0].tolist()
        assert prompt_token_ids(tokenizer, text) == expected, text


def test_prompt_token_ids_tokenizes_a_tag_apart_from_the_word_it_touches(tokenizer):
    # "]haha" is one pre-token in context, so the parity above does exercise the split.
    whole = tokenizer("[laughter]haha", add_special_tokens=False).input_ids
    split = prompt_token_ids(tokenizer, "[laughter]haha")
    assert split != whole
    assert split == (tokenizer("[laughter]", add_special_tokens=False).input_ids
                     + tokenizer("haha", add_special_tokens=False).input_ids)


@pytest.mark.parametrize("language,instructions", [
    (None, None), ("en", None), (None, "male, british accent"), ("zh", "女，四川话")])
def test_style_text_and_text_part_give_reference_prepare_inference_input_ids(
        ov, tokenizer, language, instructions):
    import torch

    codebooks, frames, mask_id = 2, 5, 1023
    owner = SimpleNamespace(text_tokenizer=tokenizer, device=torch.device("cpu"),
                            config=SimpleNamespace(num_audio_codebook=codebooks,
                                                   audio_mask_id=mask_id))
    for text, ref_text in [("Hello [laughter] there!", None), ("你好 世界", "参考 文本"),
                           ("Line\nbreak  text", "A  reference.")]:
        for has_ref in (False, True):
            for denoise in (False, True):
                ref_codes = torch.arange(codebooks * 3).reshape(codebooks, 3) if has_ref else None
                ids = ov.OmniVoice._prepare_inference_inputs(
                    owner, text, frames, ref_text=ref_text, ref_audio_tokens=ref_codes,
                    lang=language, instruct=instructions, denoise=denoise)["input_ids"]
                prompt = ids[0, 0, :ids.shape[2] - frames - (3 if has_ref else 0)].tolist()
                ours = (tokenizer(style_text(language, instructions, denoise and has_ref)).input_ids
                        + prompt_token_ids(tokenizer, text_part(text, ref_text)))
                assert ours == prompt, (text, ref_text, has_ref, denoise)


def test_style_text_writes_none_for_absent_fields_and_denoise_only_when_asked():
    assert style_text(None, None, False) == (
        "<|lang_start|>None<|lang_end|><|instruct_start|>None<|instruct_end|>")
    assert style_text("en", "male", True) == (
        "<|denoise|><|lang_start|>en<|lang_end|><|instruct_start|>male<|instruct_end|>")
    assert text_part(" hi ", " ref ") == "<|text_start|>ref hi<|text_end|>"
