"""Reference audio for voice cloning: turn the `ref_audio` value of a speech request into
the bytes of an audio file, without letting the value reach what it should not.

Accepted forms: plain base64, `data:audio/...;base64,...`, an http(s) URL, or a file:// URL
under a directory the operator opened. The audio itself is not decoded here.

Why so careful: a TTS server that fetches URLs on behalf of clients is a ready-made proxy
into the network it runs in (SSRF). A client could ask for http://169.254.169.254/ (cloud
metadata, often credentials), http://localhost:8000/ (Triton's own HTTP port), or any
10.x service, and get the answer back as "audio" or through error messages and timing. So:

- every address a host resolves to must be public unless the operator allow-listed the host
  (`--allow-media-host`); a name with one private address among public ones is refused, as
  the client cannot tell which one the connection will use;
- the connection goes to the address that was checked, not to a second DNS answer (a DNS
  server that answers public first and private second would otherwise get through);
- redirects are followed by hand and each hop is checked again, because a public URL can
  redirect to the metadata address;
- size and time are bounded whatever the server says, so a client cannot make the front
  download a huge or endless body, or hold a request open forever;
- file:// is off unless a directory is given, and symlinks and `..` are resolved before the
  path is compared with it.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import os
import re
import socket
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

__all__ = ["MediaError", "MediaPolicy", "resolve_audio"]

ACCEPTED_FORMS = "base64 audio, a data: URL, an http(s) URL or a file:// URL"

# Containers that hold audio but are labelled otherwise by common servers and CDNs; anything
# outside this list (text/html, application/json, image/...) is an error page or the wrong URL.
_AUDIO_CONTENT_TYPES = frozenset({
    "application/octet-stream", "binary/octet-stream", "application/ogg",
    "video/mp4", "video/webm", "video/ogg",
})
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

# Not global, but not all flagged by ipaddress's is_private in every Python version.
_EXTRA_NON_PUBLIC = (
    ipaddress.ip_network("100.64.0.0/10"),   # carrier-grade NAT, often internal in clouds
    ipaddress.ip_network("0.0.0.0/8"),       # "this network"; 0.x reaches localhost on Linux
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


class MediaError(ValueError):
    """The reference cannot be used; str(exc) says what to fix (the front answers 400).
    `.field` is the request field name it concerns."""

    def __init__(self, message: str, field: str = "ref_audio"):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class MediaPolicy:
    allowed_local_media_path: Path | None = None   # file:// only under this dir; None: file:// refused
    allowed_hosts: frozenset[str] = frozenset()    # host names or IP literals/CIDRs fetched even if private/loopback
    max_bytes: int = 10 * 1024 * 1024
    timeout_s: float = 10.0                         # total, for the whole fetch incl. redirects
    max_redirects: int = 3


async def resolve_audio(value: object, policy: MediaPolicy, field: str = "ref_audio") -> bytes:
    """base64 | data:audio/...;base64,... | http(s) URL | file:// URL -> the file's bytes."""
    if not isinstance(value, str) or not value.strip():
        raise MediaError(f"{field} must be a string: {ACCEPTED_FORMS}", field)
    value = value.strip()
    # Base64 never contains ':', so anything that starts like "scheme:" is meant as a URL and
    # must not fall through to a confusing "invalid base64".
    match = _SCHEME.match(value)
    if match is None:
        data = _decode_base64(value, policy, field, f"{field} (base64)")
    else:
        scheme = match.group(1).lower()
        if scheme == "data":
            data = _decode_data_url(value, policy, field)
        elif scheme in ("http", "https"):
            data = await _fetch(value, policy, field)
        elif scheme == "file":
            data = await _read_local(value, policy, field)
        else:
            raise MediaError(f"{field}: URL scheme {scheme!r} is not supported; "
                             f"send {ACCEPTED_FORMS}", field)
    if not data:
        raise MediaError(f"{field} is empty", field)
    return data


# -- inline forms -------------------------------------------------------------------------

def _decode_base64(payload: str, policy: MediaPolicy, field: str, what: str) -> bytes:
    compact = "".join(payload.split())   # clients wrap base64 at 76 columns (MIME style)
    # Refuse before decoding, so an oversized value costs no second copy in memory.
    estimate = len(compact) * 3 // 4 - compact[-2:].count("=")
    if estimate > policy.max_bytes:
        raise _too_large(field, estimate, policy)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        hint = ("; it uses the URL-safe alphabet ('-', '_'), send standard base64"
                if "-" in compact or "_" in compact else "")
        raise MediaError(f"{what} is not valid base64 ({exc}){hint}; "
                         f"{field} takes {ACCEPTED_FORMS}", field) from None
    if len(data) > policy.max_bytes:
        raise _too_large(field, len(data), policy)
    return data


