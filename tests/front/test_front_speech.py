"""POST /v1/audio/speech, /v1/models and /health against a scripted Triton client."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import soundfile as sf
from fake_triton import FakeTritonClient, pcm16, run_async, serving, tone_chunks

from frontend.triton_client import StageFailed, StageRejected, TritonUnavailable
from tritontts.families import FAMILIES


def sse_events(body: bytes) -> list[dict]:
    """The data of each event, checked against its `event:` line (vLLM-Omni's framing)."""
    events = []
    for block in filter(None, body.split(b"\n\n")):
        event, data = block.split(b"\n")
        events.append(json.loads(data.removeprefix(b"data: ")))
        assert event.removeprefix(b"event: ").decode() == events[-1]["type"]
    return events


@run_async
async def test_wav_body_decodes_to_every_chunk_at_the_chunk_sample_rate():
    chunks = tone_chunks(3, 500)
    async with serving(FakeTritonClient(chunks, sample_rate=24000)) as front:
        r = await front.speech(response_format="wav")
    audio, rate = sf.read(io.BytesIO(r.content), dtype="float32")
    assert r.status_code == 200 and rate == 24000 and audio.shape == (1500,)
    np.testing.assert_allclose(audio, np.concatenate(chunks), atol=1e-4)


@run_async
async def test_raw_stream_sends_each_chunk_as_one_body_message_in_order():
    chunks = tone_chunks(3)
    async with serving(FakeTritonClient(chunks)) as front:
        exchange = front.exchange(response_format="pcm", stream_format="audio")
        assert await exchange.outcome() is None
    start, *bodies = exchange.drained()
    assert start["status"] == 200
    assert [m["body"] for m in bodies] == [pcm16(c) for c in chunks] + [b""]


@run_async
async def test_sse_sends_a_delta_per_chunk_then_done_with_audio_seconds():
    chunks = tone_chunks(3, 441)
    async with serving(FakeTritonClient(chunks, sample_rate=22050)) as front:
        r = await front.speech(response_format="pcm", stream_format="sse")
    events = sse_events(r.content)
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert [base64.b64decode(e["audio"]) for e in events[:3]] == [pcm16(c) for c in chunks]
    assert events[-1]["usage"]["audio_seconds"] == round(3 * 441 / 22050, 3)


@run_async
async def test_a_synthesis_with_no_audio_is_a_valid_empty_response_in_every_format_and_sse_says_so():
    """A talker that ends at its first frame streams one empty final chunk: every format's
    body still decodes (wav and flac a header, pcm nothing, mp3/aac/opus their smallest body,
    one frame of silence) and SSE's usage says 0 audio seconds."""
    import av

    empty = [np.zeros(0, np.float32)]
    async with serving(FakeTritonClient(empty, sample_rate=24000)) as front:
        for fmt in ("wav", "flac", "mp3", "aac", "opus", "pcm"):
            for stream_format in (None, "audio"):
                r = await front.speech(response_format=fmt, stream_format=stream_format)
                assert r.status_code == 200, (fmt, stream_format, r.text)
                if fmt == "pcm":
                    assert r.content == b""
                    continue
                with av.open(io.BytesIO(r.content)) as container:
                    samples = sum(f.samples for f in container.decode(audio=0))
                    rate = container.streams.audio[0].sample_rate
                assert samples == 0 if fmt in ("wav", "flac") else 0 < samples <= rate // 10, (fmt, samples)
        r = await front.speech(response_format="pcm", stream_format="sse")
    events = sse_events(r.content)
    assert [e["type"] for e in events] == ["speech.audio.done"]
    assert events[0]["usage"]["audio_seconds"] == 0


@run_async
async def test_stage_rejection_before_the_first_chunk_is_400_with_the_stage_message():
    fake = FakeTritonClient(errors={0: StageRejected("ref_audio could not be decoded")})
    async with serving(fake) as front:
        r = await front.speech(stream=True)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "ref_audio could not be decoded"


@run_async
async def test_triton_unavailable_is_503_with_retry_after():
    fake = FakeTritonClient(errors={0: TritonUnavailable("failed to connect")})
    async with serving(fake) as front:
        r = await front.speech()
    assert r.status_code == 503 and r.headers["retry-after"] == "5"


@run_async
async def test_stage_failure_mid_sse_stream_ends_with_vllm_omnis_error_event_marked_partial():
    fake = FakeTritonClient(tone_chunks(3), errors={1: StageFailed("vocoder exploded")})
    async with serving(fake) as front:
        r = await front.speech(response_format="pcm", stream_format="sse")
    events = sse_events(r.content)
    assert r.status_code == 200
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.error"]
    assert events[-1]["error"]["message"] == "vocoder exploded"
    assert events[-1]["error"]["partial_audio"] is True and events[-1]["error"]["action"] == "discard"


@run_async
async def test_unknown_model_is_404_on_param_model():
    async with serving(FakeTritonClient()) as front:
        r = await front.speech(model="no-such-model")
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


@run_async
async def test_empty_input_is_400_on_param_input_before_triton_is_asked():
    async with serving(FakeTritonClient()) as front:
        r = await front.speech(input="   ")
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert front.fake.calls == []


@run_async
async def test_unknown_family_parameter_is_400_naming_it_before_triton_is_asked():
    async with serving(FakeTritonClient()) as front:
        r = await front.speech(pitch_shift=3)
    assert r.status_code == 400 and "pitch_shift" in r.json()["error"]["message"]
    assert front.fake.calls == []


@run_async
async def test_speed_for_a_family_without_duration_control_is_a_time_stretch_by_the_front_at_the_same_pitch():
    """The stages are not asked for speed (they have no duration control): the front's
    encoder stretches the audio, whole or streamed, seamlessly across chunks; the duration
    follows 1/speed within 2 % and a 220 Hz tone stays at 220 Hz; SSE's usage counts the
    stretched seconds."""
    family = next(f for f in FAMILIES.values() if not f.capabilities.native_speed)
    rate = 24000
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(3 * rate) / rate)).astype(np.float32)
    async with serving(FakeTritonClient(np.array_split(tone, 7), sample_rate=rate), [family.name]) as front:
        for speed in (0.5, 1.5, 4.0):
            for stream_format in (None, "audio"):
                r = await front.speech(model=family.name, speed=speed, response_format="wav",
                                       stream_format=stream_format, **family.example_params())
                assert r.status_code == 200, r.text
                audio = pcm_from_wav(r.content)
                assert abs(audio.size * speed / tone.size - 1) < 0.02, (speed, audio.size)
                peak = np.argmax(np.abs(np.fft.rfft(audio))) * rate / audio.size
                assert abs(peak - 220) < 3, (speed, peak)
        r = await front.speech(model=family.name, speed=2.0, response_format="pcm", stream_format="sse",
                               **family.example_params())
        assert all("speed" not in call["params"] for call in front.fake.calls)
    assert abs(sse_events(r.content)[-1]["usage"]["audio_seconds"] - 1.5) < 0.03


