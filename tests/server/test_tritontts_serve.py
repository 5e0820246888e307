"""`tritontts serve` as a vLLM-Omni user runs it: two released repo ids, from an offline
Hugging Face cache of tiny checkpoints written in the cache's own layout under those ids,
vLLM-Omni's flags on the line; one tritonserver serves both, each under its repo id as the
model, with that family's request. A repo id the cache lacks stops the launch in one line,
with nothing left running."""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tritontts.families import FAMILIES
from tritontts.testing.audio import decode, rms
from tritontts.testing.hub import hf_cache
from tritontts.testing.stack import (
    REPO, TINY_KV_REQUESTS, free_port, inspect_talker_models, new_user_environment, wait_healthy)

MODELS = {"Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice": "qwen3_tts", "openbmb/VoxCPM2": "voxcpm2"}


@pytest.fixture(scope="module")
def served(random_checkpoints, caches, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tritontts-serve")
    for repo_id, family in MODELS.items():
        hf_cache(tmp / "hub", repo_id, random_checkpoints[family])
    inspect_talker_models(caches)
    env = {**new_user_environment(caches), "HF_HUB_CACHE": str(tmp / "hub"), "HF_HUB_OFFLINE": "1"}
    port = free_port()
    log = tmp / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "frontend.serve", "serve", *MODELS, "--omni", "--trust-remote-code",
         "--host", "127.0.0.1", "--port", str(port), "--stage-init-timeout", "900",
         "--gpu-memory-utilization", "0.9", "--grpc-port", str(free_port()), "--http-port", str(free_port()),
         "--metrics-port", str(free_port()), "--kv-requests", str(TINY_KV_REQUESTS),
         "--voices-dir", str(tmp / "voices")],
        cwd=REPO, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 900, lambda: log.read_text()[-4000:], "tritontts serve")
        yield url, log
    finally:
        proc.terminate()
        assert proc.wait(120) == 0, log.read_text()[-4000:]


def test_each_repo_id_is_served_as_its_model_with_its_familys_request(served):
    url, log = served
    text = log.read_text()
    for repo_id, family in MODELS.items():
        assert f"{repo_id}: {family}" in text and f"served as model '{repo_id}'" in text
        body = {"model": repo_id, "input": "Hello there.", **FAMILIES[family].example_params(), "seed": 1}
        r = httpx.post(url + "/v1/audio/speech", json=body, timeout=300)
        assert r.status_code == 200, r.text
        audio, rate = decode(r.content)
        assert rate == FAMILIES[family].capabilities.sample_rate and audio.size > 0 and rms(audio) > 1e-3
    assert "qwen3_tts (CustomVoice)" in text
    assert "--omni: accepted;" in text and "--trust-remote-code: accepted;" in text
    assert "--gpu-memory-utilization: accepted;" in text
    listed = {m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}
    assert set(MODELS) <= listed


def test_a_repo_id_missing_from_the_offline_cache_stops_the_launch_in_one_line(tmp_path, caches):
    env = {**new_user_environment(caches), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "frontend.serve", "serve", "fishaudio/s2-pro", "--omni",
                           "--port", str(free_port())], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"tritontts serve: fishaudio/s2-pro: not in the Hugging Face cache ({tmp_path / 'hub'}) and "
                     "downloads are off (HF_HUB_OFFLINE): fetch it first with `huggingface-cli download "
                     "fishaudio/s2-pro` (or `hf download fishaudio/s2-pro`)"], done.stderr
