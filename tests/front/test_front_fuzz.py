"""Fuzzing the front (hypothesis): bodies built from the field names of its own OpenAPI
schema with values of any JSON type, raw bytes, random multipart uploads and voice names.
Whatever arrives, the answer is never a 500, every error has OpenAI's shape, and the
server stays healthy. (The scripted Triton serves the requests that are valid.)"""
from __future__ import annotations

import json

import pytest
from fake_triton import FakeTritonClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from frontend.app import create_app

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    app = create_app("fake:0", ["piper", "cosyvoice3"], client=FakeTritonClient(),
                     voices_dir=tmp_path_factory.mktemp("voices"))
    with TestClient(app, raise_server_exceptions=False) as client:
        schema = client.get("/openapi.json").json()["components"]["schemas"]
        yield client, schema


def fields_of(schema: dict, name: str) -> list[str]:
    return sorted(schema[name]["properties"])


def bodies(names: list[str]):
    """Objects whose keys are mostly the schema's fields (some random), any JSON values."""
    keys = st.sampled_from(names) | st.text(min_size=1, max_size=12)
    return st.dictionaries(keys, JSON, max_size=8)


def assert_sane(r) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"]


def post_json(client, path: str, body: dict):
    """Sent as text: hypothesis's NaN and Inf stay in the body (json= would refuse them)."""
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


@FUZZ
@given(data=st.data())
def test_speech_bodies_never_give_a_500(front, data):
    client, schema = front
    body = data.draw(bodies(fields_of(schema, "SpeechRequest")))
    if data.draw(st.booleans()):
        body["input"] = data.draw(st.text(max_size=60))
    assert_sane(post_json(client, "/v1/audio/speech", body))


@FUZZ
@given(data=st.data())
def test_batch_bodies_never_give_a_500(front, data):
    client, schema = front
    body = data.draw(bodies(fields_of(schema, "BatchSpeechRequest")))
    if data.draw(st.booleans()):
        body["items"] = data.draw(st.lists(bodies(fields_of(schema, "SpeechRequest")) | JSON, max_size=4))
    assert_sane(post_json(client, "/v1/audio/speech/batch", body))


@FUZZ
@given(raw=st.binary(max_size=300), ctype=st.sampled_from(["application/json", "text/plain",
                                                            "multipart/form-data", ""]))
def test_raw_bytes_never_give_a_500(front, raw, ctype):
    client, _ = front
    for path in ("/v1/audio/speech", "/v1/audio/speech/batch", "/v1/audio/voices"):
        assert_sane(client.post(path, content=raw, headers={"content-type": ctype} if ctype else {}))


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(["name", "consent", "ref_text", "speaker_embedding",
                                               "speaker_description", "model", "x"]),
                              st.text(max_size=30), max_size=6),
       audio=st.none() | st.binary(max_size=200),
       ctype=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=20))
def test_voice_uploads_never_give_a_500(front, fields, audio, ctype):
    client, _ = front
    files = {"audio_sample": ("f.wav", audio, ctype or "audio/wav")} if audio is not None else None
    assert_sane(client.post("/v1/audio/voices", data=fields, files=files))


@FUZZ
@given(name=st.text(min_size=1, max_size=40))
def test_voice_names_in_the_path_never_give_a_500(front, name):
    client, _ = front
    from urllib.parse import quote

    assert_sane(client.delete("/v1/audio/voices/" + quote(name, safe="")))


def test_the_server_is_healthy_after_the_fuzzing(front):
    client, _ = front
    assert client.get("/health").status_code == 200
    assert client.post("/v1/audio/speech", json={"model": "piper", "input": "Still here."}).status_code == 200
