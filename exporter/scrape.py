"""GET one target's /metrics under one total deadline; never raises.

The deadline covers connect, request, headers and body as one clock, as a probe
deadline does: a target that drips a byte a second is cut when the deadline passes,
not kept alive by each byte resetting a read timeout. Every socket read is given the
time that is left, so a scrape (and so a shutdown waiting on one) never outlives it.
http.client does the HTTP; the sockets below enforce the clock.
"""
from __future__ import annotations

import base64
import http.client
import socket
import ssl
import time
import zlib
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

# The `result` label values of prefixcache_scrapes_total, in one place.
SUCCESS = "success"
TIMEOUT = "timeout"
CONNECTION_ERROR = "connection_error"
HTTP_ERROR = "http_error"
TOO_LARGE = "too_large"
DECODE_ERROR = "decode_error"
RESULTS = (SUCCESS, TIMEOUT, CONNECTION_ERROR, HTTP_ERROR, TOO_LARGE, DECODE_ERROR)

_CHUNK = 64 * 1024
_HEADERS = {
    "Accept": "text/plain;version=0.0.4;q=0.9,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "vllm-prefix-cache-exporter",
}


@dataclass(frozen=True)
class ScrapeResult:
    result: str
    duration: float
    body: str | None = None
    error: str | None = None
    status: int | None = None


class DeadlineExceeded(socket.timeout):
    pass


def _remaining(deadline: float, cap: float | None = None) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("scrape deadline exceeded")
    return left if cap is None else min(left, cap)


class _Deadline:
    """Every read and write of the socket gets at most the time left of the scrape
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
    def __init__(self, host, port, deadline, connect_timeout, idle, context):
        super().__init__(host, port, context=context)
        self.deadline, self.connect_timeout, self.idle = deadline, connect_timeout, idle
        self.tls_context = context

    def connect(self):
        raw = _connect(self.host, self.port, self.deadline, self.connect_timeout, self.idle)
        try:
            raw.settimeout(_remaining(self.deadline, self.connect_timeout))
            sock = self.tls_context.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise
        sock.deadline, sock.idle = self.deadline, self.idle
        self.sock = sock


def _tls_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.sslsocket_class = _DeadlineSSLSocket
    return context


def redact_url(url: str) -> str:
    """The URL without a password: for logs, labels and the status API."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, f"{parts.username or ''}:xxxxx@{host}", parts.path, parts.query, parts.fragment))


class Scraper:
    """Scrapes one URL. `timeout` is the whole scrape's deadline; `idle` caps any
    single wait for bytes within it."""

    def __init__(self, url: str, connect_timeout: float, timeout: float, body_size_limit: int, idle: float | None = None):
        self.url = url
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.idle = idle
        self.body_size_limit = body_size_limit
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = dict(_HEADERS)
        if parts.username is not None:
            user, password = unquote(parts.username), unquote(parts.password or "")
            self._headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        host_header = f"[{self._host}]" if ":" in self._host else self._host
        if parts.port is not None:
            host_header += f":{parts.port}"
        self._headers["Host"] = host_header
        self._context = _tls_context() if self._https else None

    def close(self) -> None:
        pass  # one connection per scrape, closed by it

    def scrape(self) -> ScrapeResult:
        start = time.monotonic()
        deadline = start + self.timeout
        conn = (_TLSConnection(self._host, self._port, deadline, self.connect_timeout, self.idle, self._context) if self._https
                else _Connection(self._host, self._port, deadline, self.connect_timeout, self.idle))
        try:
            conn.request("GET", self._path, headers=self._headers)
            resp = conn.getresponse()
            if resp.status != 200:
                return ScrapeResult(HTTP_ERROR, time.monotonic() - start, error=f"HTTP {resp.status}", status=resp.status)
            gzipped = "gzip" in (resp.getheader("Content-Encoding") or "").lower()
            declared = resp.getheader("Content-Length") or ""
            if declared.isdigit() and int(declared) > self.body_size_limit and not gzipped:
                return ScrapeResult(TOO_LARGE, time.monotonic() - start,
                                    error=f"body of {declared} bytes exceeds the {self.body_size_limit} byte limit", status=200)
            raw = self._read_body(resp, gzipped)
            if raw is None:
                return ScrapeResult(TOO_LARGE, time.monotonic() - start,
                                    error=f"body exceeds the {self.body_size_limit} byte limit", status=200)
        except (DeadlineExceeded, socket.timeout, TimeoutError):
            return ScrapeResult(TIMEOUT, time.monotonic() - start,
                                error=f"timeout: no complete answer within the {self.timeout:g}s scrape deadline")
        except zlib.error as exc:
            return ScrapeResult(DECODE_ERROR, time.monotonic() - start, error=f"bad gzip body: {exc}", status=200)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return ScrapeResult(CONNECTION_ERROR, time.monotonic() - start, error=f"connection_error: {_short(exc)}")
        finally:
            conn.close()
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return ScrapeResult(DECODE_ERROR, time.monotonic() - start, error=f"body is not UTF-8 at byte {exc.start}", status=200)
        return ScrapeResult(SUCCESS, time.monotonic() - start, body=body, status=200)

    def _read_body(self, resp: http.client.HTTPResponse, gzipped: bool) -> bytes | None:
        """The body, decompressed; None once it passes the size limit (also a gzip bomb's)."""
        limit = self.body_size_limit
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
        out, size = [], 0
        while True:
            chunk = resp.read1(_CHUNK) if hasattr(resp, "read1") else resp.read(_CHUNK)
            if not chunk:
                break
            if inflate is not None:
                chunk = inflate.decompress(chunk, limit + 1 - size)
                if inflate.unconsumed_tail:
                    return None
            size += len(chunk)
            if size > limit:
                return None
            out.append(chunk)
        if inflate is not None:
            rest = inflate.flush()
            size += len(rest)
            if size > limit:
                return None
            out.append(rest)
        return b"".join(out)


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
