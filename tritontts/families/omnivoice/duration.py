"""How many audio frames OmniVoice should unmask for a text, before any audio exists.

OmniVoice is non-autoregressive: the target length is fixed up front. Upstream estimates it
from per-character "phonetic weights" (by Unicode category, then by script block) scaled by
the reference clip's frames per weight, with a power-curve boost for very short outputs.
The numbers here are upstream's (omnivoice 0.2.1 RuleDurationEstimator, also vendored by
vLLM-Omni) so that a request gets exactly the frame count the reference would pick.
"""
from __future__ import annotations

import bisect
import unicodedata
from functools import lru_cache

# Relative speaking time per character; 1.0 is one Latin letter.
SCRIPT_WEIGHTS = {
    "cjk": 3.0, "hangul": 2.5, "kana": 2.2, "ethiopic": 3.0, "yi": 3.0,
    "indic": 1.8, "thai_lao": 1.5, "khmer_myanmar": 1.8,
    "arabic": 1.5, "hebrew": 1.5,
    "latin": 1.0, "cyrillic": 1.0, "greek": 1.0, "armenian": 1.0, "georgian": 1.0,
    "default": 1.0,
}
PUNCTUATION, SPACE, DIGIT, MARK = 0.5, 0.2, 3.5, 0.0

# (first, last, script) for code points below U+FFF0, contiguous from 0. Upstream's blocks
# are coarse and we keep them as they are (e.g. U+1F00..U+30FF, Greek Extended through
# Katakana, all count as kana), since matching its frame counts matters more than phonetics.
_BLOCKS = (
    (0x0000, 0x02AF, "latin"), (0x02B0, 0x03FF, "greek"), (0x0400, 0x052F, "cyrillic"),
    (0x0530, 0x058F, "armenian"), (0x0590, 0x05FF, "hebrew"), (0x0600, 0x08FF, "arabic"),
    (0x0900, 0x0DFF, "indic"), (0x0E00, 0x0EFF, "thai_lao"), (0x0F00, 0x0FFF, "indic"),
    (0x1000, 0x109F, "khmer_myanmar"), (0x10A0, 0x10FF, "georgian"), (0x1100, 0x11FF, "hangul"),
    (0x1200, 0x139F, "ethiopic"), (0x13A0, 0x177F, "default"), (0x1780, 0x17FF, "khmer_myanmar"),
    (0x1800, 0x18FF, "default"), (0x1900, 0x19DF, "indic"), (0x19E0, 0x19FF, "khmer_myanmar"),
    (0x1A00, 0x1C7F, "indic"), (0x1C80, 0x1C8F, "cyrillic"), (0x1C90, 0x1CBF, "georgian"),
    (0x1CC0, 0x1CFF, "indic"), (0x1D00, 0x1DBF, "latin"), (0x1DC0, 0x1DFF, "default"),
    (0x1E00, 0x1EFF, "latin"), (0x1F00, 0x30FF, "kana"), (0x3100, 0x312F, "cjk"),
    (0x3130, 0x318F, "hangul"), (0x3190, 0x9FFF, "cjk"), (0xA000, 0xA4CF, "yi"),
    (0xA4D0, 0xA63F, "default"), (0xA640, 0xA69F, "cyrillic"), (0xA6A0, 0xA6FF, "default"),
    (0xA700, 0xA7FF, "latin"), (0xA800, 0xA82F, "indic"), (0xA830, 0xA87F, "default"),
    (0xA880, 0xA95F, "indic"), (0xA960, 0xA97F, "hangul"), (0xA980, 0xA9DF, "indic"),
    (0xA9E0, 0xA9FF, "khmer_myanmar"), (0xAA00, 0xAA5F, "indic"),
    (0xAA60, 0xAA7F, "khmer_myanmar"), (0xAA80, 0xAAFF, "indic"), (0xAB00, 0xAB2F, "ethiopic"),
    (0xAB30, 0xAB6F, "latin"), (0xAB70, 0xABBF, "default"), (0xABC0, 0xABFF, "indic"),
    (0xAC00, 0xD7AF, "hangul"), (0xD7B0, 0xFAFF, "cjk"), (0xFB00, 0xFDFF, "arabic"),
    (0xFE00, 0xFE6F, "default"), (0xFE70, 0xFEFF, "arabic"), (0xFF00, 0xFFEF, "latin"),
)
assert all(a[1] + 1 == b[0] for a, b in zip(_BLOCKS, _BLOCKS[1:])), "blocks must be contiguous"
_BLOCK_LAST = [last for _, last, _ in _BLOCKS]
_BLOCK_WEIGHT = [SCRIPT_WEIGHTS[script] for _, _, script in _BLOCKS]
_ARABIC_TATWEEL = 0x0640     # a stretching stroke, not a sound

# Upstream's defaults for the short-output boost: estimates under 50 frames are raised
# along a cube-root curve, so one-word requests do not come out clipped.
LOW_THRESHOLD, BOOST_STRENGTH = 50.0, 3.0
# Used when the request has no reference clip (or no transcript for it).
FALLBACK_REF_TEXT, FALLBACK_REF_FRAMES = "Nice to meet you.", 25


@lru_cache(maxsize=4096)     # bounded: texts are user input; the cache only saves lookups
def char_weight(char: str) -> float:
    code = ord(char)
    if 0x41 <= code <= 0x5A or 0x61 <= code <= 0x7A:
        return SCRIPT_WEIGHTS["latin"]
    if code == 0x20:
        return SPACE
    if code == _ARABIC_TATWEEL:
        return MARK
    # The general category decides before the block, so punctuation and digits inside a
    # script's block still weigh as punctuation and digits.
    major = unicodedata.category(char)[0]
    if major == "M":
        return MARK
    if major in "PS":
        return PUNCTUATION
    if major == "Z":
        return SPACE
    if major == "N":
        return DIGIT
    i = bisect.bisect_left(_BLOCK_LAST, code)
    if i < len(_BLOCKS):
        return _BLOCK_WEIGHT[i]
    # Upstream counts the supplementary ideographic planes as CJK, strictly above U+20000
    # (U+20000 itself and U+FFF0..U+1FFFF take the default weight).
    if code > 0x20000:
        return SCRIPT_WEIGHTS["cjk"]
    return SCRIPT_WEIGHTS["default"]


def text_weight(text: str) -> float:
    # Summed left to right, as upstream does, so the float is bit-identical.
    return sum(char_weight(c) for c in text)


def _boosted_frames(text: str, ref_text: str, ref_frames: float) -> float:
    if ref_frames <= 0 or not ref_text:
        return 0.0
    ref_weight = text_weight(ref_text)
    if ref_weight == 0:
        return 0.0
    # Same operation order as upstream (weight per frame, then divide) for identical floats.
    weight_per_frame = ref_weight / ref_frames
    frames = text_weight(text) / weight_per_frame
    if frames < LOW_THRESHOLD:
        return LOW_THRESHOLD * (frames / LOW_THRESHOLD) ** (1.0 / BOOST_STRENGTH)
    return frames


def estimate_frames(text: str, ref_text: str | None, ref_frames: int | None,
                    speed: float = 1.0) -> int:
    """Target frames for `text`, paced like `ref_text` spoken in `ref_frames` frames (or
    upstream's stock pace without a reference); speed > 1 shortens, <= 0 is ignored."""
    if ref_frames is None or not ref_text:
        ref_text, ref_frames = FALLBACK_REF_TEXT, FALLBACK_REF_FRAMES
    frames = _boosted_frames(text, ref_text, ref_frames)
    if speed > 0 and speed != 1.0:
        frames = frames / speed
    return max(1, int(frames))
