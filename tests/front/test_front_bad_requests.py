"""The bad-request table (tritontts/testing/bad_requests.py) against the front on a scripted
Triton: every case gets its status and a message that says what to fix, and none of them
reaches Triton. (tests/server/test_speech_api_e2e.py runs the same table on the real server.)"""
from __future__ import annotations

import json

import pytest
from fake_triton import FakeTritonClient
from starlette.testclient import TestClient

from frontend.app import create_app
from frontend.media import MediaPolicy
from tritontts.testing.bad_requests import SERVED, TABLE, check_http, check_ws

CASES = [c for c in TABLE if not c.needs_triton]


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    fake = FakeTritonClient()
    app = create_app("fake:0", list(SERVED), client=fake, voices_dir=tmp_path_factory.mktemp("voices"),
                     media=MediaPolicy(allowed_local_media_path=tmp_path_factory.mktemp("media"),
                                       allowed_hosts=frozenset({"127.0.0.1"})))
    with TestClient(app, raise_server_exceptions=True) as client:
        yield client, fake


def test_the_table_holds_at_least_80_cases_across_every_endpoint():
    assert len(TABLE) >= 80
    assert {c.endpoint for c in TABLE} >= {"speech", "raw", "batch", "upload", "delete", "ws"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_request_gets_its_status_and_a_message_naming_the_fix(front, case):
    client, fake = front
    synthesized, encoded = len(fake.calls), len(fake.encoded)
    if case.endpoint == "ws":
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            check_ws(case, lambda m: ws.send_bytes(m) if isinstance(m, bytes) else ws.send_text(m),
                     lambda: json.loads(ws.receive_text()))
    else:
        check_http(case, client)
    assert (len(fake.calls), len(fake.encoded)) == (synthesized, encoded), "reached Triton"
    assert client.get("/health").status_code == 200
