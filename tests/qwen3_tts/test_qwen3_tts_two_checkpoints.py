"""Two Qwen3-TTS checkpoints served at once by one server under different model names
(`--checkpoint qwen3_tts=CUSTOM --checkpoint qwen3_tts-base=BASE`): each model answers with
its own checkpoint's tasks."""
from __future__ import annotations

import httpx
import pytest

from tritontts.families import FAMILIES
from tritontts.testing.audio import pcm16
from tritontts.testing.stack import Stack

TEXT = "Hello there, how are you today?"


@pytest.fixture(scope="module")
def two(stacks, random_checkpoints, caches, tmp_path_factory):
    stacks.close()    # one server at a time on this machine
    stacks.prepare(("qwen3_tts",))
    custom = random_checkpoints.get("qwen3_tts", kind="custom_voice")
    base = random_checkpoints.get("qwen3_tts", kind="base")
    stack = Stack(tmp_path_factory.mktemp("two-checkpoints"), ("qwen3_tts",),
                  {"qwen3_tts": custom}, caches,
                  extra_args=("--checkpoint", f"qwen3_tts-base={base}")).start()
    yield stack
    assert stack.stop() == 0, stack.tail()


def test_both_models_are_listed_and_healthy(two):
    models = [m["id"] for m in httpx.get(two.url + "/v1/models").json()["data"]]
    assert models == ["qwen3_tts", "qwen3_tts-base"]
    assert httpx.get(two.url + "/health").status_code == 200


def test_each_model_serves_its_own_checkpoints_task(two):
    ref = FAMILIES["qwen3_tts"].variants["base"].example_params()
    custom = httpx.post(two.url + "/v1/audio/speech", timeout=300, json={
        "model": "qwen3_tts", "input": TEXT, "voice": "vivian", "max_new_tokens": 8,
        "response_format": "pcm", "seed": 1})
    cloned = httpx.post(two.url + "/v1/audio/speech", timeout=300, json={
        "model": "qwen3_tts-base", "input": TEXT, "max_new_tokens": 8, "response_format": "pcm",
        "seed": 1, **{k: v for k, v in ref.items() if k != "max_new_tokens"}})
    assert custom.status_code == 200 and cloned.status_code == 200, (custom.text, cloned.text)
    assert pcm16(custom.content).size == pcm16(cloned.content).size == 8 * 1920
    wrong = httpx.post(two.url + "/v1/audio/speech", timeout=300, json={
        "model": "qwen3_tts-base", "input": TEXT, "voice": "vivian", "task_type": "CustomVoice"})
    assert wrong.status_code == 400 and "needs a custom_voice checkpoint" in wrong.json()["error"]["message"]
