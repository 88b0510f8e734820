"""The threaded HTTP(S) server under the WSGI app: cheroot, changed so that no client can
hold the workers every scrape and probe needs before it has sent a whole request.

cheroot hands a connection to one of its 16 workers as soon as it has bytes to read, and
the worker then blocks reading the rest. Clients that each send part of a request (or 5
bytes of a TLS ClientHello) and reconnect when dropped held every worker: /-/healthy took
4.75 s with 16 such clients and timed out at 20 s with 100, plain and TLS alike (the 5 s
request deadline only made them reconnect). The candidates, measured with the real `run`
process on 127.0.0.1 (2-core VM, shared), a probe every 0.25 s for 12 s, the worst probe:

- a deadline before a worker (connections already wait in the selector until they send):
  no help, these clients send their first bytes at once: 20 s with 100;
- more workers: 128 held 100 clients (13 ms plain, 29 ms TLS) and 200 clients took them
  all again (4.76 s): it moves the threshold, at a thread per client;
- per-IP limits: the probe shares its address with the other clients (the kubelet's with
  every hostNetwork pod; here all of them, 127.0.0.1): a limit lets them all in or locks
  the probe out;
- read-ahead, what this module does: the selector's thread reads every connection
  without blocking (the TLS handshake too, under the same deadline) and hands a worker
  only a whole request, head and body, which it answers without waiting on the client.
  With 100 clients: 61 ms holding heads, 9 ms holding bodies, 30 ms holding 5 bytes of
  a ClientHello, 160 ms shaking hands and holding heads; with 400: 12, 19, 155 and 600
  ms (400 handshakes at once, all on 2 cores with the clients' own).

A request still gets one deadline (`read_deadline`, 5 s) for its TLS handshake, head and
body together, from its first byte: a client that sends a line every few seconds is cut
there instead of being kept by cheroot's per-read timeout. A connection that never sends
a byte waits in the selector, costing no worker, until the idle timeout. A body needs a
Content-Length no larger than `max_body` (our largest route takes 64 KiB): a chunked one
is answered 411, as RFC 9112 allows, since it could not be read ahead to a known end.
The answer is written by the worker: a client that reads it slowly holds that worker until
the answer's own deadline (`write_deadline`, 30 s), not for as long as it keeps reading.
The selector's thread never waits for a worker: 280 clients that pipelined `GET /metrics`
and read nothing held every worker in its write and filled their queue, and cheroot's put
waited there for room: /-/healthy timed out at 15 s. A connection that finds the queue
full is turned away (503 when its socket takes it at once, counted, logged); a stop gives
the answers being written one second, not their write deadline.
"""
from __future__ import annotations

import _pyio
import _socket
import errno
import io
import json
import logging
import queue
import socket
import ssl
import threading
import time

from cheroot import connections as cheroot_connections, server as cheroot_server, wsgi
from cheroot.makefile import MakeFile, StreamReader, StreamWriter
from cheroot.ssl import Adapter

from ..config.reader import ConfigError
from . import immediate
from .deadlines import Deadlines
from .webconfig import TLSContexts, WebSecurity

log = logging.getLogger(__name__)


class _TLSAdapter(Adapter):
    """Wraps an accepted socket, without reading from it, with the web config's context of
    the moment (its files are re-read when they change; a reload swaps `contexts`)."""

    def __init__(self, contexts: TLSContexts):
        super().__init__(contexts.config.cert_file, contexts.config.key_file)
        self.contexts = contexts

    def bind(self, sock):
        return sock

    def wrap(self, sock):
        return self.contexts.current().wrap_socket(sock, server_side=True, do_handshake_on_connect=False), {}

    def get_environ(self, sock):
        name, protocol, _ = sock.cipher()
        return {"wsgi.url_scheme": "https", "HTTPS": "on", "SSL_PROTOCOL": protocol, "SSL_CIPHER": name}

    def makefile(self, sock, mode="r", bufsize=io.DEFAULT_BUFFER_SIZE):
        return MakeFile(sock, mode, bufsize)


