"""The bad-request table: requests a client can get wrong, across REST, batch, voice uploads
and the WebSocket, each with the status (or WebSocket error status) it must get and words
its message must contain. One table, run against the front on a scripted Triton (unit) and
against the real server (end to end), which must stay healthy after every one.

The server serves piper and cosyvoice3 with file:// references allowed under some folder
(not /etc) and 127.0.0.1 allowed as a media host (`--allowed-local-media-path`,
`--allow-media-host`), as the end-to-end test starts it.
"""
from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

SERVED = ("piper", "cosyvoice3")


def wav(seconds: float, rate: int = 24000, silent: bool = False) -> bytes:
    import soundfile as sf

    t = np.arange(int(rate * seconds)) / rate
    audio = np.zeros_like(t) if silent else 0.3 * np.sin(2 * np.pi * 150 * t) * (1 + np.sin(2 * np.pi * 2 * t))
    buf = io.BytesIO()
    sf.write(buf, audio.astype(np.float32), rate, format="WAV")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass(frozen=True)
class Bad:
    id: str
    endpoint: str           # speech | batch | upload | delete | raw | ws
    request: Any            # JSON body; upload: {"data": ..., "files": ...}; raw: (content type,
                            # bytes); delete: the name; ws: the messages (str, or bytes frames)
    status: int
    says: str               # words the error message must contain (case-insensitive)
    param: str | None = None
    needs_triton: bool = False   # the stages decide it (the scripted Triton cannot)


def _speech(id, status, says, param=None, needs_triton=False, **body):
    return Bad(id, "speech", {"input": "Hello there.", **body}, status, says, param, needs_triton)


def _clone(**body):
    return {"model": "cosyvoice3", "ref_text": "The reference voice.", **body}


REF = b64(wav(2.0))

