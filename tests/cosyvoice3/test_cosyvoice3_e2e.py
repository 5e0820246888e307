"""CosyVoice3 through the real tritonserver and front, on the tiny random-weight checkpoint:
vLLM talker -> flow -> CausalHiFT, streamed; voice cloning inputs; batching across requests."""
from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile as sf
import tritonclient.grpc as grpcclient

from tritontts.testing.audio import decode, pcm16, rms
from tritontts.testing.grpc import stream_model

STACK_FAMILIES = ("cosyvoice3",)


def wav_b64(audio: np.ndarray, rate: int) -> str:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def reference(seconds: float = 3.0, rate: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 150 * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32)


REF = {"ref_audio": wav_b64(reference(), 24000), "ref_text": "This is the reference voice."}
TEXT = "Hello there, this is a cloned voice speaking."


def speak(http, **body):
    return http.post("/v1/audio/speech", json={"model": "cosyvoice3", "input": TEXT, **REF, **body})


def test_non_streaming_wav_is_24khz(http):
    r = speak(http, response_format="wav", seed=1)
    assert r.status_code == 200, r.text
    audio, rate = decode(r.content)
    assert rate == 24000 and audio.size / rate > 0.5 and rms(audio) > 1e-3


def test_streaming_wav_arrives_in_chunks_and_equals_non_streaming(http):
    body = {"model": "cosyvoice3", "input": TEXT, **REF, "seed": 5, "response_format": "pcm"}
    whole = pcm16(http.post("/v1/audio/speech", json=body).content)
    with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio"}) as r:
        assert r.status_code == 200
        pieces = list(r.iter_bytes())
    streamed = pcm16(b"".join(pieces))
    assert len(pieces) >= 2 and streamed.size == whole.size
    assert float(np.abs(streamed - whole).max()) <= 1e-4
    with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio", "response_format": "wav"}) as r:
        data = b"".join(r.iter_bytes())
    assert data[:4] == b"RIFF" and int.from_bytes(data[24:28], "little") == 24000


def test_grpc_chunk_sizes_follow_the_served_hop_schedule(stack, tiny_cosyvoice3):
    """Each non-final chunk voices exactly one hop: 15 tokens (+ the pad that aligns prompt +
    first hop to 15) less the vocoder's withheld frames, then 30, 60, 60, ... tokens, at 2 mel
    frames x 480 samples per token; the last chunk carries the rest."""
    import json

    from tritontts.families.cosyvoice3.checkpoint import open_checkpoint
    from tritontts.families.cosyvoice3.hops import HopSchedule, TokenChunker
    from tritontts.families.cosyvoice3.request import parse_cosyvoice3_params
    from tritontts.families.cosyvoice3.stages import CosyVoice3HiftStage, CosyVoice3PromptStage
    from tritontts.serving.stage import StageContext
    from tritontts.testing.stack import REPO

    ckpt = open_checkpoint(tiny_cosyvoice3)
    prompt = CosyVoice3PromptStage(StageContext("p", REPO), ckpt).prepare(
        TEXT, "", parse_cosyvoice3_params(REF)).prompt
    withheld = CosyVoice3HiftStage(StageContext("h", REPO), ckpt).hift.min_partial_frames
    hops = json.loads((REPO / "model_repository/cosyvoice3_talker/1/model.json").read_text())["hops"]
    chunker = TokenChunker(HopSchedule(**hops, lookahead=ckpt.config["flow"]["pre_lookahead_len"]),
                           prompt.speech_tokens.size)

    chunks, error = stream_model(stack.grpc_url, "cosyvoice3", " ".join([TEXT] * 2),
                                 params={**REF, "seed": 2})
    assert error is None and len(chunks) >= 3
    assert [int(c.as_numpy("chunk_index")[0, 0]) for c in chunks] == list(range(len(chunks)))
    assert [bool(c.as_numpy("is_final")[0, 0]) for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert all(int(c.as_numpy("sample_rate")[0, 0]) == 24000 for c in chunks)
    sizes = [c.as_numpy("audio").size for c in chunks]
    expected, voiced = [], 0
    for n in range(1, 10_000):
        chunk = chunker.poll(n)
        if chunk is not None:
            frames = 2 * chunker.emitted - withheld   # audio up to the hop boundary
            expected.append((frames - voiced) * 480)
            voiced = frames
        if len(expected) == len(sizes) - 1:
            break
    print("chunk sizes", sizes, "expected (all but the last)", expected)
    assert sizes[:-1] == expected and sizes[-1] > 0


def test_four_concurrent_requests_complete_and_stages_batch_across_requests(http, stack):
    """Batches > 1 among the executions these 4 requests caused (statistics diffed)."""
    client = grpcclient.InferenceServerClient(stack.grpc_url)

    def batch_sizes(model):
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
        return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}

    def grown(before, after):
        return {s: n - before.get(s, 0) for s, n in after.items() if n > before.get(s, 0)}

    before = {m: batch_sizes(m) for m in ("cosyvoice3_flow", "cosyvoice3_hift")}
    text = " ".join([TEXT] * 3)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: speak(http, input=text, seed=i, response_format="pcm"), range(4)))
    assert [r.status_code for r in results] == [200] * 4
    assert all(pcm16(r.content).size > 24000 for r in results)
    flow = grown(before["cosyvoice3_flow"], batch_sizes("cosyvoice3_flow"))
    hift = grown(before["cosyvoice3_hift"], batch_sizes("cosyvoice3_hift"))
    print("during this test: cosyvoice3_flow batch sizes:", flow, "cosyvoice3_hift:", hift)
    assert max(flow) > 1 or max(hift) > 1, (flow, hift)


