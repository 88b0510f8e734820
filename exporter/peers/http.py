"""One HTTP exchange with a peer (a target, Prometheus, Alertmanager) under one total
deadline and a size cap; never follows a redirect.

The deadline covers connect, request, headers and body as one clock, as a probe
deadline does: a peer that drips a byte a second is cut when the deadline passes,
not kept alive by each byte resetting a read timeout. Every socket read is given the
time that is left, so an exchange (and so a shutdown waiting on one) never outlives it.
http.client does the HTTP; the sockets below enforce the clock. A redirect is answered
as what it is (a 3xx status): a sign-in page behind it is not the peer we were given.
"""
from __future__ import annotations

import base64
import http.client
import socket
import ssl
import time
import zlib
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

_CHUNK = 64 * 1024


class PeerError(Exception):
    """The exchange gave no usable answer; the message names no credential."""


class PeerTimeout(PeerError):
    pass


class PeerTooLarge(PeerError):
    pass


class PeerDecodeError(PeerError):
    pass


class PeerConnectionError(PeerError):
    pass


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict  # lower-case names
    body: bytes  # decompressed; of an error status at most `error_body_limit` bytes


class DeadlineExceeded(socket.timeout):
    pass


def _remaining(deadline: float, cap: float | None = None) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("deadline exceeded")
    return left if cap is None else min(left, cap)


class _Deadline:
    """Every read and write of the socket gets at most the time left of the exchange
    (and at most `idle`): mixed into a plain and a TLS socket class."""

    deadline: float = 0.0
    idle: float | None = None

    def _arm(self) -> None:
        self.settimeout(_remaining(self.deadline, self.idle))

    def recv_into(self, *args, **kwargs):
        self._arm()
        return super().recv_into(*args, **kwargs)

    def recv(self, *args, **kwargs):
        self._arm()
        return super().recv(*args, **kwargs)

    def sendall(self, *args, **kwargs):
        self._arm()
        return super().sendall(*args, **kwargs)


class _DeadlineSocket(_Deadline, socket.socket):
    pass


class _DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
    def read(self, *args, **kwargs):
        self._arm()
        return super().read(*args, **kwargs)


def _connect(host: str, port: int, deadline: float, connect_timeout: float, idle: float | None) -> _DeadlineSocket:
    last: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = _DeadlineSocket(family, kind, proto)
        try:
            sock.settimeout(_remaining(deadline, connect_timeout))
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.deadline, sock.idle = deadline, idle
            return sock
        except OSError as exc:
            sock.close()
            last = exc
            if isinstance(exc, DeadlineExceeded):
                break
    raise last or OSError(f"cannot resolve {host}")


class _Connection(http.client.HTTPConnection):
    def __init__(self, host, port, deadline, connect_timeout, idle):
        super().__init__(host, port)
        self.deadline, self.connect_timeout, self.idle = deadline, connect_timeout, idle

    def connect(self):
        self.sock = _connect(self.host, self.port, self.deadline, self.connect_timeout, self.idle)


class _TLSConnection(http.client.HTTPSConnection):
    def __init__(self, host, port, deadline, connect_timeout, idle, context, server_name=None):
        super().__init__(host, port, context=context)
        self.deadline, self.connect_timeout, self.idle = deadline, connect_timeout, idle
        self.tls_context = context
        self.server_name = server_name or host  # the name the certificate must carry

    def connect(self):
        raw = _connect(self.host, self.port, self.deadline, self.connect_timeout, self.idle)
        try:
            raw.settimeout(_remaining(self.deadline, self.connect_timeout))
            sock = self.tls_context.wrap_socket(raw, server_hostname=self.server_name)
        except BaseException:
            raw.close()
            raise
        sock.deadline, sock.idle = self.deadline, self.idle
        self.sock = sock


def tls_context(ca_file: str = "") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file or None)
    context.sslsocket_class = _DeadlineSSLSocket
    return context


