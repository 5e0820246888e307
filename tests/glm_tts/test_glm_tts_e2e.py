"""GLM-TTS through the real tritonserver and front on a tiny random checkpoint: a seeded
two-segment stream equals the same four stages run in this process (its own vLLM engine,
flow and vocoder), chunk by chunk, so the served plumbing (per-stream state in the flow and
vocoder, chunk order, the talker's segment history) changes nothing; concurrent streams
keep their own state; an uploaded voice speaks as its ref_audio does; the 400s of what the
model cannot do. The stages themselves are checked against the references in
test_glm_tts_flow / _vocoder / _speech_tokenizer / _talker / _streaming."""
from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tritontts.family import synthetic_reference
from tritontts.testing.audio import pcm16, rms
from tritontts.testing.grpc import stream_model

STACK_FAMILIES = ("glm_tts",)
# Two sentences over 60 characters: two segments, the second prompted with the first.
TEXT = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
REF = synthetic_reference()


def speak(http, **body):
    return http.post("/v1/audio/speech", json={"model": "glm_tts", "input": TEXT, "seed": 3,
                                               "response_format": "pcm", **REF, **body})


class InProcessStages:
    """The four stages in this process, built once for the module (its own vLLM engine is
    the expensive part); `chunks` hands each chunk on as the ensemble does."""

    def __init__(self, checkpoint_dir: Path):
        from tritontts.families.glm_tts.checkpoint import open_checkpoint
        from tritontts.families.glm_tts.stages import (
            GLMTTSFlowStage, GLMTTSPromptStage, GLMTTSTalkerStage, GLMTTSVocoderStage)
        from tritontts.serving.stage import StageContext

        ckpt = open_checkpoint(checkpoint_dir)
        context = lambda name: StageContext(name=name, model_dir=Path("model_repository") / name)  # noqa: E731
        self.prompt = GLMTTSPromptStage(context("glm_tts_prompt"), ckpt)
        self.talker = GLMTTSTalkerStage(context("glm_tts_talker"), ckpt)
        self.flow = GLMTTSFlowStage(context("glm_tts_flow"), ckpt)
        self.vocoder = GLMTTSVocoderStage(context("glm_tts_vocoder"), ckpt)

    def talk(self, text: str, params: dict):
        """The talker's chunks for this request, and the prompt stage's outputs it was given."""
        from tritontts.serving.stage import Inputs

        prompt = self.prompt.run(Inputs(text=np.array([text.encode()]), voice=np.array([b""]),
                                        params=np.array([json.dumps(params).encode()])))
        given = Inputs({k: np.atleast_1d(np.asarray(v)) for k, v in prompt.items()})
        given["prompt_mel"] = np.asarray(prompt["prompt_mel"])

        async def talk():
            return [chunk async for chunk in self.talker.run(given)]
        return self.talker.submit(talk()).result(), given

    def chunks(self, text: str, params: dict) -> list[np.ndarray]:
        from tritontts.serving.stage import Inputs

        talked, given = self.talk(text, params)
        audio = []
        for chunk in talked:
            step = Inputs({k: np.atleast_1d(np.asarray(v)) for k, v in chunk.items()})
            for name in ("prompt_tokens", "prompt_mel", "embedding", "seed", "stream_id"):
                step[name] = given[name]
            mel = self.flow.run(step)
            audio.append(self.vocoder.run(Inputs(mel=mel["mel"], frames=np.array([mel["frames"]]),
                                                 **{k: step[k] for k in ("chunk_in_segment", "look_ahead",
                                                                         "segment_end", "stream_id")}))["audio"])
        return audio

    def close(self) -> None:
        self.talker.close()


@pytest.fixture(scope="module")
def in_process(random_checkpoints):
    stages = InProcessStages(random_checkpoints["glm_tts"])
    yield stages
    stages.close()


def test_a_seeded_stream_equals_the_stages_run_in_process_chunk_by_chunk(stack, in_process):
    params = {"seed": 11, **REF}
    chunks, error = stream_model(stack.grpc_url, "glm_tts", TEXT, params=params, timeout=300)
    assert error is None, error
    want = in_process.chunks(TEXT, params)
    got = [c.as_numpy("audio").reshape(-1) for c in chunks]
    assert {int(c.as_numpy("sample_rate").reshape(-1)[0]) for c in chunks} == {24000}
    print(f"served chunks (samples): {[g.size for g in got]}")
    # Chunks of zero samples (a look-ahead longer than what the chunk added) do not carry
    # audio, so the served list skips them.
    want = [w for w in want if w.size]
    assert [g.size for g in got] == [w.size for w in want]
    # The first chunk: 25 tokens, of which 12 are look-ahead, less the 0.1 s fade tail.
    assert got[0].size == (25 - 12) * 960 - 2400
    whole_got, whole_want = np.concatenate(got), np.concatenate(want)
    peak = float(np.abs(whole_want).max())
    diff = float(np.abs(whole_got - whole_want).max())
    print(f"served vs in-process: max-abs-diff {diff:.2e} (peak {peak:.3f}), {whole_got.size / 24000:.2f} s")
    assert rms(whole_got) > 1e-3 and diff <= 1e-4 * max(peak, 1e-6)