SPEECH = [
    Bad("malformed json", "raw", ("application/json", b'{"input": "hi",'), 400, "json"),
    Bad("body is a list", "raw", ("application/json", b'["hi"]'), 400, "must be a json object"),
    Bad("body is not json", "raw", ("text/plain", b"say hi"), 400, "must be a json object"),
    Bad("missing input", "speech", {"model": "piper"}, 400, "field required", "input"),
    _speech("input is a number", 400, "valid string", "input", input=5, model="piper"),
    _speech("input is empty", 400, "input is empty", "input", input="", model="piper"),
    _speech("input is whitespace", 400, "input is empty", "input", input="  \n ", model="piper"),
    _speech("input too long", 400, "limit is 4096", "input", input="a" * 5000, model="piper"),
    _speech("input has only emoji", 400, "nothing to speak", "input", input="\U0001F642\U0001F680", model="piper"),
    _speech("input has only invisible characters", 400, "nothing to speak", "input", input="\u200b\u2060",
            model="piper"),
    _speech("no model with two served", 400, "model is required", "model"),
    _speech("unknown model", 404, "does not exist", "model", model="tts-9000"),
    _speech("model is a number", 400, "valid string", "model", model=1),
    _speech("voice is a number", 400, "valid string", "voice", model="piper", voice=3),
    _speech("voice object without id", 400, "voice object", "voice", model="piper", voice={"name": "joe"}),
    _speech("unknown piper voice", 400, "valid voices: default, joe", None, needs_triton=True,
            model="piper", voice="nobody"),
    _speech("unknown response_format", 400, "response_format", "response_format", model="piper",
            response_format="ogg"),
    _speech("speed is text", 400, "valid number", "speed", model="piper", speed="fast"),
    _speech("speed too low", 400, "greater than or equal to 0.25", "speed", model="piper", speed=0.1),
    _speech("speed too high", 400, "less than or equal to 4", "speed", model="piper", speed=10),
    _speech("stream is text", 400, "valid boolean", "stream", model="piper", stream="yes"),
    _speech("unknown stream_format", 400, "stream_format", "stream_format", model="piper",
            stream_format="chunks"),
    _speech("sample_rate too low", 400, "greater than or equal to 8000", "sample_rate", model="piper",
            sample_rate=100),
    _speech("sample_rate too high", 400, "less than or equal to 96000", "sample_rate", model="piper",
            sample_rate=1_000_000),
    _speech("sample_rate is text", 400, "valid integer", "sample_rate", model="piper", sample_rate="22050"),
    _speech("instructions too long", 400, "at most 500", "instructions", model="piper",
            instructions="x" * 501),
    _speech("instructions for piper", 400, "instructions is not supported by piper", "instructions",
            model="piper", instructions="Whisper it."),
    _speech("language for piper", 400, "language is not supported by piper", "language",
            model="piper", language="English"),
    _speech("unknown task_type", 400, "task_type", "task_type", model="piper", task_type="Clone"),
    _speech("task_type for cosyvoice3", 400, "task_type is not supported by cosyvoice3", "task_type",
            task_type="Base", ref_audio=REF, **_clone()),
    _speech("ref_audio for piper", 400, "ref_audio is not supported by piper", "ref_audio",
            model="piper", ref_audio=REF),
    _speech("negative seed", 400, "greater than or equal to 0", "seed", model="piper", seed=-1),
    _speech("seed is text", 400, "valid integer", "seed", model="piper", seed="42"),
    _speech("seed too large", 400, "less than", "seed", model="piper", seed=2**64),
    _speech("max_new_tokens zero", 400, "greater than or equal to 1", "max_new_tokens", model="piper",
            max_new_tokens=0),
    _speech("max_new_tokens for piper", 400, "max_new_tokens is not supported by piper",
            "max_new_tokens", model="piper", max_new_tokens=100),
    _speech("speaker_embedding empty", 400, "at least 1", "speaker_embedding", model="piper",
            speaker_embedding=[]),
    _speech("speaker_embedding of text", 400, "valid number", "speaker_embedding", model="piper",
            speaker_embedding=["a"]),
    _speech("speaker_embedding for cosyvoice3", 400, "speaker_embedding is not supported by cosyvoice3",
            "speaker_embedding", speaker_embedding=[0.1, 0.2], model="cosyvoice3"),
    _speech("x_vector_only_mode is text", 400, "valid boolean", "x_vector_only_mode", model="piper",
            x_vector_only_mode="true"),
    _speech("initial_codec_chunk_frames zero", 400, "greater than or equal to 1",
            "initial_codec_chunk_frames", model="piper", initial_codec_chunk_frames=0),
    _speech("extra_params not an object", 400, "valid dictionary", "extra_params", model="piper",
            extra_params=[1]),
    _speech("extra_params repeats a field", 400, "repeats a request field", "extra_params",
            model="piper", seed=1, extra_params={"seed": 2}),
    _speech("extra_params unknown to piper", 400, "unknown parameter(s) ['temperature'] for piper",
            None, model="piper", extra_params={"temperature": 0.5}),
    _speech("noise_scale out of range", 400, "noise_scale must be between", None, model="piper",
            noise_scale=5),
    _speech("unknown field", 400, "unknown parameter(s) ['colour'] for piper", None, model="piper",
            colour="blue"),
    _speech("word_timestamps without a word aligner", 400, "start the server with --word-aligner",
            "word_timestamps", model="piper", word_timestamps=True),
    _speech("voice_features from a client", 400, "name the voice in `voice`", "voice_features",
            model="cosyvoice3", voice_features="AAAA"),
    _speech("cosyvoice3 without ref_audio", 400, "ref_audio", None, model="cosyvoice3"),
    _speech("cosyvoice3 without ref_text", 400, "ref_text", None, model="cosyvoice3", ref_audio=REF),
    _speech("ref_audio bad base64", 400, "base64", "ref_audio", ref_audio="not base64!!", **_clone()),
    _speech("ref_audio metadata address", 400, "link-local", "ref_audio",
            ref_audio="http://169.254.169.254/latest/meta-data/", **_clone()),
    _speech("ref_audio loopback", 400, "loopback", "ref_audio", ref_audio="http://[::1]:1/a.wav",
            **_clone()),
    _speech("ref_audio private network", 400, "private", "ref_audio", ref_audio="http://10.1.2.3/a.wav",
            **_clone()),
    _speech("ref_audio file url outside the allowed folder", 400, "/etc/passwd is outside", "ref_audio",
            ref_audio="file:///etc/passwd", **_clone()),
    _speech("ref_audio ftp", 400, "ftp", "ref_audio", ref_audio="ftp://example.com/a.wav", **_clone()),
    _speech("ref_audio data url of text", 400, "text/plain", "ref_audio",
            ref_audio="data:text/plain;base64,aGVsbG8=", **_clone()),
    _speech("ref_audio with userinfo", 400, "user", "ref_audio",
            ref_audio="http://user:pw@example.com/a.wav", **_clone()),
    _speech("two references", 400, "references must be a list of one", None,
            model="cosyvoice3", references=[{"audio_path": REF}, {"audio_path": REF}]),
    _speech("ref_audio not audio", 400, "could not be decoded", None, needs_triton=True,
            ref_audio=b64(b"this is not audio at all, just text" * 10), **_clone()),
    _speech("ref_audio too short", 400, "between 1 and 30", None, needs_triton=True,
            ref_audio=b64(wav(0.5)), **_clone()),
    _speech("ref_audio silent", 400, "silent", None, needs_triton=True,
            ref_audio=b64(wav(2.0, silent=True)), **_clone()),
]

