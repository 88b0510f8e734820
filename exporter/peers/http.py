"""One HTTP exchange with a peer (a target, Prometheus, Alertmanager) under one total
deadline and a size cap; never follows a redirect.

The deadline covers connect, request, headers and body as one clock, as a probe
deadline does: a peer that drips a byte a second is cut when the deadline passes,
not kept alive by each byte resetting a read timeout. Every socket read is given the
time that is left, so an exchange (and so a shutdown waiting on one) never outlives it.
http.client does the HTTP; the sockets below enforce the clock. A redirect is answered
as what it is (a 3xx status): a sign-in page behind it is not the peer we were given.

Name resolution is inside the deadline too: `getaddrinfo` cannot be interrupted, so it
runs on a small pool of resolver threads and the exchange waits for it at most the time
left; answers are cached per host for RESOLVE_TTL seconds, so a poll rarely asks at all.
A `KeptConnection` keeps one connection to a peer open between exchanges (keep-alive;
TLS sessions resumed on reconnect) and opens a new one when the peer closed it.
"""
from __future__ import annotations

import base64
import http.client
import ipaddress
import queue
import socket
import ssl
import threading
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


RESOLVE_TTL = 30.0  # seconds an answer is used: a pod's address changes with the pod, and discovery says so
RESOLVE_FAILURE_TTL = 5.0  # a name that did not resolve is asked again this soon
RESOLVER_THREADS = 4  # lookups at once; a stalled resolver holds these, never a poll past its deadline


class _Resolver:
    """getaddrinfo on a bounded pool of daemon threads, one lookup per host at a time,
    answers cached with a TTL. A caller waits at most its deadline: a resolver that
    stalls costs the exchange its deadline, never more, and SIGTERM never waits on it."""

    def __init__(self, threads: int = RESOLVER_THREADS, clock=time.monotonic):
        self.clock = clock
        self.threads = threads
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, int], tuple[float, list | None, str]] = {}  # -> (expires, addresses, error)
        self._asking: dict[tuple[str, int], threading.Event] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self.lookups = 0  # getaddrinfo calls made, for tests and benchmarks

    def resolve(self, host: str, port: int, deadline: float) -> list:
        literal = _literal_addresses(host, port)
        if literal is not None:
            return literal
        key = (host.lower(), port)
        while True:
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None and cached[0] > self.clock():
                    if cached[1] is None:
                        raise OSError(cached[2])
                    return cached[1]
                done = self._asking.get(key)
                if done is None:
                    done = self._asking[key] = threading.Event()
                    self._queue.put(key)
                    if len(self._workers) < self.threads:
                        worker = threading.Thread(target=self._work, name="resolver", daemon=True)
                        self._workers.append(worker)
                        worker.start()
            if not done.wait(_remaining(deadline)):
                raise DeadlineExceeded(f"resolving {host} took longer than the deadline")

    def _work(self) -> None:
        while True:
            host, port = key = self._queue.get()
            self.lookups += 1
            try:
                answer, error, ttl = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM), "", RESOLVE_TTL
            except OSError as exc:
                answer, error, ttl = None, f"cannot resolve {host}: {exc.strerror or exc}", RESOLVE_FAILURE_TTL
            except Exception as exc:  # noqa: BLE001 - e.g. UnicodeError for a bad name: the caller gets it as an OSError
                answer, error, ttl = None, f"cannot resolve {host}: {exc}", RESOLVE_FAILURE_TTL
            with self._lock:
                if len(self._cache) > 10000:  # hosts come and go with pods: never grow for ever
                    now = self.clock()
                    self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                self._cache[key] = (self.clock() + ttl, answer, error)
                self._asking.pop(key).set()

    def forget(self, host: str, port: int) -> None:
        """A connection to what the cache said failed: ask again next time."""
        with self._lock:
            self._cache.pop((host.lower(), port), None)


