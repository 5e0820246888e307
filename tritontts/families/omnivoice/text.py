"""OmniVoice's text-side request rules: language, voice-design instructions, the prompt text.

Each follows omnivoice 0.2.1 (OmniVoice.generate's preprocessing) so the model sees exactly
the token sequence upstream would build; where upstream would warn and carry on (an unknown
language) we answer 400 instead, since a silent language-agnostic fallback hides typos.
"""
from __future__ import annotations

import difflib
import re
from functools import cache
from pathlib import Path

from ...protocol import InvalidRequest

# Upstream treats only the CJK Unified Ideographs block as "Chinese" in these rules.
_HAN = "\u4e00-\u9fff"
_HAN_RE = re.compile(f"[{_HAN}]")


# --- language -------------------------------------------------------------------------------

@cache
def _language_table() -> tuple[frozenset[str], dict[str, str]]:
    codes, by_name = set(), {}
    path = Path(__file__).with_name("languages.tsv")
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        code, name = line.split("\t")
        codes.add(code)
        by_name[name.lower()] = code
    return frozenset(codes), by_name


def languages() -> list[str]:
    return sorted(_language_table()[0])


def resolve_language(value: str | None) -> str | None:
    """A language code or name (any case) -> OmniVoice's code; None/"none"/"" -> None (the
    model picks the language from the text)."""
    if value is None or value == "" or value.lower() == "none":
        return None
    codes, by_name = _language_table()
    if value in codes:          # codes are matched exactly, as upstream does
        return value
    code = by_name.get(value.lower())
    if code is None:
        raise InvalidRequest(
            f"language {_clip(value)!r} is not one OmniVoice speaks: give an ISO 639 code such "
            "as en, zh, de or a name such as English (or leave it out to let the model tell)")
    return code


# --- voice-design instructions ----------------------------------------------------------------

# Each category allows at most one item; the paired ones have an English and a Chinese form
# and are rewritten to the language of the text (the model was trained on matching pairs).
_PAIRED = {
    "gender": (("male", "男"), ("female", "女")),
    "age": (("child", "儿童"), ("teenager", "少年"), ("young adult", "青年"),
            ("middle-aged", "中年"), ("elderly", "老年")),
    "pitch": (("very low pitch", "极低音调"), ("low pitch", "低音调"),
              ("moderate pitch", "中音调"), ("high pitch", "高音调"),
              ("very high pitch", "极高音调")),
    "style": (("whisper", "耳语"),),
}
# Accents exist only in English and force English items; dialects only in Chinese and force
# Chinese items.
_ACCENTS = tuple(f"{a} accent" for a in ("american", "british", "australian", "chinese",
                                         "canadian", "indian", "korean", "portuguese",
                                         "russian", "japanese"))
_DIALECTS = tuple(f"{d}话" for d in ("河南", "陕西", "四川", "贵州", "云南", "桂林", "济南",
                                     "石家庄", "甘肃", "宁夏", "青岛", "东北"))

_TO_ZH = {en: zh for pairs in _PAIRED.values() for en, zh in pairs}
_TO_EN = {zh: en for en, zh in _TO_ZH.items()}
_CATEGORY = {item: cat for cat, pairs in _PAIRED.items() for pair in pairs for item in pair}
_CATEGORY.update({a: "accent" for a in _ACCENTS})
_CATEGORY.update({d: "dialect" for d in _DIALECTS})
_CATEGORIES = (*_PAIRED, "accent", "dialect")   # upstream's order, for the conflict message

_VALID_HINT = (
    "use comma-separated items, all English or all Chinese: gender male|female; "
    "age child|teenager|young adult|middle-aged|elderly; "
    "pitch very low|low|moderate|high|very high pitch; style whisper; accent "
    + "|".join(a.removesuffix(" accent") for a in _ACCENTS) + " accent; or the Chinese "
    "forms " + ", ".join("|".join(zh for _, zh in pairs) for pairs in _PAIRED.values())
    + " and dialects " + "|".join(_DIALECTS) + " (joined with ，)")


def _clip(s: str, n: int = 30) -> str:
    return s if len(s) <= n else s[:n] + "…"


