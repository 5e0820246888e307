"""Qwen3-TTS VoiceDesign through the real tritonserver and front, on a tiny random
VoiceDesign checkpoint: the voice comes from the description in `instructions`."""
from __future__ import annotations

from tritontts.testing.audio import pcm16, rms

STACK_FAMILIES = ("qwen3_tts",)
STACK_CHECKPOINT_OPTIONS = {"qwen3_tts": {"kind": "voice_design"}}

TEXT = "Hello there, how are you today?"


def speak(http, **body):
    return http.post("/v1/audio/speech", json={"model": "qwen3_tts", "input": TEXT, "seed": 5,
                                               "max_new_tokens": 12, "response_format": "pcm", **body})


def test_a_described_voice_is_served_and_the_description_changes_it(http):
    calm = speak(http, instructions="A calm, low voice, speaking slowly.")
    bright = speak(http, instructions="A bright, excited young voice.")
    assert calm.status_code == bright.status_code == 200, calm.text
    assert pcm16(calm.content).size == 12 * 1920 and rms(pcm16(calm.content)) > 1e-3
    assert calm.content != bright.content


def test_voice_design_without_a_description_is_400(http):
    r = speak(http)
    assert r.status_code == 400
    assert "VoiceDesign needs instructions" in r.json()["error"]["message"]


def test_a_preset_speaker_is_400_pointing_to_instructions(http):
    r = speak(http, voice="vivian", instructions="A calm voice.")
    assert r.status_code == 400
    assert "describe it in instructions" in r.json()["error"]["message"]