BATCH = [
    Bad("batch without items", "batch", {"model": "piper"}, 400, "field required", "items"),
    Bad("batch of no items", "batch", {"model": "piper", "items": []}, 400, "at least 1", "items"),
    Bad("batch of 33 items", "batch", {"model": "piper", "items": [{"input": "Hi."}] * 33}, 400,
        "at most 32", "items"),
    Bad("batch items not a list", "batch", {"model": "piper", "items": {"input": "Hi."}}, 400,
        "valid list", "items"),
    Bad("batch item not an object", "batch", {"model": "piper", "items": ["Hi."]}, 400,
        "valid dictionary", "items"),
    Bad("batch default of wrong type", "batch", {"model": "piper", "speed": "x",
                                                 "items": [{"input": "Hi."}]}, 400, "valid number", "speed"),
]


def _upload(id, status, says, param=None, files="wav", needs_triton=False, **data):
    fields = {"name": "bad-voice", "consent": "consent-123", **data}
    fields = {k: v for k, v in fields.items() if v is not None}
    if files == "wav":
        files = {"audio_sample": ("ref.wav", wav(2.0), "audio/wav")}
    return Bad(id, "upload", {"data": fields, "files": files or None}, status, says, param, needs_triton)


UPLOADS = [
    _upload("upload without name", 400, "field required", "name", name=None),
    _upload("upload without consent", 400, "field required", "consent", consent=None),
    _upload("upload empty consent", 400, "consent is required", "consent", consent="  "),
    _upload("upload name with slash", 400, "may hold letters", "name", name="a/b"),
    _upload("upload name with backslash", 400, "may hold letters", "name", name="a\\b"),
    _upload("upload name dotdot", 400, "may hold letters", "name", name=".."),
    _upload("upload name traversal", 400, "may hold letters", "name", name="../../etc/passwd"),
    _upload("upload hidden name", 400, "may hold letters", "name", name=".hidden"),
    _upload("upload name with nul", 400, "may hold letters", "name", name="a\x00b"),
    _upload("upload name too long", 400, "limit is 64", "name", name="v" * 65),
    _upload("upload name is a built-in voice", 409, "built-in voice of piper", "name", name="JOE"),
    _upload("upload name default", 409, "built-in voice", "name", name="default"),
    _upload("upload audio and embedding", 400, "one of the two", "audio_sample",
            speaker_embedding="[0.1, 0.2]"),
    _upload("upload neither audio nor embedding", 400, "one of the two", "audio_sample", files={}),
    _upload("upload text file", 400, "send one of", "audio_sample",
            files={"audio_sample": ("notes.txt", b"hello", "text/plain")}),
    _upload("upload undecodable audio", 400, "could not be decoded", "audio_sample",
            files={"audio_sample": ("ref.wav", b"RIFF garbage" * 100, "audio/wav")}),
    _upload("upload too short", 400, "between 1 and 30", "audio_sample",
            files={"audio_sample": ("ref.wav", wav(0.5), "audio/wav")}),
    _upload("upload too long", 400, "between 1 and 30", "audio_sample",
            files={"audio_sample": ("ref.wav", wav(31, rate=8000), "audio/wav")}),
    _upload("upload silent", 400, "silent", "audio_sample",
            files={"audio_sample": ("ref.wav", wav(2.0, silent=True), "audio/wav")}),
    _upload("upload over 10 MB", 413, "limit", None,
            files={"audio_sample": ("ref.wav", b"\0" * (12 * 1024 * 1024), "audio/wav")}),
    _upload("upload embedding not json", 400, "json list", "speaker_embedding", files={},
            speaker_embedding="0.1, 0.2"),
    _upload("upload embedding empty", 400, "1 to 8192", "speaker_embedding", files={},
            speaker_embedding="[]"),
    _upload("upload embedding of text", 400, "1 to 8192", "speaker_embedding", files={},
            speaker_embedding='["a"]'),
    _upload("upload embedding with nan", 400, "finite", "speaker_embedding", files={},
            speaker_embedding="[0.1, NaN]"),
    _upload("upload for a model that does not clone", 400, "piper does not clone", "model", model="piper"),
    _upload("upload for an unknown model", 404, "does not exist", "model", model="nope"),
    _upload("upload ref_text with control characters", 400, "control characters", "ref_text",
            ref_text="hello\x07"),
    _upload("upload consent too long", 400, "limit is 256", "consent", consent="c" * 300),
    _upload("upload embedding cosyvoice3 cannot use", 400, "no served model can use this voice", None,
            files={}, needs_triton=True, speaker_embedding="[0.1, 0.2]"),
    # The served cloning family needs a transcript: the front says so, before any stage.
    _upload("upload without the transcript cosyvoice3 needs", 400, "transcript of the recording is required",
            "ref_text"),
    Bad("delete unknown voice", "delete", "no-such-voice", 404, "does not exist", "name"),
    Bad("delete traversal name", "delete", "..%2F..%2Fetc", 404, "does not exist"),
]