def _decode_data_url(value: str, policy: MediaPolicy, field: str) -> bytes:
    header, comma, payload = value[len("data:"):].partition(",")
    if not comma:
        raise MediaError(f"{field}: a data: URL needs a ',' before its payload "
                         "(data:audio/wav;base64,...)", field)
    params = [p.strip() for p in header.split(";")]
    mime = params[0].lower()
    if not (mime.startswith("audio/") or mime == "application/octet-stream"):
        raise MediaError(f"{field}: data: URL has type {mime or '(none, i.e. text/plain)'!r}; "
                         "it must be audio/... or application/octet-stream", field)
    if len(params) < 2 or params[-1].lower() != "base64":
        raise MediaError(f"{field}: only base64 data: URLs are accepted "
                         f"(data:{mime};base64,...)", field)
    return _decode_base64(payload, policy, field, f"{field} (data: URL payload)")


def _too_large(field: str, size: int, policy: MediaPolicy) -> MediaError:
    return MediaError(f"{field} is {_size(size)}, more than the {_size(policy.max_bytes)} "
                      "limit for reference audio", field)


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


# -- http(s) ------------------------------------------------------------------------------

@lru_cache(maxsize=16)
def _allow_list(entries: frozenset[str]) -> tuple[frozenset[str], tuple]:
    """(host names, networks) out of the operator's --allow-media-host entries."""
    names, networks = set(), []
    for entry in entries:
        entry = entry.strip().lower()
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            names.add(entry.rstrip("."))
    return frozenset(names), tuple(networks)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address delivers to: a mapped or tunnelled 127.0.0.1 is still
    127.0.0.1 to the network stack, and ipaddress does not always say so."""
    found = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def _is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        if any(not _is_public(v4) for v4 in _embedded_ipv4(ip)):
            return False
        if ip.is_site_local:
            return False
    if (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
            or ip.is_reserved or ip.is_unspecified or not ip.is_global):
        return False
    return not any(ip in net for net in _EXTRA_NON_PUBLIC if net.version == ip.version)


def _check_url(url: httpx.URL, field: str) -> tuple[str, int]:
    """(host, port) of a URL we may connect to, or MediaError. Called for every hop."""
    if url.scheme not in ("http", "https"):
        raise MediaError(f"{field}: the URL leads to a {url.scheme or 'relative'}: URL; "
                         "only http(s) is fetched", field)
    if url.userinfo:
        # Credentials in a URL end up in logs and can disguise the real host
        # (http://trusted.example@10.0.0.1/).
        raise MediaError(f"{field}: URLs with a user name or password are not accepted", field)
    host = url.raw_host.decode("ascii")
    if not host:
        raise MediaError(f"{field}: the URL has no host", field)
    return host, url.port or (443 if url.scheme == "https" else 80)


async def _checked_addresses(host: str, port: int, policy: MediaPolicy, field: str) -> list[str]:
    """The addresses of `host` to connect to, all checked against the policy.

    Literal forms such as 2130706433, 0x7f.1 or [::ffff:127.0.0.1] go through getaddrinfo
    too: it turns them into the address the socket would really use."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise MediaError(f"{field}: cannot resolve host {host!r} ({exc})", field) from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not addresses:
        raise MediaError(f"{field}: host {host!r} has no address", field)
    names, networks = _allow_list(frozenset(policy.allowed_hosts))
    if host.lower().rstrip(".") in names:
        return addresses
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if _is_public(ip) or any(ip in net for net in networks if net.version == ip.version):
            continue
        raise MediaError(
            f"{field}: host {host!r} resolves to {ip}, a private/loopback/link-local address; "
            "the server does not fetch from its own network unless the operator allows that "
            f"host (--allow-media-host {host})", field)
    return addresses


async def _fetch(value: str, policy: MediaPolicy, field: str) -> bytes:
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _follow(value, policy, field)
    except (TimeoutError, httpx.TimeoutException):
        raise MediaError(f"fetching {field} timed out after {policy.timeout_s:g} s", field) from None


async def _follow(value: str, policy: MediaPolicy, field: str) -> bytes:
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as exc:
        raise MediaError(f"{field}: invalid URL ({exc})", field) from None
    for hop in range(policy.max_redirects + 1):
        host, port = _check_url(url, field)
        addresses = await _checked_addresses(host, port, policy, field)
        # A fresh client per hop: a pooled connection opened (and TLS-verified) for one host
        # must not carry the request for the next.
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                     timeout=policy.timeout_s) as client:
            async with _open(client, url, host, addresses, field) as response:
                if response.status_code in _REDIRECT_STATUSES:
                    location = response.headers.get("location")
                    if not location:
                        raise MediaError(f"{field}: {host} answered HTTP {response.status_code} "
                                         "without a Location", field)
                    if hop == policy.max_redirects:
                        break
                    try:
                        url = url.join(location)
                    except httpx.InvalidURL as exc:
                        raise MediaError(f"{field}: {host} redirects to an invalid URL ({exc})",
                                         field) from None
                    continue
                return await _read_body(response, host, policy, field)
    raise MediaError(f"{field}: more than {policy.max_redirects} redirects", field)


