"""Voxtral TTS through the real tritonserver and front on a tiny random checkpoint: a seeded
stream equals the pipeline run in this process (mistral-common's prompt, our PyTorch talker
with the same per-request noise, one whole codec decode) in the chunk plan the talker
promises (5 frames, then 25); the preset voices are listed and each speaks differently;
what the model cannot do is a 400 that says so."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritontts.family import synthetic_reference
from tritontts.testing.audio import pcm16, rms
from tritontts.testing.grpc import stream_model

STACK_FAMILIES = ("voxtral_tts",)
TEXT = "The birch canoe slid on the smooth planks."
HOP = 1920


def in_process_audio(root, text: str, voice: str, seed: int, frames: int) -> np.ndarray:
    from mistral_common.protocol.speech.request import SpeechRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from safetensors.torch import load_file

    from tritontts.families.voxtral_tts.checkpoint import open_checkpoint
    from tritontts.families.voxtral_tts.codec import load_codec
    from tritontts.families.voxtral_tts.talker import VoxtralTalker, talker_state

    ckpt = open_checkpoint(root)
    state = load_file(str(ckpt.path("consolidated.safetensors")))
    talker = VoxtralTalker(ckpt.config)
    talker.load_state_dict(talker_state(state))
    tokenizer = MistralTokenizer.from_file(str(ckpt.path("tekken.json")))
    ids = torch.tensor(tokenizer.instruct_tokenizer.encode_speech_request(SpeechRequest(input=text, voice=voice)).tokens)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        codes = talker.eval().generate(talker.prompt_embeds(ids, ckpt.voice_embedding(voice)),
                                       lambda: torch.randn(1, 36, generator=gen), frames)
    audio = load_codec(state, ckpt.config.codec, "consolidated").decode((codes - 2).T[None])[0].numpy()
    return np.clip(audio, -1, 1)


def test_a_seeded_stream_equals_the_pipeline_in_process(stack, random_checkpoints):
    chunks, error = stream_model(stack.grpc_url, "voxtral_tts", TEXT, voice="neutral_female",
                                 params={"seed": 11, "max_new_tokens": 40})
    assert error is None, error
    want = in_process_audio(random_checkpoints["voxtral_tts"], TEXT, "neutral_female", 11, 40)
    sizes = [c.as_numpy("audio").size // HOP for c in chunks]
    got = np.concatenate([c.as_numpy("audio").reshape(-1) for c in chunks])
    diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
    print(f"{want.size // HOP} frames in chunks of {sizes}; max-abs-diff {diff:.2e}")
    plan = [5] + [25] * len(sizes)
    assert sizes[:-1] == plan[:len(sizes) - 1] and 0 < sizes[-1] <= plan[len(sizes) - 1]
    assert sum(sizes) == want.size // HOP
    assert {int(c.as_numpy("sample_rate").reshape(-1)[0]) for c in chunks} == {24000}
    assert diff < 1e-4 and rms(got) > 1e-3


def test_the_preset_voices_are_listed_and_each_speaks_differently(http):
    listed = http.get("/v1/audio/voices").json()
    names = str(listed)
    assert "casual_male" in names and "neutral_female" in names
    audio = {}
    for voice in ("casual_male", "neutral_female"):
        r = http.post("/v1/audio/speech", json={"model": "voxtral_tts", "input": TEXT, "voice": voice, "seed": 3,
                                                "max_new_tokens": 15, "response_format": "pcm"})
        assert r.status_code == 200, r.text
        audio[voice] = pcm16(r.content)
    assert audio["casual_male"].shape == audio["neutral_female"].shape
    assert float(np.abs(audio["casual_male"] - audio["neutral_female"]).max()) > 1e-2


@pytest.mark.parametrize("fields,needle", [
    (synthetic_reference(), "preset voices only"),
    ({"instructions": "whisper"}, "no style instructions"),
    ({"voice": "nobody"}, "unknown voice"),
    ({"extra_params": {"cfg_value": 9}}, "cfg_value"),
])
def test_what_the_model_cannot_do_is_a_400_that_says_so(http, fields, needle):
    r = http.post("/v1/audio/speech", json={"model": "voxtral_tts", "input": TEXT, "max_new_tokens": 10, **fields})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert http.get("/health").status_code == 200