WAIT, SERVE, REFUSE, CLOSE = "wait", "serve", "refuse", "close"
KEEP, REST = "keep", "rest"  # answered at once: the connection waits for its next request; a worker writes the rest
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _answer(status: str, message: str, json_body: bool = False) -> bytes:
    """An answer and the connection's end; JSON under /api/, as the app answers there."""
    body, ctype = message.encode(), "text/plain"
    if json_body:
        body, ctype = (json.dumps({"error": message}) + "\n").encode(), "application/json"
    return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


_PLAIN_HTTP_ANSWER = _answer("400 Bad Request", "The client sent a plain HTTP request, but this port speaks HTTPS")


def request_state(data: bytes | bytearray, max_head: int, max_body: int, scanned: int = 0) -> tuple[str, bytes, int]:
    """What the bytes read so far hold. (SERVE, b"", n) a whole request, or a head over
    its limit, which a worker refuses from what is here; (WAIT, b"", n) more is coming,
    or (WAIT, 100 Continue, n) when the client waits for that before its body; (REFUSE,
    answer, 0) a body that cannot be read ahead (chunked, over `max_body`, without a
    valid length), answered and closed without a worker.
    n is the length of the whole request once its head is in (0 before): the caller
    waits for that many bytes without parsing the head again. The search for the head's
    end starts at `scanned`, where the previous one stopped."""
    end = data.find(b"\r\n\r\n", max(0, scanned - 3))
    if end < 0 or end > max_head:
        return (SERVE if len(data) > max_head else WAIT), b"", 0
    lines = bytes(data[:end]).split(b"\r\n")
    request_line = lines[1 if not lines[0] and len(lines) > 1 else 0].split(b" ")  # cheroot skips one empty line first
    api = len(request_line) > 1 and request_line[1].startswith(b"/api/")
    lengths, chunked, expect = set(), False, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if name == b"transfer-encoding":
            chunked = True
        elif name == b"content-length":
            lengths.add(value)
        elif name == b"expect":
            expect = value.lower() == b"100-continue"
    length = next(iter(lengths)) if len(lengths) == 1 else b"0"
    if chunked:
        return REFUSE, _answer("411 Length Required", "a request body needs a Content-Length", api), 0
    if len(lengths) > 1 or not length.isdigit():
        return REFUSE, _answer("400 Bad Request", "one Content-Length of digits is required", api), 0
    if int(length) > max_body:
        return REFUSE, _answer("413 Payload Too Large", f"body over {max_body} bytes", api), 0
    need = end + 4 + int(length)
    if len(data) >= need:
        return SERVE, b"", need
    return WAIT, _CONTINUE if expect else b"", need


class _ReadAheadIO(socket.SocketIO):
    """The socket as a worker reads it: first what was read ahead, then the socket."""

    def __init__(self, sock):
        super().__init__(sock, "rb")
        self.pending = bytearray()

    def readinto(self, b):
        if self.pending:
            n = min(len(b), len(self.pending))
            b[:n] = self.pending[:n]
            del self.pending[:n]
            return n
        return super().readinto(b)


class _ReadAheadReader(StreamReader):
    def __init__(self, sock, bufsize):
        self.io = _ReadAheadIO(sock)  # not StreamReader.__init__, which makes a SocketIO of its own
        _pyio.BufferedReader.__init__(self, self.io, bufsize)
        self.bytes_read = 0

    def take_back(self) -> bytearray:
        """Everything read from the socket that no request has consumed (a pipelined
        request after the one a worker answered), as the pending bytes."""
        if self.has_data():
            self.io.pending[:0] = self.read1(self.buffer_size)  # the buffered bytes, no read of the socket
        return self.io.pending


