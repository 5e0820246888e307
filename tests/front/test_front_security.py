"""API key, and no internals in error responses."""
from __future__ import annotations

import pytest
from fake_triton import FakeTritonClient
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from frontend.app import create_app
from tritontts.testing.bad_requests import wav

KEY = "s3cret-key"


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app("fake:0", ["piper"], client=FakeTritonClient(), voices_dir=tmp_path,
                               api_key=KEY)) as c:
        yield c


@pytest.mark.parametrize("method,path", [("post", "/v1/audio/speech"), ("get", "/v1/models"),
                                         ("get", "/v1/audio/voices"), ("get", "/metrics"),
                                         ("post", "/v1/audio/speech/batch"),
                                         ("delete", "/v1/audio/voices/x")])
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic czNjcmV0LWtleQ==", f"Bearer {KEY}x"])
def test_every_route_but_health_needs_the_key(client, method, path, header):
    r = client.request(method, path, headers={"Authorization": header} if header else {},
                       json={"input": "Hi."} if method == "post" else None)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["type"] == "authentication_error"


def test_the_right_key_is_served_and_health_needs_none(client):
    r = client.post("/v1/audio/speech", json={"input": "Hi."}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    assert client.get("/health").status_code == 200


def test_websocket_needs_the_key_as_header_or_query(client):
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.receive_text()
    assert refused.value.code == 1008
    for kwargs in ({"headers": {"Authorization": f"Bearer {KEY}"}}, {}):
        path = "/v1/audio/speech/stream" + ("" if kwargs else f"?api_key={KEY}")
        with client.websocket_connect(path, **kwargs) as ws:
            ws.send_json({"type": "session.config"})
            assert ws.receive_json()["type"] == "session.configured"


def test_an_unexpected_failure_is_a_500_without_internals(tmp_path):
    fake = FakeTritonClient(errors={0: ZeroDivisionError("division by zero in /secret/path.py")})
    with TestClient(create_app("fake:0", ["piper"], client=fake, voices_dir=tmp_path),
                    raise_server_exceptions=False) as c:
        r = c.post("/v1/audio/speech", json={"input": "Hi."})
        listing = c.get("/v1/audio/voices")
    assert r.status_code == 500 and "Traceback" not in r.text and r.json()["error"]["type"] == "server_error"
    assert listing.status_code == 200


def test_an_exception_in_a_handler_is_a_json_500_with_an_incident_not_a_trace(tmp_path):
    with TestClient(create_app("fake:0", ["piper", "cosyvoice3"], client=FakeTritonClient(),
                               voices_dir=tmp_path / "voices"), raise_server_exceptions=False) as c:
        # After the start (which refuses such a folder): the upload fails unexpectedly.
        (tmp_path / "voices").write_text("a file where the voices folder should be")
        r = c.post("/v1/audio/voices", data={"name": "a", "consent": "c", "ref_text": "Hi."},
                   files={"audio_sample": ("a.wav", wav(2.0), "audio/wav")})
        assert r.status_code == 500 and "incident" in r.json()["error"]["message"]
        assert "Traceback" not in r.text and "voices" not in r.json()["error"]["message"]
        assert c.get("/health").status_code == 200