def _literal_addresses(host: str, port: int) -> list | None:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return [(family, socket.SOCK_STREAM, 0, "", (str(ip), port) if ip.version == 4 else (str(ip), port, 0, 0))]


RESOLVER = _Resolver()


def _connect(host: str, port: int, deadline: float, connect_timeout: float, idle: float | None) -> _DeadlineSocket:
    last: OSError | None = None
    for family, kind, proto, _, address in RESOLVER.resolve(host, port, deadline):
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
    if last is not None and not isinstance(last, DeadlineExceeded):
        RESOLVER.forget(host, port)
    raise last or OSError(f"cannot resolve {host}")


class _Connection(http.client.HTTPConnection):
    def __init__(self, host, port, deadline, connect_timeout, idle):
        super().__init__(host, port)
        self.deadline, self.connect_timeout, self.idle = deadline, connect_timeout, idle

    def connect(self):
        self.sock = _connect(self.host, self.port, self.deadline, self.connect_timeout, self.idle)

    def rearm(self, deadline: float, connect_timeout: float, idle: float | None) -> None:
        """The next exchange's clock, on the connection and on its open socket."""
        self.deadline, self.connect_timeout, self.idle = deadline, connect_timeout, idle
        if self.sock is not None:
            self.sock.deadline, self.sock.idle = deadline, idle


class _TLSConnection(http.client.HTTPSConnection):
    def __init__(self, host, port, deadline, connect_timeout, idle, context, server_name=None, session=None):
        super().__init__(host, port, context=context)
        self.deadline, self.connect_timeout, self.idle = deadline, connect_timeout, idle
        self.tls_context = context
        self.server_name = server_name or host  # the name the certificate must carry
        self.tls_session = session  # resumed on a reconnect: no full handshake

    def connect(self):
        raw = _connect(self.host, self.port, self.deadline, self.connect_timeout, self.idle)
        try:
            raw.settimeout(_remaining(self.deadline, self.connect_timeout))
            sock = self.tls_context.wrap_socket(raw, server_hostname=self.server_name, session=self.tls_session)
        except BaseException:
            raw.close()
            raise
        sock.deadline, sock.idle = self.deadline, self.idle
        self.tls_session = sock.session
        self.sock = sock

    rearm = _Connection.rearm


def tls_context(ca_file: str = "", verify: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file or None)
    if not verify:  # only our own process on loopback, whose certificate names the Service
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.sslsocket_class = _DeadlineSSLSocket
    return context