def resolve_instructions(value: str | None, text: str) -> str | None:
    """Validate voice-design instructions and normalise them as upstream does: items
    lower-cased, rewritten to Chinese when the text has Han characters (or a dialect is
    given) and to English otherwise (or when an accent is given), joined with "，" or ", "."""
    if value is None or not value.strip():
        return None
    items = [i for i in re.split(r"\s*[,，]\s*", value.strip()) if i]
    items = [i.strip().lower() for i in items]
    unknown = [i for i in items if i not in _CATEGORY]
    if unknown:
        parts = []
        for item in unknown[:2]:       # bounded: the message echoes user input
            close = difflib.get_close_matches(item, _CATEGORY, n=1, cutoff=0.6)
            parts.append(f"{_clip(item)!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise InvalidRequest(f"instructions: unsupported {', '.join(parts)}; {_VALID_HINT}")
    if not items:                      # only commas: nothing to ask for
        return None

    dialects = [i for i in items if _CATEGORY[i] == "dialect"]
    accents = [i for i in items if _CATEGORY[i] == "accent"]
    if dialects and accents:
        raise InvalidRequest(
            f"instructions mix a Chinese dialect ({dialects[0]}) with an English accent "
            f"({accents[0]}): dialects are for Chinese speech, accents for English; keep one")
    use_zh = bool(dialects) or (not accents and bool(text and _HAN_RE.search(text)))
    items = [(_TO_ZH if use_zh else _TO_EN).get(i, i) for i in items]

    for category in _CATEGORIES:
        hits = [i for i in items if _CATEGORY[i] == category]
        if len(hits) > 1:
            raise InvalidRequest(
                f"instructions give more than one {category} ({' vs '.join(hits)}): each of "
                "gender, age, pitch, style, accent and dialect takes at most one item")
    return ("，" if use_zh else ", ").join(items)


# --- prompt text --------------------------------------------------------------------------

def combine_text(text: str, ref_text: str | None = None) -> str:
    """The reference transcript and the text as one string, cleaned as upstream does."""
    full = f"{ref_text.strip()} {text.strip()}" if ref_text else text.strip()
    full = re.sub(r"[\r\n]+", "", full)
    full = full.replace("（", "(").replace("）", ")")
    full = re.sub(r"[ \t]+", " ", full)
    # Chinese has no word spaces; the model was trained without them next to Han characters.
    return re.sub(f"(?<=[{_HAN}])\\s+|\\s+(?=[{_HAN}])", "", full)


# Characters that already end a transcript (upstream's list; its two-character "……" can
# never be a last character, so it is left out).
_END_MARKS = frozenset(";:,.!?…)]}\"'“”‘’；：，。！？、）】")


def add_punctuation(text: str) -> str:
    """A reference transcript stripped and closed with "." ("。" if it has Han characters)
    when it does not end in punctuation, as upstream prepares it."""
    text = text.strip()
    if text and text[-1] not in _END_MARKS:
        text += "。" if _HAN_RE.search(text) else "."
    return text


def text_part(text: str, ref_text: str | None = None) -> str:
    return f"<|text_start|>{combine_text(text, ref_text)}<|text_end|>"


def style_text(language: str | None, instructions: str | None, denoise: bool) -> str:
    """The style prefix; upstream writes "None" for an absent language or instruction."""
    return ("<|denoise|>" if denoise else "") + (
        f"<|lang_start|>{language or 'None'}<|lang_end|>"
        f"<|instruct_start|>{instructions or 'None'}<|instruct_end|>")


# Non-verbal tags the model knows; each is tokenized on its own so its ids do not depend on
# the neighbouring text (BPE merges across the bracket otherwise).
NONVERBAL_TAGS = (
    "laughter", "sigh", "confirmation-en", "question-en", "question-ah", "question-oh",
    "question-ei", "question-yi", "surprise-ah", "surprise-oh", "surprise-wa", "surprise-yo",
    "dissatisfaction-hnn")
_NONVERBAL_RE = re.compile(r"\[(?:" + "|".join(map(re.escape, NONVERBAL_TAGS)) + r")\]")


def prompt_token_ids(tokenizer, text: str) -> list[int]:
    """Token ids of `text` (a Hugging Face tokenizer), tags split out as upstream does."""
    def encode(segment: str) -> list[int]:
        return list(tokenizer(segment, add_special_tokens=False).input_ids) if segment else []

    ids, pos = [], 0
    for tag in _NONVERBAL_RE.finditer(text):
        ids += encode(text[pos:tag.start()])
        ids += encode(tag.group())
        pos = tag.end()
    ids += encode(text[pos:])
    if not ids:     # upstream then encodes the whole text with the tokenizer's own specials
        return list(tokenizer(text).input_ids)
    return ids