class _Writer(StreamWriter):
    """Sends each write (an answer's head, then its body) from a view of it: cheroot's
    writer copies the answer into a buffer and copies what is left of it again at every
    partial send, so a /metrics answer of a few hundred KiB to a scraper that reads it in
    pieces was copied again and again. Each send still waits at most the socket's timeout."""

    def write(self, b):
        self._checkClosed()
        with self._write_lock:
            if self._write_buf:
                self._flush_unlocked()
            sock, view = self.raw._sock, memoryview(b).cast("B")
            while view:
                view = view[sock.send(view):]
        self.bytes_written += len(b)
        return len(b)


class _DeadlineRequest(cheroot_server.HTTPRequest):
    def respond(self):
        try:
            has_body = self.chunked_read or int(self.inheaders.get(b"Content-Length", 0) or 0) > 0
        except ValueError:
            has_body = True
        if not has_body:  # the head is in: what remains is our answer and the client's reading of it
            self.server.deadlines.arm(id(self.conn), self.conn.socket, self.server.write_deadline)
        super().respond()


class _Connection(cheroot_server.HTTPConnection):
    RequestHandlerClass = _DeadlineRequest
    waited = False  # it has waited in the selector for its first bytes
    _handshaken = False
    # the request being read: the bytes searched for its head's end; its whole length once its head is in
    _scanned, _need = 0, 0
    _unsent: list[memoryview] | None = None  # an answer given at once that the socket's buffer did not all take
    _close_after = False

    def __init__(self, server, sock, makefile=MakeFile):
        def files(s, mode, bufsize):
            return _ReadAheadReader(s, bufsize) if "r" in mode else _Writer(s, mode, bufsize)
        super().__init__(server, sock, files)

    @property
    def started(self) -> bool:
        """Part of a request (or of the TLS handshake before it) is in."""
        return bool(self.rfile.io.pending) or (isinstance(self.socket, ssl.SSLSocket) and not self._handshaken)

    def read_ahead(self) -> str:
        """Reads what the client has sent, never waiting for more: SERVE once a whole
        request is here, WAIT for the rest, CLOSE when the client left or broke TLS."""
        pending = self.rfile.take_back()
        sock, eof = self.socket, False
        try:
            sock.settimeout(0.0)
            if isinstance(sock, ssl.SSLSocket) and not self._handshaken:
                handshake = self._handshake(sock)
                if handshake is not None:
                    return handshake
            limit = self.server.max_request_header_size + self.server.max_request_body_size + 4  # a whole request at most
            while len(pending) <= limit:
                try:
                    chunk = sock.recv(65536)
                except (ssl.SSLWantReadError, BlockingIOError):
                    break
                if not chunk:
                    eof = True
                    break
                pending += chunk
        except OSError as exc:  # ssl.SSLError too; SSLWantWriteError: a client that does not read
            log.debug("connection from %s ended while reading its request: %s", self.remote_addr, exc)
            return CLOSE
        finally:
            try:
                sock.settimeout(self.server.timeout)
            except OSError:
                pass
        if self._need:  # its head was read before: only more of its body came
            state, answer = (SERVE if len(pending) >= self._need else WAIT), b""
        else:
            state, answer, self._need = request_state(pending, self.server.max_request_header_size,
                                                      self.server.max_request_body_size, self._scanned)
            self._scanned = len(pending)
        if state == REFUSE:
            self._send_now(answer)
            return CLOSE
        if state == SERVE:
            self._scanned, self._need = 0, 0
            return SERVE
        if eof:
            return CLOSE
        if answer:  # 100 Continue, once: the head is parsed once
            self._send_now(answer)
        return WAIT

    def _handshake(self, sock: ssl.SSLSocket) -> str | None:
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            return WAIT
        except ssl.SSLWantWriteError:
            # our first flight fits an empty socket buffer: a client that does not read it is not one we serve
            return CLOSE
        except ssl.SSLError as exc:
            if "http request" in str(exc).lower():  # plain HTTP to our TLS port: say so in plain HTTP
                try:
                    _socket.socket.send(sock, _PLAIN_HTTP_ANSWER)
                except OSError:
                    pass
            log.debug("TLS handshake with %s failed: %s", self.remote_addr, exc)
            return CLOSE
        self._handshaken = True
        self.ssl_env = self.server.ssl_adapter.get_environ(sock)
        return None

    def _send_now(self, data: bytes) -> None:
        """A short answer from the selector's thread: it fits the socket's buffer, or is dropped."""
        try:
            self.socket.send(data)
        except OSError:
            pass

    def answer_at_once(self) -> str | None:
        """The whole request in hand answered from this (the selector's) thread when it is
        simple and its answer ready (immediate.py): KEEP, CLOSE, or REST (a worker writes what
        the socket's buffer did not take); None leaves it to a worker."""
        answer_now = self.server.answer_now
        if answer_now is None or isinstance(self.socket, ssl.SSLSocket) or not self.socket.gettimeout():
            return None  # gettimeout: a socket without a timeout is blocking, and a write could wait
        pending = self.rfile.io.pending
        if len(pending) > self.server.max_request_header_size:
            return None  # a head over the limit: a worker refuses it
        environ = immediate.simple_request(bytes(pending))
        if environ is None:
            return None
        try:
            answer = answer_now(environ)
            if answer is None:
                return None
            status, headers, chunks = answer
            close = immediate.wants_close(environ) or not self.server.can_add_keepalive_connection
            head = immediate.response_head(status, headers, close, self.server.server_name)
        except Exception:  # noqa: BLE001 - a worker answers it the long way, and logs what fails there
            log.debug("answering %s at once failed", environ.get("PATH_INFO"), exc_info=True)
            return None
        pending.clear()
        self.requests_seen += 1
        try:
            unsent = immediate.send_now(self.socket.fileno(), [head, *chunks])
        except OSError as exc:
            log.debug("connection from %s ended while answering it: %s", self.remote_addr, exc)
            return CLOSE
        if unsent:
            self._unsent, self._close_after = unsent, close
            return REST
        return CLOSE if close else KEEP

    def _send_rest(self) -> bool:
        unsent, self._unsent = self._unsent or [], None
        self.server.deadlines.arm(id(self), self.socket, self.server.write_deadline)
        try:
            for chunk in unsent:
                self.socket.sendall(chunk)
        except OSError as exc:
            log.debug("connection from %s ended while reading its answer: %s", self.remote_addr, exc)
            return False
        finally:
            self.server.deadlines.disarm(id(self))
        return not self._close_after

    def communicate(self):
        if self._unsent is not None:
            return self._send_rest()
        # a backstop: the request is in, so the worker waits on the client only for a body over what is read ahead
        self.server.deadlines.arm(id(self), self.socket, self.server.read_deadline)
        try:
            return super().communicate()
        finally:
            self.server.deadlines.disarm(id(self))