@pytest.mark.parametrize("change,needle", [
    ({"ref_audio": None}, "ref_audio (base64 audio, 1-30 s) is required"),
    ({"ref_text": None}, "ref_text (the transcript of ref_audio) is required"),
    ({"ref_audio": "%%%"}, "not valid base64"),
    ({"ref_audio": base64.b64encode(b"not audio at all").decode()}, "could not be decoded"),
    ({"ref_audio": wav_b64(reference(0.3), 24000)}, "must be between 1 and 30 s"),
    ({"ref_audio": wav_b64(reference(31.0, 16000), 16000)}, "must be between 1 and 30 s"),
    ({"ref_audio": wav_b64(np.zeros(24000 * 2, np.float32), 24000)}, "silent"),
    ({"voice": "alloy"}, "clones the voice of ref_audio"),
])
def test_bad_voice_cloning_requests_get_400(http, change, needle):
    body = {"model": "cosyvoice3", "input": TEXT, **REF, **change}
    r = http.post("/v1/audio/speech", json={k: v for k, v in body.items() if v is not None})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert http.get("/health").status_code == 200


def test_launcher_names_a_missing_checkpoint_file(tmp_path):
    import subprocess
    import sys

    from tritontts.testing.stack import REPO

    run = lambda *args: subprocess.run([sys.executable, "-m", "frontend", "--families", "cosyvoice3", *args],  # noqa: E731
                                       cwd=REPO, capture_output=True, text=True, timeout=120)
    out = run()
    assert out.returncode == 2 and "needs --checkpoint cosyvoice3=PATH" in out.stderr
    out = run("--checkpoint", f"cosyvoice3={tmp_path}")
    assert out.returncode == 2 and f"{tmp_path}/cosyvoice3.yaml: missing" in out.stderr


def test_client_disconnect_stops_every_stage_within_seconds(http, stack):
    """The client gone after its first audio: the talker aborts its generation (the front's
    cancel model; Triton alone would only cancel the later steps, whose requests kept
    arriving, and failing, for as long as the talker ran), so within seconds no stage gets
    another request for it."""
    import time

    import httpx

    client = grpcclient.InferenceServerClient(stack.grpc_url)

    def requests():
        total = 0
        for model in ("cosyvoice3_flow", "cosyvoice3_hift"):
            stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
            total += sum(int(stats.get(kind, {}).get("count", 0)) for kind in ("success", "fail"))
        return total

    body = {"model": "cosyvoice3", "input": " ".join([TEXT] * 12), **REF, "seed": 9, "stream_format": "audio"}
    with httpx.Client(base_url=stack.url, timeout=120) as c:
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            next(r.iter_bytes())  # first audio, then hang up
    time.sleep(3)
    settled = requests()
    time.sleep(4)
    assert requests() == settled, "later stages still get this request's chunks"
    assert speak(http, seed=1).status_code == 200


def test_long_input_streams_segment_after_segment(stack):
    long_text = " ".join(["Hello there, how are you today?"] * 20)  # three talker segments
    chunks, error = stream_model(stack.grpc_url, "cosyvoice3", long_text, params={**REF, "seed": 4})
    assert error is None
    assert [int(c.as_numpy("chunk_index")[0, 0]) for c in chunks] == list(range(len(chunks)))
    finals = [bool(c.as_numpy("is_final")[0, 0]) for c in chunks]
    assert finals[-1] and not any(finals[:-1])
    seconds = sum(c.as_numpy("audio").size for c in chunks) / 24000
    assert len(chunks) >= 6 and seconds > 3


def test_sampling_overrides_reach_the_talkers_repetition_aware_sampling(http):
    """top_k 1 with a repetition rule that never fires (tau_r 2 over a window of 1) is greedy:
    the seed no longer matters. Control: with the checkpoint's sampling, two seeds differ."""
    greedy = {"top_k": 1, "win_size": 1, "tau_r": 2.0}
    a = speak(http, seed=1, response_format="pcm", extra_params=greedy)
    b = speak(http, seed=2, response_format="pcm", extra_params=greedy)
    assert a.status_code == b.status_code == 200, a.text
    assert a.content == b.content
    assert speak(http, seed=1, response_format="pcm").content != speak(http, seed=2, response_format="pcm").content
    bad = speak(http, temperature=0.5)
    assert bad.status_code == 400 and "temperature" in bad.json()["error"]["message"]


def test_standard_sampling_is_selectable_per_request_and_reaches_the_talker(http):
    """sampling_method standard (vLLM-Omni's GPU profile) samples with vLLM's own sampler:
    top_k 1 is greedy there too (the seed no longer matters); its default draws differ by
    seed and from RAS's; a RAS knob with it is a 400 naming the knob."""
    greedy = {"sampling_method": "standard", "top_k": 1}
    a = speak(http, seed=1, response_format="pcm", extra_params=greedy)
    b = speak(http, seed=2, response_format="pcm", extra_params=greedy)
    assert a.status_code == b.status_code == 200, a.text
    assert a.content == b.content
    standard = [speak(http, seed=s, response_format="pcm", extra_params={"sampling_method": "standard"}).content
                for s in (1, 2)]
    assert standard[0] != standard[1] and standard[0] != speak(http, seed=1, response_format="pcm").content
    bad = speak(http, extra_params={"sampling_method": "standard", "win_size": 3})
    assert bad.status_code == 400 and "win_size" in bad.json()["error"]["message"]
