"""Clients that talk to Triton itself: tritonclient gRPC streaming, perf_analyzer, and
numeric parity of the served piper ensemble with piper-tts's own synthesis."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

THREE = "The sun rose over the hills. Birds began to sing in the trees. It was a quiet morning."


def stream_piper(url: str, text: str, voice: str = "", params: dict | None = None):
    """One decoupled request to the `piper` ensemble; returns its responses in order."""
    return stream_model(url, "piper", text, voice, params)


def stream_model(url: str, model: str, text: str, voice: str = "", params: dict | None = None):
    """One decoupled request to a family's ensemble; returns (responses in order, error)."""
    def tensor(name, value):
        t = grpcclient.InferInput(name, [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[value.encode()]], dtype=np.object_))
        return t

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(
            model, [tensor("text", text), tensor("voice", voice),
                      tensor("params", json.dumps(params or {}))],
            enable_empty_final_response=True)
        chunks = []
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                return chunks, error
            response = result.get_response()
            if result.as_numpy("audio") is not None:
                chunks.append(result)
            if response.parameters["triton_final_response"].bool_param:
                return chunks, None
    finally:
        client.stop_stream()
        client.close()


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
    for model in ("piper", "cosyvoice3"):
        chunks, error = stream_model(stack.grpc_url, model, "   ")
        assert not chunks and "[invalid_request] input is empty" in str(error)


def test_served_audio_matches_piper_tts_reference(stack):
    """Same voice, noise off: the ensemble must reproduce piper-tts's PiperVoice.synthesize."""
    from piper import PiperVoice, SynthesisConfig

    from tritontts.piper.voices import load_voice_table

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


def test_dynamic_batching_batches_chunks_across_requests(stack):
    """Under concurrent streams, Triton executes piper_vits with batches > 1."""
    from concurrent.futures import ThreadPoolExecutor

    text = " ".join(["Short sentence number one."] * 6)
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda _: stream_piper(stack.grpc_url, text), range(8)))
    assert all(err is None and len(chunks) == 6 for chunks, err in outcomes)
    client = grpcclient.InferenceServerClient(stack.grpc_url)
    stats = client.get_inference_statistics("piper_vits", as_json=True)
    sizes = {int(b["batch_size"]) for b in stats["model_stats"][0]["batch_stats"]}
    assert max(sizes) > 1, sizes


def test_perf_analyzer_streaming(stack, tmp_path):
    exe = Path(sys.executable).with_name("perf_analyzer")
    assert exe.exists(), "scripts/setup.sh installs perf_analyzer"
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [{
        "text": {"content": ["Hello there. How are you today?"], "shape": [1]},
        "voice": {"content": [""], "shape": [1]},
        "params": {"content": ["{}"], "shape": [1]}}]}))
    out = subprocess.run([str(exe), "-m", "piper", "-u", stack.grpc_url, "-i", "grpc",
                          "--streaming", "--input-data", str(data), "--concurrency-range", "1:2",
                          # Count windows and a loose stability bound: this checks that
                          # perf_analyzer drives the ensemble, not this noisy CPU's stability.
                          "--measurement-mode", "count_windows", "--measurement-request-count", "8",
                          "--stability-percentage", "100", "--max-trials", "5"],
                         capture_output=True, text=True, timeout=300)
    print(out.stdout[-3000:])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Concurrency: 2, throughput:" in out.stdout


def test_plain_tritonserver_command_serves_the_model_repository(tmp_path):
    """Users may run tritonserver themselves: `python -m tritontts.tritonserver` is the real
    binary with the environment prepared; the piper ensemble streams from it."""
    from conftest import REPO, free_port, new_user_environment

    grpc_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tritontts.tritonserver", "--model-repository=model_repository",
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