_CONFIG = json.dumps({"type": "session.config", "model": "piper"})

WEBSOCKET = [
    Bad("ws binary frame", "ws", [b"\x00\x01"], 400, "json text messages"),
    Bad("ws not json", "ws", ["hello"], 400, "not json"),
    Bad("ws json array", "ws", ['["session.config"]'], 400, 'json object with a "type"', "type"),
    Bad("ws text before config", "ws", ['{"type": "input.text", "text": "Hi."}'], 400,
        "send session.config first", "type"),
    Bad("ws unknown message type", "ws", [_CONFIG, '{"type": "input.append"}'], 400,
        "unknown message type", "type"),
    Bad("ws config bad format", "ws", ['{"type": "session.config", "model": "piper", '
                                       '"response_format": "ogg"}'], 400, "invalid session.config"),
    Bad("ws config unknown model", "ws", ['{"type": "session.config", "model": "nope"}'], 404,
        "does not exist", "model"),
    Bad("ws config speed text", "ws", ['{"type": "session.config", "model": "piper", "speed": "x"}'],
        400, "invalid session.config"),
    Bad("ws config instructions for piper", "ws",
        ['{"type": "session.config", "model": "piper", "instructions": "Softly."}'], 400,
        "instructions is not supported by piper", "instructions"),
    Bad("ws config hostile ref_audio", "ws",
        ['{"type": "session.config", "model": "cosyvoice3", "ref_text": "Hi.", '
         '"ref_audio": "http://169.254.169.254/"}'], 400, "link-local", "ref_audio"),
    Bad("ws unknown voice", "ws", ['{"type": "session.config", "model": "piper", "voice": "nobody"}',
                                   '{"type": "input.text", "text": "Hello there. "}', '{"type": "input.done"}'], 400,
        "unknown voice", needs_triton=True),
    Bad("ws config bad granularity", "ws", ['{"type": "session.config", "model": "piper", '
                                            '"split_granularity": "word"}'], 400, "invalid session.config"),
    Bad("ws text not a string", "ws", [_CONFIG, '{"type": "input.text", "text": 5}'], 400,
        "needs a string", "text"),
    Bad("ws text without sentence end over limit", "ws",
        [_CONFIG, json.dumps({"type": "input.text", "text": "word " * 900})], 400,
        "without a sentence end", "text"),
    Bad("ws message too large", "ws", [_CONFIG, json.dumps({"type": "input.text", "text": "a" * 70000})],
        413, "limit"),
    Bad("ws config during utterance", "ws", [_CONFIG, '{"type": "input.text", "text": "Hello"}', _CONFIG],
        400, "utterance in progress", "type"),
]

TABLE = SPEECH + BATCH + UPLOADS + WEBSOCKET


def check_http(case: Bad, http) -> None:
    """Send a REST case with an httpx-style client; assert its status, message and param."""
    if case.endpoint == "speech":
        r = http.post("/v1/audio/speech", json=case.request)
    elif case.endpoint == "raw":
        r = http.post("/v1/audio/speech", content=case.request[1],
                      headers={"content-type": case.request[0]})
    elif case.endpoint == "batch":
        r = http.post("/v1/audio/speech/batch", json=case.request)
    elif case.endpoint == "upload":
        r = http.post("/v1/audio/voices", data=case.request["data"], files=case.request["files"])
    elif case.endpoint == "delete":
        r = http.delete(f"/v1/audio/voices/{case.request}")
    else:
        raise ValueError(case.endpoint)
    assert r.status_code == case.status, (case.id, r.status_code, r.text[:500])
    error = r.json()["error"]
    assert case.says.lower() in error["message"].lower(), (case.id, error)
    if case.param is not None:
        assert error["param"] == case.param, (case.id, error)


def check_ws(case: Bad, send, receive) -> None:
    """Send a WebSocket case's messages (send(str | bytes)); the first message back
    (receive() -> dict) that is an error has the case's status and words."""
    for message in case.request:
        send(message)
    while True:
        reply = receive()
        if reply.get("type") == "error":
            break
        assert reply.get("type") == "session.configured", (case.id, reply)
    assert reply["status"] == case.status, (case.id, reply)
    assert case.says.lower() in reply["message"].lower(), (case.id, reply)
    if case.param is not None:
        assert reply["param"] == case.param, (case.id, reply)