# accept() failing for want of a file descriptor or kernel memory: the listening socket
# stays readable, so cheroot's loop retried at once, a core spinning and a traceback
# logged each time (570,000 in 3 s with the fd limit reached)
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class _Accepts(cheroot_connections.ConnectionManager):
    """cheroot's connection manager, which waits before the next accept() when one fails
    for want of resources, as Go's net/http does: 5 ms, doubling to 100 ms (not Go's 1 s:
    this thread also reads the other connections ahead), back to none after a success; a
    warning at most every 10 s says why new clients wait."""

    def __init__(self, server, clock=time.monotonic, sleep=time.sleep):
        super().__init__(server)
        self.clock, self.sleep = clock, sleep
        self.backoff = 0.0
        self.failed = 0
        self._warned_at: float | None = None

    def _from_server_socket(self, server_socket):
        try:
            conn = super()._from_server_socket(server_socket)
        except OSError as exc:
            if exc.errno not in _OUT_OF_RESOURCES:
                raise
            self.failed += 1
            self.backoff = min(0.1, self.backoff * 2 or 0.005)
            now = self.clock()
            if self._warned_at is None or now - self._warned_at >= 10.0:
                self._warned_at = now
                log.warning("cannot accept a connection: %s (%d failed accepts so far); new clients wait, "
                            "the open ones are served; raise the file limit (ulimit -n) or find who holds them",
                            exc.strerror or exc, self.failed)
            self.sleep(self.backoff)
            return None
        self.backoff = 0.0
        return conn