class _open:
    """GET `url` at one of its checked addresses, streamed; tries them in order, as a plain
    connect would. The host name still goes in Host and in TLS SNI/certificate checks."""

    def __init__(self, client: httpx.AsyncClient, url: httpx.URL, host: str,
                 addresses: list[str], field: str):
        self.client, self.url, self.host = client, url, host
        self.addresses, self.field = addresses, field
        self.response: httpx.Response | None = None

    async def __aenter__(self) -> httpx.Response:
        error: Exception | None = None
        for address in self.addresses:
            try:
                pinned = self.url.copy_with(host=address)
            except httpx.InvalidURL as exc:   # e.g. an IPv6 zone id
                error = exc
                continue
            request = self.client.build_request(
                "GET", pinned,
                # identity: a compressed body would be inflated before the size limit sees it
                headers={"Host": self.url.netloc.decode("ascii"), "Accept-Encoding": "identity",
                         "Accept": "audio/*, application/octet-stream;q=0.9, */*;q=0.1"},
                extensions={"sni_hostname": self.host})
            try:
                self.response = await self.client.send(request, stream=True)
                return self.response
            except httpx.ConnectError as exc:
                error = exc
            except httpx.TimeoutException:
                raise
            except httpx.HTTPError as exc:
                raise _transport_error(self.host, exc, self.field) from None
        raise _transport_error(self.host, error, self.field) from None

    async def __aexit__(self, *exc_info) -> None:
        if self.response is not None:
            await self.response.aclose()


def _transport_error(host: str, exc: Exception | None, field: str) -> MediaError:
    reason = str(exc) or type(exc).__name__
    return MediaError(f"fetching {field} from {host} failed: {reason}", field)


async def _read_body(response: httpx.Response, host: str, policy: MediaPolicy,
                     field: str) -> bytes:
    if response.status_code != 200:
        raise MediaError(f"fetching {field} from {host} failed: HTTP {response.status_code}",
                         field)
    content_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type and not (content_type.startswith("audio/")
                             or content_type in _AUDIO_CONTENT_TYPES):
        raise MediaError(f"{field}: {host} sent {content_type!r}, not audio", field)
    declared = response.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > policy.max_bytes:
        raise _too_large(field, int(declared), policy)
    # The declared length may be missing or false: count what actually arrives.
    body = bytearray()
    try:
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > policy.max_bytes:
                raise MediaError(f"{field} from {host} is more than the "
                                 f"{_size(policy.max_bytes)} limit for reference audio", field)
    except httpx.TimeoutException:
        raise
    except httpx.HTTPError as exc:
        raise _transport_error(host, exc, field) from None
    return bytes(body)


# -- file:// ------------------------------------------------------------------------------

async def _read_local(value: str, policy: MediaPolicy, field: str) -> bytes:
    if policy.allowed_local_media_path is None:
        raise MediaError(f"{field}: file:// URLs are not enabled on this server "
                         "(the operator sets --allowed-local-media-path)", field)
    if not value[:7].lower() == "file://":
        raise MediaError(f"{field}: write local files as file:///absolute/path", field)
    parts = urlsplit(value)
    if parts.netloc.lower() not in ("", "localhost"):
        raise MediaError(f"{field}: file:// URLs must name a local file (file:///absolute/path), "
                         f"not host {parts.netloc!r}", field)
    if parts.query or parts.fragment:
        raise MediaError(f"{field}: a file:// URL has no query or fragment "
                         "(percent-encode '?' and '#' in file names)", field)
    path = unquote(parts.path)
    if not path.startswith("/") or "\0" in path:
        raise MediaError(f"{field}: write local files as file:///absolute/path", field)
    return await asyncio.to_thread(_read_allowed_file, path, policy, field)


def _read_allowed_file(path: str, policy: MediaPolicy, field: str) -> bytes:
    root_given = Path(os.path.abspath(policy.allowed_local_media_path))
    root = root_given.resolve()
    outside = MediaError(f"{field}: {path} is outside the directory this server reads "
                         "reference audio from", field)
    # Before touching the file system, so a path outside cannot be used to probe which files
    # exist there (not found vs. outside); the check on the resolved path below is the one
    # that counts, since symlinks and '..' can still lead out.
    lexical = Path(os.path.normpath(path))
    if not (lexical.is_relative_to(root_given) or lexical.is_relative_to(root)):
        raise outside
    try:
        real = Path(path).resolve(strict=True)
    except FileNotFoundError:
        raise MediaError(f"{field}: file not found: {path}", field) from None
    except (OSError, RuntimeError) as exc:   # RuntimeError: symlink loop
        raise MediaError(f"{field}: cannot read {path} ({exc})", field) from None
    if not real.is_relative_to(root):
        raise outside
    if not real.is_file():
        raise MediaError(f"{field}: {path} is not a regular file", field)
    try:
        # O_NONBLOCK: if the file was swapped for a FIFO since the check, open must not hang.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise MediaError(f"{field}: cannot read {path} ({exc.strerror})", field) from None
    with open(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise MediaError(f"{field}: {path} is not a regular file", field)
        if info.st_size > policy.max_bytes:
            raise _too_large(field, info.st_size, policy)
        data = f.read(policy.max_bytes + 1)   # the file may have grown since fstat
    if len(data) > policy.max_bytes:
        raise _too_large(field, len(data), policy)
    return data