def basic_auth(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


class Endpoint:
    """One URL, parsed once: host, port, path, and the basic auth its userinfo carries.
    `connect_to`: an address the URL's name resolved to, connected to without asking the
    resolver again; the Host header and TLS (SNI, the certificate's name) stay the name's."""

    def __init__(self, url: str, ca_file: str = "", connect_to: str | None = None):
        parts = urlsplit(url)
        self.url = url
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.connect_to = connect_to or self.host
        self.port = parts.port or (443 if self.https else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.headers: dict[str, str] = {}
        if parts.username is not None:
            self.headers["Authorization"] = basic_auth(unquote(parts.username), unquote(parts.password or ""))
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None:
            host_header += f":{parts.port}"
        self.headers["Host"] = host_header
        self.context = tls_context(ca_file) if self.https else None

    def connection(self, deadline: float, connect_timeout: float, idle: float | None) -> http.client.HTTPConnection:
        if self.https:
            return _TLSConnection(self.connect_to, self.port, deadline, connect_timeout, idle, self.context, self.host)
        return _Connection(self.connect_to, self.port, deadline, connect_timeout, idle)


def exchange(endpoint: Endpoint, method: str = "GET", *, timeout: float, size_limit: int, path: str | None = None,
             headers: dict | None = None, body: bytes | None = None, connect_timeout: float | None = None,
             idle: float | None = None, error_body_limit: int = 4096) -> Answer:
    """One request and its whole answer within `timeout` seconds. A 2xx body over
    `size_limit` (after decompression) is PeerTooLarge; any other status's body is cut
    at `error_body_limit`, it only explains the status."""
    deadline = time.monotonic() + timeout
    conn = endpoint.connection(deadline, timeout if connect_timeout is None else connect_timeout, idle)
    sent = {"Accept-Encoding": "gzip", "User-Agent": "vllm-prefix-cache-exporter", **endpoint.headers, **(headers or {})}
    try:
        conn.request(method, path if path is not None else endpoint.path, body=body, headers=sent)
        resp = conn.getresponse()
        ok = 200 <= resp.status < 300
        limit = size_limit if ok else error_body_limit
        gzipped = "gzip" in (resp.getheader("Content-Encoding") or "").lower()
        declared = resp.getheader("Content-Length") or ""
        if ok and declared.isdigit() and int(declared) > limit and not gzipped:
            raise PeerTooLarge(f"answer of {declared} bytes exceeds the {limit} byte limit")
        data = read_body(resp, gzipped, limit, cut=not ok)
        if data is None:
            raise PeerTooLarge(f"answer exceeds the {limit} byte limit")
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    except (DeadlineExceeded, socket.timeout, TimeoutError):
        raise PeerTimeout(f"no complete answer within the {timeout:g}s deadline") from None
    except zlib.error as exc:
        raise PeerDecodeError(f"bad gzip body: {exc}") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise PeerConnectionError(short(exc)) from None
    finally:
        conn.close()


def read_body(resp: http.client.HTTPResponse, gzipped: bool, limit: int, cut: bool = False) -> bytes | None:
    """The body, decompressed; None once it passes `limit` (also a gzip bomb's), or with
    `cut` its first `limit` bytes. A body that ends before its Content-Length, or a gzip
    stream that ends before its trailer, is an error, never a shorter success."""
    if cut and limit <= 0:
        return b""  # the status says it all: a stalled error body must not turn it into a timeout
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    out, size = [], 0
    while size <= limit:
        chunk = resp.read1(_CHUNK)
        if not chunk:
            break
        if inflate is not None:
            chunk = inflate.decompress(chunk, limit + 1 - size)
            if inflate.unconsumed_tail and not cut:
                return None
        size += len(chunk)
        out.append(chunk)
    else:
        return b"".join(out)[:limit] if cut else None
    if resp.length:  # http.client's read1 returns b"" at EOF even when bytes are missing
        raise http.client.IncompleteRead(b"", resp.length)
    if inflate is not None:
        if not inflate.eof:
            raise zlib.error("the gzip stream ends before its end")
        rest = inflate.flush()
        size += len(rest)
        out.append(rest)
        if size > limit:
            return b"".join(out)[:limit] if cut else None
    return b"".join(out)


def short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, http.client.IncompleteRead):
        text = f"the body ended {exc.expected} bytes short"
    return text if len(text) <= 200 else text[:197] + "..."