class _Server(wsgi.Server):
    """A new connection first waits in the selector, like an idle keep-alive one; each time
    it has bytes, the selector's thread reads them (`read_ahead`), and a worker gets it
    only with a whole request in hand. The selector closes one that never sends after
    `timeout`; the deadlines end one whose request is not whole in `read_deadline`."""

    ConnectionClass = _Connection
    turned_away = 0  # connections closed because the workers' queue was full
    answer_now = None  # environ -> (status, headers, chunks) or None: the app's answers ready at once
    deadlines: Deadlines
    read_deadline: float
    write_deadline: float

    def prepare(self):
        super().prepare()
        cheroot_made, self._connections = self._connections, _Accepts(self)
        cheroot_made.close()  # its selector: nothing but the listening socket, which stays open

    def process_conn(self, conn):
        if not isinstance(conn, _Connection):
            return super().process_conn(conn)
        if not conn.waited:
            conn.waited = True
            return self._wait(conn)
        state = conn.read_ahead()
        if state == SERVE:
            self.deadlines.disarm(id(conn))
            answered = conn.answer_at_once()
            if answered == KEEP:
                return self._wait(conn)
            if answered == CLOSE:
                return conn.close()
            return self._to_worker(conn)  # not answered, or its rest to write
        if state == WAIT:
            if conn.started and not self.deadlines.armed(id(conn)):
                self.deadlines.arm(id(conn), conn.socket, self.read_deadline)
            return self._wait(conn)
        self.deadlines.disarm(id(conn))
        conn.close()

    def _to_worker(self, conn) -> None:
        """To a worker, never waiting for room: cheroot's put waited up to `timeout` in this
        thread, which answers the probes, and clients that pipeline requests and read none
        (each worker in its write until the write deadline) kept the queue full: /-/healthy
        timed out. One that finds it full is told 503 if it takes that at once, and closed."""
        try:
            self.requests.put(conn)  # accepted_queue_timeout=0: Full at once
        except queue.Full:
            self.turned_away += 1
            if self.turned_away == 1 or self.turned_away % 1000 == 0:
                log.warning("every worker is busy and their queue full: turned away %s (%d so far); clients that send "
                            "requests and read no answer hold workers until the write deadline",
                            conn.remote_addr, self.turned_away)
            if conn._unsent is None:
                conn._send_now(_answer("503 Service Unavailable", "every worker is busy"))
            conn.close()

    def put_conn(self, conn):
        """A kept-alive connection after its answer: its next request may be in already."""
        if self.ready:
            self.process_conn(conn)
        else:
            conn.close()

    def _wait(self, conn) -> None:
        manager = getattr(self, "_connections", None)
        if manager is None or not self.ready:
            conn.close()
            return
        manager.put(conn)


