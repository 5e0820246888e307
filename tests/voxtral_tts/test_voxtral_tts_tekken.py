"""The tiny tekken.json the random writer makes is a real one: mistral-common reads it,
tokenizes text through its BPE, and lays out a speech request for a preset voice as the
released model expects: [BOS] [BEGIN_AUDIO] [AUDIO] x voice tokens [NEXT_AUDIO_TEXT] text
[REPEAT_AUDIO_TEXT] [BEGIN_AUDIO]."""
from __future__ import annotations

import pytest

from tritontts.families.voxtral_tts.random_checkpoint import write_tekken


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    path = write_tekken(tmp_path_factory.mktemp("voxtral") / "tekken.json", {"casual_male": 7, "neutral_female": 3})
    return MistralTokenizer.from_file(str(path))


def test_speech_request_layout_for_a_preset_voice(tokenizer):
    from mistral_common.protocol.speech.request import SpeechRequest

    text = "Hello there, how are you today?"
    ids = tokenizer.instruct_tokenizer.encode_speech_request(SpeechRequest(input=text, voice="casual_male")).tokens
    text_ids = tokenizer.instruct_tokenizer.tokenizer.encode(text, bos=False, eos=False)
    assert ids == [1, 25] + [24] * 7 + [36] + text_ids + [35, 25]
    assert all(i >= 100 for i in text_ids) and len(text_ids) < len(text)     # BPE merges in use
    assert tokenizer.instruct_tokenizer.tokenizer.decode(text_ids) == text


def test_another_voice_has_its_own_placeholder_count(tokenizer):
    from mistral_common.protocol.speech.request import SpeechRequest

    ids = tokenizer.instruct_tokenizer.encode_speech_request(SpeechRequest(input="Hi.", voice="neutral_female")).tokens
    assert ids.count(24) == 3
