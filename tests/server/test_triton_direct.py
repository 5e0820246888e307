"""Clients that talk to Triton itself: tritonclient gRPC streaming, perf_analyzer, and
numeric parity of the served piper ensemble with piper-tts's own synthesis (perf_analyzer:
the family contract suite)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient

from tritontts.testing.grpc import stream_model

THREE = "The sun rose over the hills. Birds began to sing in the trees. It was a quiet morning."

STACK_FAMILIES = ("piper",)


def stream_piper(url: str, text: str, voice: str = "", params: dict | None = None):
    """One decoupled request to the `piper` ensemble; returns (its responses in order, error)."""
    return stream_model(url, "piper", text, voice, params)


def test_grpc_streaming_to_the_ensemble(stack):
    chunks, error = stream_piper(stack.grpc_url, THREE, params={"seed": 5})
    assert error is None
    assert len(chunks) == 3  # one per sentence
    assert [int(c.as_numpy("chunk_index")[0, 0]) for c in chunks] == [0, 1, 2]
    assert [bool(c.as_numpy("is_final")[0, 0]) for c in chunks] == [False, False, True]
    for c in chunks:
        assert int(c.as_numpy("sample_rate")[0, 0]) == 22050
        audio = c.as_numpy("audio").reshape(-1)
        assert audio.dtype == np.float32 and audio.size > 22050 // 2
        assert np.abs(audio).max() <= 1.0 and np.sqrt(np.mean(audio**2)) > 0.02


def test_grpc_bad_requests_are_tagged_errors(stack):
    chunks, error = stream_piper(stack.grpc_url, "Hello.", voice="nobody")
    assert not chunks and "[invalid_request] unknown voice 'nobody'" in str(error)
    chunks, error = stream_model(stack.grpc_url, "piper", "   ")
    assert not chunks and "[invalid_request] input is empty" in str(error)


def test_served_audio_matches_piper_tts_reference(stack):
    """Same voice, noise off: the ensemble must reproduce piper-tts's PiperVoice.synthesize."""
    from piper import PiperVoice, SynthesisConfig

    from tritontts.families.piper.voices import load_voice_table

    sentence = "The birch canoe slid on the smooth planks."
    chunks, error = stream_piper(stack.grpc_url, sentence,
                                 params={"noise_scale": 0.0, "noise_w_scale": 0.0})
    assert error is None and len(chunks) == 1
    ours = chunks[0].as_numpy("audio").reshape(-1)
    voice = PiperVoice.load(load_voice_table().resolve("default").model_path)
    ref = np.concatenate([c.audio_float_array for c in voice.synthesize(
        sentence, SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0))])
    assert ours.shape == ref.shape
    diff = float(np.abs(ours - ref).max())
    print(f"max-abs-diff vs piper-tts: {diff:.2e}")
    assert diff < 1e-5


def test_dynamic_batching_batches_this_tests_chunks_across_requests(stack):
    """Under these 8 concurrent streams, Triton executes piper_vits with batches > 1
    (counted as the difference in statistics before/after: earlier tests batch too)."""
    from concurrent.futures import ThreadPoolExecutor

    client = grpcclient.InferenceServerClient(stack.grpc_url)
    before = batch_counts(client, "piper_vits")
    text = " ".join(["Short sentence number one."] * 6)
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda _: stream_piper(stack.grpc_url, text), range(8)))
    assert all(err is None and len(chunks) == 6 for chunks, err in outcomes)
    after = batch_counts(client, "piper_vits")
    grown = {size: n - before.get(size, 0) for size, n in after.items() if n > before.get(size, 0)}
    print("piper_vits executions by batch size during this test:", grown)
    assert sum(size * n for size, n in grown.items()) == 8 * 6   # every chunk, once
    assert max(grown) > 1, grown


def batch_counts(client, model: str) -> dict[int, int]:
    """Executions so far by batch size (Triton's cumulative statistics)."""
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}


def test_plain_tritonserver_command_serves_the_model_repository(tmp_path):
    """Users may run tritonserver themselves: `python -m tritontts.deploy.tritonserver` is the real
    binary with the environment prepared; the piper ensemble streams from it."""
    from tritontts.testing.stack import REPO, free_port, new_user_environment

    grpc_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tritontts.deploy.tritonserver", "--model-repository=model_repository",
         "--model-repository=ensembles", "--model-control-mode=explicit", "--load-model=piper",
         f"--grpc-port={grpc_port}", f"--http-port={free_port()}", f"--metrics-port={free_port()}"],
        cwd=REPO, stdout=open(tmp_path / "triton.log", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True, env=new_user_environment(tmp_path / "caches"))
    try:
        url = f"localhost:{grpc_port}"
        client = grpcclient.InferenceServerClient(url)
        for _ in range(240):
            try:
                if client.is_model_ready("piper"):
                    break
            except Exception:
                pass
            assert proc.poll() is None, (tmp_path / "triton.log").read_text()[-3000:]
            time.sleep(0.5)
        chunks, error = stream_piper(url, "One sentence. And another one.")
        assert error is None and len(chunks) == 2
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
