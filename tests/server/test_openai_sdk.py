"""The official OpenAI SDK against the front."""
from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from tritontts.testing.audio import decode, rms

STACK_FAMILIES = ("piper",)


@pytest.fixture(scope="module")
def sdk(stack):
    return OpenAI(base_url=stack.url + "/v1", api_key="unused")


def test_speech_create(sdk):
    response = sdk.audio.speech.create(model="piper", voice="default",
                                       input="Hello from the OpenAI SDK.", response_format="wav")
    audio, rate = decode(response.content)
    assert rate == 22050 and audio.size / rate > 1.0 and rms(audio) > 0.02


def test_speech_streaming_response(sdk):
    with sdk.audio.speech.with_streaming_response.create(
            model="tts-1", voice="default", response_format="mp3",
            input="Streaming through the SDK. It arrives in pieces. Then it ends.") as response:
        pieces = list(response.iter_bytes())
    audio, rate = decode(b"".join(pieces))
    assert rate == 22050 and audio.size / rate > 2.0 and rms(audio) > 0.02


def test_sdk_extra_body_and_errors(sdk):
    a = sdk.audio.speech.create(model="piper", voice="default", input="Seeded.",
                                response_format="pcm", extra_body={"seed": 9})
    b = sdk.audio.speech.create(model="piper", voice="default", input="Seeded.",
                                response_format="pcm", extra_body={"seed": 9})
    assert a.content == b.content
    with pytest.raises(openai.BadRequestError, match="valid voices"):
        sdk.audio.speech.create(model="piper", voice="alloy", input="Hi.")
    with pytest.raises(openai.NotFoundError):
        sdk.audio.speech.create(model="nope", voice="default", input="Hi.")