def basic_auth(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


class Endpoint:
    """One URL, parsed once: host, port, path, and the basic auth its userinfo carries.
    `connect_to`: an address the URL's name resolved to, connected to without asking the
    resolver again; the Host header and TLS (SNI, the certificate's name) stay the name's.
    `verify=False` accepts any certificate: for asking our own process whether it serves."""

    def __init__(self, url: str, ca_file: str = "", connect_to: str | None = None, verify: bool = True):
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
        self.context = tls_context(ca_file, verify) if self.https else None

    def connection(self, deadline: float, connect_timeout: float, idle: float | None, session=None) -> http.client.HTTPConnection:
        if self.https:
            return _TLSConnection(self.connect_to, self.port, deadline, connect_timeout, idle, self.context, self.host, session)
        return _Connection(self.connect_to, self.port, deadline, connect_timeout, idle)


class KeptConnection:
    """One connection to an endpoint kept open between exchanges (HTTP keep-alive), for
    a caller that asks the same peer again and again (a target's polls, a Prometheus's
    queries). One exchange at a time uses it; a second one at the same moment gets a
    connection of its own for that exchange. Closed on any failure, reopened by the next
    exchange (resuming the TLS session)."""

    def __init__(self, endpoint: "Endpoint"):
        self.endpoint = endpoint
        self.lock = threading.Lock()
        self.conn: http.client.HTTPConnection | None = None
        self.tls_session = None
        self.opened = 0  # connections opened, for tests and benchmarks
        self.retired = False

    def retire(self) -> None:
        """Close it now if no exchange uses it, else once that exchange ends."""
        self.retired = True
        if self.lock.acquire(blocking=False):
            try:
                self.close()
            finally:
                self.lock.release()

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            session = getattr(conn, "tls_session", None)
            if session is not None:
                self.tls_session = session
            conn.close()


def exchange(endpoint: Endpoint, method: str = "GET", *, timeout: float, size_limit: int, path: str | None = None,
             headers: dict | None = None, body: bytes | None = None, connect_timeout: float | None = None,
             idle: float | None = None, error_body_limit: int = 4096, keep: KeptConnection | None = None) -> Answer:
    """One request and its whole answer within `timeout` seconds (resolving the name
    included). A 2xx body over `size_limit` (after decompression) is PeerTooLarge; any
    other status's body is cut at `error_body_limit`, it only explains the status. With
    `keep`, the connection stays open for the next exchange (a kept connection the peer
    closed meanwhile is replaced once, within the same deadline)."""
    deadline = time.monotonic() + timeout
    connect = timeout if connect_timeout is None else connect_timeout
    sent = {"Accept-Encoding": "gzip", "User-Agent": "vllm-prefix-cache-exporter", **endpoint.headers, **(headers or {})}
    kept = keep is not None and keep.lock.acquire(blocking=False)
    try:
        for attempt in (0, 1):
            reused = kept and keep.conn is not None
            if reused:
                conn = keep.conn
                conn.rearm(deadline, connect, idle)
            else:
                conn = endpoint.connection(deadline, connect, idle, keep.tls_session if kept else None)
                if kept:
                    keep.conn = conn
                    keep.opened += 1
            try:
                return _exchange_on(conn, method, path if path is not None else endpoint.path, body, sent, size_limit,
                                    error_body_limit, timeout, keep_open=kept)
            except _StaleConnection:
                keep.close()
                if attempt:
                    raise PeerConnectionError("the peer closed the connection") from None
            except BaseException:
                if kept:
                    keep.close()
                raise
            finally:
                if not kept:
                    conn.close()
        raise PeerConnectionError("the peer closed the connection")  # not reached
    finally:
        if kept:
            if keep.retired:
                keep.close()
            keep.lock.release()


class _StaleConnection(Exception):
    """A kept connection the peer had closed before our request: open a new one."""


_CLOSED_BEFORE_ANSWER = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def _exchange_on(conn, method: str, path: str, body: bytes | None, sent: dict, size_limit: int, error_body_limit: int,
                 timeout: float, keep_open: bool) -> Answer:
    try:
        was_open = conn.sock is not None
        try:
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
        except _CLOSED_BEFORE_ANSWER:
            if was_open and keep_open:
                raise _StaleConnection() from None
            raise
        ok = 200 <= resp.status < 300
        limit = size_limit if ok else error_body_limit
        gzipped = "gzip" in (resp.getheader("Content-Encoding") or "").lower()
        declared = resp.getheader("Content-Length") or ""
        if ok and declared.isdigit() and int(declared) > limit and not gzipped:
            raise PeerTooLarge(f"answer of {declared} bytes exceeds the {limit} byte limit")
        data = read_body(resp, gzipped, limit, cut=not ok)
        if data is None:
            raise PeerTooLarge(f"answer exceeds the {limit} byte limit")
        answer = Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        if keep_open:
            if resp.isclosed() or resp.length == 0:
                resp.close()  # read to its end: the connection is free for the next request
            else:
                conn.close()  # a body cut short (an error status's) leaves bytes on the wire
        return answer
    except (DeadlineExceeded, socket.timeout, TimeoutError):
        raise PeerTimeout(f"no complete answer within the {timeout:g}s deadline") from None
    except zlib.error as exc:
        raise PeerDecodeError(f"bad gzip body: {exc}") from None
    except _StaleConnection:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise PeerConnectionError(short(exc)) from None


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