def pcm_from_wav(body: bytes) -> np.ndarray:
    """A WAV body's samples (a streamed WAV's sizes are 0xFFFFFFFF: read past the header)."""
    return np.frombuffer(body[44:], "<i2").astype(np.float32) / 32767.0


@run_async
async def test_openai_alias_tts_1_is_served_by_the_first_served_family():
    families = list(reversed(FAMILIES))  # the first served is not the request's default model
    first = FAMILIES[families[0]]
    async with serving(FakeTritonClient(), families) as front:
        r = await front.speech(model="tts-1", **first.example_params())
    assert r.status_code == 200 and front.fake.calls[0]["model"] == first.name


@run_async
async def test_instructions_are_400_naming_the_field_for_a_family_without_style_control():
    family = next(f for f in FAMILIES.values() if not f.capabilities.instructions)
    async with serving(FakeTritonClient(), [family.name]) as front:
        r = await front.speech(model=family.name, instructions="whisper",
                               **family.example_params())
    assert r.status_code == 400 and r.json()["error"]["param"] == "instructions"
    assert "instructions is not supported by" in r.json()["error"]["message"]
    assert front.fake.calls == []


@run_async
async def test_health_is_503_listing_the_ready_models_when_a_family_is_not_ready():
    families = list(FAMILIES)
    async with serving(FakeTritonClient(ready={families[0]}), families) as front:
        r = await front.http.get("/health")
    assert r.status_code == 503
    assert r.json()["ready_models"] == [families[0]]