class _WithHeaders:
    """http_server_config.headers on every response, as exporter-toolkit sets them before
    its handler runs: a header the app sets itself (the status page's CSP) is the app's."""

    def __init__(self, app, headers: tuple[tuple[str, str], ...] = ()):
        self.app = app
        self.headers = headers

    def __call__(self, environ, start_response):
        extra = self.headers  # once: a reload swaps it
        if not extra:
            return self.app(environ, start_response)

        def respond(status, headers, exc_info=None):
            return start_response(status, self._with(headers, extra), exc_info)
        return self.app(environ, respond)

    def answer_now(self, environ):
        answer_now = getattr(self.app, "answer_now", None)
        answer = answer_now(environ) if answer_now is not None else None
        if answer is None:
            return None
        status, headers, chunks = answer
        return status, self._with(headers, self.headers), chunks

    @staticmethod
    def _with(headers, extra) -> list:
        own = {name.lower() for name, _ in headers}
        return list(headers) + [(k, v) for k, v in extra if k.lower() not in own]


class Server:
    """cheroot: a bounded pool of worker threads that each get a whole request, request
    and idle timeouts, a real listen backlog, TLS from the web config, IPv4 and IPv6.
    `timeout` bounds an idle connection and each of a worker's reads and writes;
    `read_deadline` bounds a whole request's handshake, head and body (a scraper sends
    its head in one packet; 5 s is generous on a busy network); `write_deadline` bounds
    the answer to a request without a body, our writing and the client's reading of it:
    a client that reads a large /metrics a few bytes at a time, never idle long enough
    for `timeout`, holds its worker that long at most (3x Prometheus's default scrape
    timeout; a request with a body stays under its `read_deadline`)."""

    def __init__(self, app, host: str, port: int, security: WebSecurity | None = None,
                 threads: int = 16, backlog: int = 1024, timeout: float = 10.0, read_deadline: float = 5.0,
                 write_deadline: float = 30.0, max_body: int = 64 * 1024):
        bind = (host or "0.0.0.0", port)
        self.app = _WithHeaders(app, security.headers if security is not None else ())
        self.httpd = _Server(bind, self.app, numthreads=threads, max=threads, request_queue_size=backlog,
                             timeout=int(max(1, timeout)), shutdown_timeout=1, accepted_queue_size=threads * 16,
                             accepted_queue_timeout=0)  # the selector's thread never waits for a worker
        self.httpd.server_name = "vllm-prefix-cache-exporter"
        self.httpd.max_request_header_size = 64 * 1024
        self.httpd.max_request_body_size = max_body
        self.httpd.read_deadline = read_deadline
        self.httpd.write_deadline = write_deadline
        self.httpd.answer_now = self.app.answer_now
        if security is not None and security.tls is not None:
            self.httpd.ssl_adapter = _TLSAdapter(TLSContexts(security.tls))
        self.httpd.prepare()  # binds now, so a busy port fails at build time
        self.httpd.deadlines = Deadlines()
        self._thread = threading.Thread(target=self.httpd.serve, name="http", daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.bind_addr[1]

    @property
    def tls(self) -> bool:
        return self.httpd.ssl_adapter is not None

    def secure(self, security: WebSecurity | None) -> None:
        """A reloaded web config: its TLS settings from the next connection on, its headers
        from the next response. Raises ConfigError, changing nothing, for what needs a
        restart (TLS on or off: the port's protocol) or files that no longer load."""
        wants_tls = security is not None and security.tls is not None
        if wants_tls != self.tls:
            raise ConfigError([f"tls_server_config: turning TLS {'on' if wants_tls else 'off'} needs a restart"])
        contexts = None
        if wants_tls:
            try:
                contexts = TLSContexts(security.tls)
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError([f"tls_server_config: cannot load the certificate, key or client CAs: {exc}"]) from None
        self.app.headers = security.headers if security is not None else ()
        if contexts is not None:
            self.httpd.ssl_adapter.contexts = contexts

    def start(self) -> "Server":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Also for a server built and never started: prepare() started its workers. The
        answers being written get a second (cheroot's stop queued its workers' end behind
        every waiting connection, each held to its write deadline by a client not reading)."""
        self.httpd.deadlines.cap(1.0)
        self.httpd.stop()
        self.httpd.deadlines.stop()
        if self._thread.ident is not None:
            self._thread.join(5.0)
