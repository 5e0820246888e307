"""frontend.media: ref_audio values become file bytes, and a URL can't be used to make the
front reach into its own network (loopback, private ranges, cloud metadata), directly or
through a redirect, nor to make it download without bound or wait forever."""
from __future__ import annotations

import asyncio
import base64
import io
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from frontend.media import MediaError, MediaPolicy, resolve_audio


def _wav() -> bytes:
    buf = io.BytesIO()
    t = np.arange(1600) / 16000
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000,
             format="WAV", subtype="PCM_16")
    return buf.getvalue()


WAV = _wav()
WAV_B64 = base64.b64encode(WAV).decode()
METADATA_URL = "http://169.254.169.254/latest/meta-data/"
SLOW_S = 3.0


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.0: the connection closes after each answer, so a body without Content-Length
    ends at the close."""

    def log_message(self, *args):
        pass

    def _answer(self, status=200, body=b"", headers=(("Content-Type", "audio/wav"),),
                length: int | None = -1):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if length is not None:
            self.send_header("Content-Length", str(len(body) if length == -1 else length))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str):
        self._answer(302, headers=(("Location", location),))

    def do_GET(self):
        try:
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            pass   # the client gave up, as it should for the endless or slow answers

    def _route(self):
        path = self.path
        if path == "/audio.wav":
            self._answer(body=WAV)
        elif path == "/audio-untyped":
            self._answer(body=WAV, headers=())
        elif path == "/audio-octet":
            self._answer(body=WAV, headers=(("Content-Type", "application/octet-stream"),))
        elif path == "/echo-host":
            self._answer(body=self.headers["Host"].encode())
        elif path == "/redirect":
            self._redirect("/audio.wav")
        elif path.startswith("/chain/"):
            left = int(path.rsplit("/", 1)[1])
            self._redirect(f"/chain/{left - 1}" if left > 1 else "/audio.wav")   # N redirects
        elif path == "/redirect-metadata":
            self._redirect(METADATA_URL)
        elif path == "/redirect-file":
            self._redirect("file:///etc/passwd")
        elif path == "/redirect-ftp":
            self._redirect("ftp://127.0.0.1/audio.wav")
        elif path == "/endless":
            self._answer(length=None)
            chunk = b"\0" * 16384
            for _ in range(256):   # 4 MiB at most, so the thread ends even if nobody reads
                self.wfile.write(chunk)
        elif path == "/declares-less":
            self._answer(body=b"\1" * (1024 * 1024), length=1000)
        elif path == "/declares-more":
            self._answer(body=b"\1" * 100, length=5000)
        elif path == "/declares-huge":
            self._answer(body=b"\1" * 10, length=10 ** 10)
        elif path == "/missing":
            self._answer(404, body=b"not here", headers=(("Content-Type", "text/plain"),))
        elif path == "/page.html":
            self._answer(body=b"<html>login</html>", headers=(("Content-Type", "text/html"),))
        elif path == "/slow":
            time.sleep(SLOW_S)
            self._answer(body=WAV)
        else:
            self._answer(404)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.block_on_close = False   # teardown must not wait for /slow
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


LOCAL = dict(allowed_hosts=frozenset({"127.0.0.1"}), timeout_s=5.0)


def resolve(value, field="ref_audio", **policy) -> bytes:
    return asyncio.run(resolve_audio(value, MediaPolicy(**policy), field))


def refused(value, **policy) -> str:
    with pytest.raises(MediaError) as info:
        resolve(value, **policy)
    return str(info.value)


# -- inline forms -------------------------------------------------------------------------

def test_base64_returns_the_exact_bytes():
    assert resolve(WAV_B64) == WAV


def test_base64_wrapped_over_lines_returns_the_exact_bytes():
    wrapped = "\n".join(WAV_B64[i:i + 76] for i in range(0, len(WAV_B64), 76))
    assert resolve(wrapped + "\n") == WAV


def test_invalid_base64_is_refused_with_the_accepted_forms():
    msg = refused("this is not audio!")
    assert "not valid base64" in msg and "data: URL" in msg


def test_urlsafe_base64_is_refused_with_a_hint():
    data = bytes(range(250, 256)) * 10
    assert "URL-safe" in refused(base64.urlsafe_b64encode(data).decode())


def test_data_url_returns_the_exact_bytes():
    assert resolve(f"data:audio/wav;base64,{WAV_B64}") == WAV
    assert resolve(f"DATA:Audio/X-WAV;BASE64,{WAV_B64}") == WAV
    assert resolve(f"data:application/octet-stream;base64,{WAV_B64}") == WAV


def test_data_url_payload_with_newlines_returns_the_exact_bytes():
    wrapped = "\r\n".join(WAV_B64[i:i + 64] for i in range(0, len(WAV_B64), 64))
    assert resolve(f"data:audio/wav;base64,{wrapped}") == WAV


def test_data_url_with_parameters_before_base64_is_accepted():
    assert resolve(f"data:audio/ogg;codecs=opus;base64,{WAV_B64}") == WAV


def test_data_url_with_text_plain_type_is_refused_naming_the_type():
    assert "text/plain" in refused(f"data:text/plain;base64,{WAV_B64}")


def test_data_url_without_type_is_refused_as_text_plain():
    assert "text/plain" in refused(f"data:;base64,{WAV_B64}")


def test_data_url_without_base64_is_refused():
    assert "only base64" in refused("data:audio/wav,RIFF....WAVE")


def test_data_url_without_comma_is_refused():
    assert "','" in refused("data:audio/wav;base64")


def test_data_url_with_invalid_base64_payload_is_refused():
    assert "not valid base64" in refused("data:audio/wav;base64,!!!!")


def test_oversize_base64_is_refused():
    assert "limit" in refused(WAV_B64, max_bytes=1000)


def test_oversize_data_url_is_refused():
    assert "limit" in refused(f"data:audio/wav;base64,{WAV_B64}", max_bytes=1000)


def test_oversize_base64_is_refused_from_its_length_before_decoding():
    # Invalid at the very end: only a check made before decoding reports the size.
    assert "limit" in refused("A" * 4000 + "!!!!", max_bytes=1000)


def test_base64_at_exactly_max_bytes_is_accepted():
    assert resolve(base64.b64encode(b"x" * 999).decode(), max_bytes=999) == b"x" * 999


def test_empty_data_url_payload_is_refused_as_empty():
    assert "is empty" in refused("data:audio/wav;base64,")


@pytest.mark.parametrize("value", [123, None, ["abc"], b"UklGRg==", {"url": "x"}, "", "  \n"])
def test_non_string_or_empty_value_is_refused(value):
    assert "must be a string" in refused(value)


def test_field_name_is_carried_by_the_error_and_its_message():
    with pytest.raises(MediaError) as info:
        resolve(42, field="voice.ref_audio")
    assert info.value.field == "voice.ref_audio" and "voice.ref_audio" in str(info.value)
    with pytest.raises(MediaError) as info:
        resolve(42)
    assert info.value.field == "ref_audio" and isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", ["ftp://example.com/a.wav", "gopher://example.com/",
                                   "s3://bucket/a.wav", "mailto:a@example.com",
                                   "javascript:alert(1)"])
def test_other_schemes_are_refused_listing_accepted_forms(value):
    msg = refused(value)
    assert "not supported" in msg and "http(s) URL" in msg and "file:// URL" in msg


# -- http(s): what may be reached ---------------------------------------------------------

def test_loopback_url_is_refused_by_default_naming_host_and_flag(server):
    msg = refused(f"{server}/audio.wav")
    assert "'127.0.0.1'" in msg and "private/loopback" in msg and "--allow-media-host" in msg


def test_loopback_url_is_fetched_when_host_is_allow_listed(server):
    assert resolve(f"{server}/audio.wav", **LOCAL) == WAV


def test_loopback_url_is_fetched_when_its_network_is_allow_listed(server):
    assert resolve(f"{server}/audio.wav", allowed_hosts=frozenset({"127.0.0.0/8"})) == WAV


def test_localhost_is_refused_by_default(server):
    assert "'localhost'" in refused(f"http://localhost:{_port(server)}/audio.wav")


def test_localhost_is_fetched_when_named_in_allow_list_case_insensitively(server):
    policy = dict(allowed_hosts=frozenset({"LocalHost"}))
    assert resolve(f"http://localhost:{_port(server)}/audio.wav", **policy) == WAV


@pytest.mark.parametrize("host", [
    "[::1]", "2130706433", "0x7f.0.0.1", "0x7f.1", "017700000001", "127.1", "0.0.0.0",
    "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[2002:7f00:1::1]", "[64:ff9b::7f00:1]", "[::]",
])
def test_odd_loopback_literals_are_refused(server, host):
    start = time.monotonic()
    msg = refused(f"http://{host}:{_port(server)}/audio.wav")
    # Where this machine's getaddrinfo cannot read a form, it is refused as unresolvable.
    assert "private/loopback" in msg or "cannot resolve" in msg
    assert time.monotonic() - start < 1.0


def test_odd_literal_is_checked_as_the_address_it_means(server):
    # 2130706433 is 127.0.0.1: the allow-list entry for 127.0.0.1 applies to it.
    assert resolve(f"http://2130706433:{_port(server)}/audio.wav", **LOCAL) == WAV


@pytest.mark.parametrize("url", [
    METADATA_URL, "http://[fe80::1]/", "http://10.0.0.1/a.wav", "http://172.16.3.4/a.wav",
    "http://192.168.1.1/a.wav", "http://100.64.0.1/a.wav", "https://224.0.0.1/a.wav",
])
def test_private_link_local_and_metadata_addresses_are_refused_before_connecting(url):
    start = time.monotonic()
    msg = refused(url, timeout_s=0.5)
    assert "private/loopback/link-local" in msg and "timed out" not in msg
    assert time.monotonic() - start < 0.5


def test_allow_listed_loopback_does_not_open_other_private_addresses():
    msg = refused("http://10.0.0.1/a.wav", allowed_hosts=LOCAL["allowed_hosts"], timeout_s=0.5)
    assert "'10.0.0.1'" in msg and "private/loopback" in msg


def test_userinfo_url_is_refused(server):
    url = server.replace("http://", "http://user:pass@") + "/audio.wav"
    assert "user name or password" in refused(url, **LOCAL)


def test_url_without_host_is_refused():
    assert isinstance(refused("http:///audio.wav"), str)


# -- http(s): names, resolved once --------------------------------------------------------

@pytest.fixture
def fake_dns(monkeypatch):
    """Names under .test resolve to what the test says; the rest as usual."""
    table: dict[str, list[str]] = {}
    real = asyncio.base_events.BaseEventLoop.getaddrinfo

    async def getaddrinfo(self, host, port, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".test"):
            if host not in table:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                     (a, port)) for a in table[host]]
        return await real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "getaddrinfo", getaddrinfo)
    return table


def test_name_resolving_to_a_private_address_is_refused_naming_host_and_address(fake_dns):
    fake_dns["rebind.test"] = ["10.1.2.3"]
    msg = refused("http://rebind.test/a.wav")
    assert "'rebind.test'" in msg and "10.1.2.3" in msg


def test_name_with_any_private_address_among_public_ones_is_refused(fake_dns):
    fake_dns["mixed.test"] = ["93.184.216.34", "127.0.0.1"]
    assert "127.0.0.1" in refused("http://mixed.test/a.wav")


def test_unresolvable_name_is_refused_naming_it(fake_dns):
    assert "cannot resolve host 'nowhere.test'" in refused("http://nowhere.test/a.wav")


def test_fetch_connects_to_the_checked_address_and_sends_the_host_name(server, fake_dns):
    # httpx cannot resolve media.test itself: the answer proves the connection went to the
    # address that was checked, with no second lookup a DNS server could answer differently.
    fake_dns["media.test"] = ["127.0.0.1"]
    port = _port(server)
    body = resolve(f"http://media.test:{port}/echo-host",
                   allowed_hosts=frozenset({"Media.Test"}))
    assert body == f"media.test:{port}".encode()


# -- http(s): redirects -------------------------------------------------------------------

def test_redirect_to_allowed_path_is_followed(server):
    assert resolve(f"{server}/redirect", **LOCAL) == WAV


def test_redirect_chain_up_to_max_redirects_is_followed(server):
    assert resolve(f"{server}/chain/3", max_redirects=3, **LOCAL) == WAV


def test_redirect_chain_longer_than_max_redirects_is_refused(server):
    assert "more than 3 redirects" in refused(f"{server}/chain/4", max_redirects=3, **LOCAL)


def test_no_redirect_is_followed_when_max_redirects_is_zero(server):
    assert "more than 0 redirects" in refused(f"{server}/redirect", max_redirects=0, **LOCAL)


def test_redirect_to_metadata_ip_is_refused_even_with_loopback_allow_listed(server):
    start = time.monotonic()
    msg = refused(f"{server}/redirect-metadata", **LOCAL)
    assert "169.254.169.254" in msg and "link-local" in msg
    assert time.monotonic() - start < 1.0


def test_redirect_to_file_url_is_refused(server):
    msg = refused(f"{server}/redirect-file", **LOCAL)
    assert "file:" in msg and "only http(s)" in msg


def test_redirect_to_ftp_is_refused(server):
    assert "only http(s)" in refused(f"{server}/redirect-ftp", **LOCAL)


# -- http(s): answers ---------------------------------------------------------------------

def test_http_404_is_refused_naming_the_status(server):
    assert "404" in refused(f"{server}/missing", **LOCAL)


def test_html_page_is_refused_as_not_audio(server):
    msg = refused(f"{server}/page.html", **LOCAL)
    assert "text/html" in msg and "not audio" in msg


def test_octet_stream_and_missing_content_type_are_accepted(server):
    assert resolve(f"{server}/audio-octet", **LOCAL) == WAV
    assert resolve(f"{server}/audio-untyped", **LOCAL) == WAV


def test_body_without_content_length_over_max_bytes_is_refused(server):
    start = time.monotonic()
    assert "limit" in refused(f"{server}/endless", max_bytes=64 * 1024, **LOCAL)
    assert time.monotonic() - start < 2.0


def test_declared_content_length_over_max_bytes_is_refused_before_the_body(server):
    assert "limit" in refused(f"{server}/declares-huge", max_bytes=64 * 1024, **LOCAL)


def test_content_length_understating_the_body_never_yields_more_than_declared(server):
    # The surplus past the declared length is not read as body, so it cannot pass the limit.
    assert resolve(f"{server}/declares-less", max_bytes=64 * 1024, **LOCAL) == b"\1" * 1000


def test_content_length_overstating_the_body_is_refused_as_incomplete(server):
    assert "failed" in refused(f"{server}/declares-more", **LOCAL)


def test_slow_server_is_refused_as_timed_out(server):
    start = time.monotonic()
    msg = refused(f"{server}/slow", allowed_hosts=LOCAL["allowed_hosts"], timeout_s=0.5)
    assert "timed out after 0.5 s" in msg
    assert time.monotonic() - start < SLOW_S - 1


def test_connection_refused_is_reported_with_the_reason():
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    msg = refused(f"http://127.0.0.1:{port}/a.wav", **LOCAL)
    assert "failed" in msg and "127.0.0.1" in msg


# -- file:// ------------------------------------------------------------------------------

@pytest.fixture
def media(tmp_path) -> Path:
    root = tmp_path / "media"
    root.mkdir()
    (root / "ref voice.wav").write_bytes(WAV)
    (tmp_path / "secret.wav").write_bytes(b"secret")
    return root


def test_file_url_is_refused_when_no_directory_is_allowed(media):
    assert "not enabled" in refused((media / "ref voice.wav").as_uri())


def test_file_url_inside_allowed_directory_returns_the_bytes(media):
    # as_uri() percent-encodes the space: the path is decoded before use.
    assert resolve((media / "ref voice.wav").as_uri(), allowed_local_media_path=media) == WAV


def test_file_url_with_localhost_host_is_accepted(media):
    url = "file://localhost" + (media / "ref voice.wav").as_uri()[len("file://"):]
    assert resolve(url, allowed_local_media_path=media) == WAV


def test_file_url_escaping_with_dotdot_is_refused(media):
    assert "outside" in refused(f"file://{media}/../secret.wav", allowed_local_media_path=media)
    assert "outside" in refused(f"file://{media}/%2e%2e/secret.wav",
                                allowed_local_media_path=media)


def test_file_url_through_symlink_pointing_outside_is_refused(media):
    (media / "link.wav").symlink_to(media.parent / "secret.wav")
    assert "outside" in refused((media / "link.wav").as_uri(), allowed_local_media_path=media)


def test_file_url_through_symlink_inside_is_accepted(media):
    (media / "alias.wav").symlink_to(media / "ref voice.wav")
    assert resolve((media / "alias.wav").as_uri(), allowed_local_media_path=media) == WAV


def test_allowed_directory_given_through_a_symlink_works(media):
    link = media.parent / "media-link"
    link.symlink_to(media, target_is_directory=True)
    assert resolve((link / "ref voice.wav").as_uri(), allowed_local_media_path=link) == WAV
    assert resolve((media / "ref voice.wav").as_uri(), allowed_local_media_path=link) == WAV


def test_missing_file_is_refused_naming_the_path(media):
    msg = refused((media / "nope.wav").as_uri(), allowed_local_media_path=media)
    assert "not found" in msg and str(media / "nope.wav") in msg


def test_file_outside_is_refused_the_same_whether_or_not_it_exists(media):
    exists = refused("file:///etc/passwd", allowed_local_media_path=media)
    missing = refused("file:///etc/no-such-file-here", allowed_local_media_path=media)
    assert "outside" in exists and "outside" in missing


def test_directory_is_refused_as_not_a_regular_file(media):
    (media / "sub").mkdir()
    assert "not a regular file" in refused((media / "sub").as_uri(),
                                           allowed_local_media_path=media)


def test_oversize_file_is_refused(media):
    assert "limit" in refused((media / "ref voice.wav").as_uri(),
                              allowed_local_media_path=media, max_bytes=100)


def test_empty_file_is_refused_as_empty(media):
    (media / "empty.wav").write_bytes(b"")
    assert "is empty" in refused((media / "empty.wav").as_uri(), allowed_local_media_path=media)


@pytest.mark.parametrize("url", ["file://otherhost/etc/passwd", "file:relative/a.wav",
                                 "file:/a.wav", "file:///a.wav?x=1"])
def test_file_url_not_in_file_triple_slash_form_is_refused(media, url):
    assert isinstance(refused(url, allowed_local_media_path=media), str)