@run_async
async def test_models_lists_only_the_ready_families_as_openai_model_cards():
    families = list(FAMILIES)
    async with serving(FakeTritonClient(ready={families[-1]}), families) as front:
        r = await front.http.get("/v1/models")
    assert r.json() == {"object": "list", "data": [
        {"id": families[-1], "object": "model", "owned_by": "tritontts", "created": 0}]}


@run_async
async def test_empty_input_reaches_an_instruction_only_family_only_with_instructions():
    family = next(f for f in FAMILIES.values() if f.capabilities.instruction_only)
    async with serving(FakeTritonClient(), [family.name]) as front:
        r = await front.speech(model=family.name, input="", instructions="Rain on a tin roof.")
        assert r.status_code == 200 and front.fake.calls[0]["text"] == ""
        r = await front.speech(model=family.name, input="")
        assert r.status_code == 400 and r.json()["error"]["param"] == "input"


@run_async
async def test_empty_input_with_instructions_is_400_for_a_speech_family():
    family = next(f for f in FAMILIES.values() if f.capabilities.instructions and not f.capabilities.instruction_only)
    async with serving(FakeTritonClient(), [family.name]) as front:
        r = await front.speech(model=family.name, input="", instructions="A calm voice.")
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert front.fake.calls == []


@run_async
async def test_instructions_longer_than_the_family_takes_are_400_naming_its_limit():
    family = next(f for f in FAMILIES.values()
                  if f.capabilities.instructions and f.capabilities.max_instructions_chars == 500)
    async with serving(FakeTritonClient(), [family.name]) as front:
        r = await front.speech(model=family.name, instructions="x" * 501, **family.example_params())
    assert r.status_code == 400 and r.json()["error"]["param"] == "instructions"
    assert "at most 500" in r.json()["error"]["message"]


@run_async
async def test_a_model_answers_to_its_served_model_names_and_its_checkpoint_path_as_vllm_does(tmp_path, monkeypatch):
    """vLLM serves a model under the path it was started with (`vllm serve ckpts/my-model`:
    `model: "ckpts/my-model"`) or its --served-model-name: both reach the model here, the
    path as given, relative to the working directory or absolute; the names are listed in
    /v1/models; a bare name is never taken for a folder."""
    folder = tmp_path / "ckpts" / "piper-voice"
    folder.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    async with serving(FakeTritonClient(), ["piper"], checkpoints={"piper": Path("ckpts/piper-voice")},
                       served_names={"my-voice": "piper"}) as front:
        for model in ("my-voice", "ckpts/piper-voice", "./ckpts/piper-voice/", str(folder)):
            r = await front.speech(model=model)
            assert r.status_code == 200, (model, r.text)
        assert [c["model"] for c in front.fake.calls] == ["piper"] * 4
        assert (await front.speech(model="piper-voice")).status_code == 404
        assert (await front.speech(model="ckpts/other")).status_code == 404
        listed = [m["id"] for m in (await front.http.get("/v1/models")).json()["data"]]
    assert listed == ["piper", "my-voice"]


def test_word_timestamps_past_4_kib_leave_the_header_saying_so():
    """vLLM-Omni's header limit: a long text's timings are not sent in the header (the SSE
    stream and the batch endpoint carry any number)."""
    import json

    from frontend.serving import word_timestamp_headers

    words = [{"word": f"word{i}", "start_ms": 10 * i, "end_ms": 10 * i + 5} for i in range(200)]
    small = word_timestamp_headers(words[:3])
    assert json.loads(small["X-Word-Timestamps"]) == words[:3]
    big = word_timestamp_headers(words)
    assert "X-Word-Timestamps" not in big
    assert big["X-Word-Timestamps-Omitted"] == f"oversize; bytes={len(json.dumps(words))}; limit=4096"