def test_non_streaming_mode_is_the_whole_utterance_synthesis_per_segment(stack, http, in_process):
    """non_streaming_mode true (vLLM-Omni's --no-async-chunk): each segment's tokens all at
    once, one full-attention flow run (its mel equals vLLM-Omni's sampler with full attention:
    test_glm_tts_flow.py::test_whole_utterance_mel_matches_vllm_omni_sampler) and one vocoder
    pass. Served, it is one chunk per segment equal to the stages run in process; control:
    the streamed synthesis of the same tokens is not the same audio (block-causal, by design)."""
    params = {"seed": 11, **REF, "non_streaming_mode": True}
    chunks, error = stream_model(stack.grpc_url, "glm_tts", TEXT, params=params, timeout=300)
    assert error is None, error
    got = [c.as_numpy("audio").reshape(-1) for c in chunks]
    want = [w for w in in_process.chunks(TEXT, params) if w.size]
    assert len(got) == 2 and [g.size for g in got] == [w.size for w in want]     # two segments
    whole_got, whole_want = np.concatenate(got), np.concatenate(want)
    diff = float(np.abs(whole_got - whole_want).max())
    peak = float(np.abs(whole_want).max())
    streamed, _ = stream_model(stack.grpc_url, "glm_tts", TEXT, params={"seed": 11, **REF}, timeout=300)
    streamed = np.concatenate([c.as_numpy("audio").reshape(-1) for c in streamed])
    n = min(streamed.size, whole_got.size)
    relative = float(np.sqrt(np.mean((streamed[:n] - whole_got[:n]) ** 2)) / max(rms(whole_got[:n]), 1e-9))
    print(f"whole vs in-process: max-abs-diff {diff:.2e} (peak {peak:.3f}); whole vs streamed: relative RMS "
          f"{relative:.2f}, {whole_got.size} vs {streamed.size} samples")
    assert rms(whole_got) > 1e-3 and diff <= 1e-4 * max(peak, 1e-6)
    assert relative > 0.05
    bad = speak(http, non_streaming_mode="yes")
    assert bad.status_code == 400 and "non_streaming_mode" in bad.json()["error"]["message"]


def test_max_new_tokens_counts_across_segments_and_the_last_chunk_it_allows_is_final(in_process):
    """max_new_tokens is the request's: a budget past the first segment's tokens leaves the
    rest to the second, whose tokens are the uncapped run's first ones; a budget the first
    segment spends ends the stream there, final, without a second segment."""
    params = {**REF, "seed": 3}

    def segments(**extra):
        talked, _ = in_process.talk(TEXT, {**params, **extra})
        assert [bool(c["is_final"]) for c in talked] == [False] * (len(talked) - 1) + [True]
        ends = [c for c in talked if c["segment_end"]]
        return [list(c["speech_tokens"]) for c in ends]

    uncapped = segments()
    assert len(uncapped) == 2 and len(uncapped[1]) > 5, [len(s) for s in uncapped]
    first = len(uncapped[0])
    assert segments(max_new_tokens=first + 5) == [uncapped[0], uncapped[1][:5]]
    assert segments(max_new_tokens=first) == [uncapped[0]]
    assert segments(max_new_tokens=first - 1) == [uncapped[0][:first - 1]]


def test_concurrent_streams_keep_their_own_flow_and_vocoder_state(http):
    alone = {seed: speak(http, seed=seed).content for seed in (21, 22, 23)}
    with ThreadPoolExecutor(3) as pool:
        together = dict(zip((21, 22, 23), pool.map(lambda s: speak(http, seed=s), (21, 22, 23))))
    assert all(r.status_code == 200 for r in together.values())
    assert len(set(alone.values())) == 3
    for seed, response in together.items():
        assert response.content == alone[seed], f"seed {seed} changed when run beside others"


def test_an_uploaded_voice_speaks_as_its_reference_does(http):
    direct = speak(http)
    assert direct.status_code == 200, direct.text
    assert rms(pcm16(direct.content)) > 1e-3
    r = http.post("/v1/audio/voices", data={"name": "Reader", "consent": "test", "ref_text": REF["ref_text"]},
                  files={"audio_sample": ("ref.wav", base64.b64decode(REF["ref_audio"]), "audio/wav")})
    assert r.status_code == 200, r.text
    try:
        by_name = http.post("/v1/audio/speech", json={"model": "glm_tts", "input": TEXT, "seed": 3,
                                                      "response_format": "pcm", "voice": "reader"})
        assert by_name.status_code == 200, by_name.text
        assert by_name.content == direct.content
    finally:
        http.delete("/v1/audio/voices/Reader")


def _reference_of(seconds: float) -> str:
    import io

    import soundfile as sf

    t = np.arange(int(seconds * 24000)) / 24000
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 24000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("fields,needle", [
    ({"instructions": "whisper"}, "no style instructions"),
    ({"task_type": "VoiceDesign"}, "omit task_type"),
    ({"language": "French"}, "omit language"),
    ({"voice": "alice"}, "clones the voice of ref_audio"),
    ({"ref_audio": None, "ref_text": None}, "send ref_audio"),
    ({"ref_text": None}, "needs ref_text"),
    ({"ref_audio": _reference_of(2.0)}, "between 3 and 10 s"),
    ({"ref_audio": _reference_of(11.0)}, "between 3 and 10 s"),
    ({"top_k": -1}, "top_k"),
    ({"win_size": 0}, "win_size"),
])
def test_what_the_model_cannot_do_is_a_400_that_says_so(http, fields, needle):
    import re

    body = {"model": "glm_tts", "input": TEXT, **REF, **fields}
    r = http.post("/v1/audio/speech", json={k: v for k, v in body.items() if v is not None})
    assert r.status_code == 400, r.text
    assert re.search(needle, r.json()["error"]["message"]), r.text
    assert http.get("/health").status_code == 200


def test_sampling_overrides_change_the_speech_and_are_deterministic(http):
    base, greedier = speak(http, seed=5), speak(http, seed=5, top_k=1)
    assert base.status_code == greedier.status_code == 200, greedier.text
    assert greedier.content != base.content and greedier.content == speak(http, seed=5, top_k=1).content

