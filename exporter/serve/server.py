"""The threaded HTTP(S) server under the WSGI app: cheroot, with two changes that keep a
misbehaving client from holding the workers every scrape and probe needs.

- A new connection waits in the selector (costing no worker) until it has bytes to read,
  and with TLS its handshake runs then, on a worker, not on the one accept thread: a
  client that connects and stays silent holds nothing.
- Once a worker has a connection, the request gets one deadline for its TLS handshake,
  head and body together (cheroot's timeout is per read, so a client sending one header
  line every few seconds would hold a worker for as long as it likes)."""
from __future__ import annotations

import _socket
import io
import logging
import socket
import ssl
import threading
import time

from cheroot import server as cheroot_server, wsgi
from cheroot.makefile import MakeFile
from cheroot.ssl import Adapter

from ..config.reader import ConfigError
from .webconfig import TLSContexts, WebSecurity

log = logging.getLogger(__name__)


class _Deadlines:
    """One thread that ends the connections whose request is not in by its deadline:
    shutting the socket down wakes the worker blocked reading it, whatever that read is
    (a handshake, a header line, the body)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="http-deadlines", daemon=True)
        self._thread.start()

    def arm(self, key: int, sock: socket.socket, seconds: float) -> None:
        with self._cond:
            self._armed[key] = (self.clock() + seconds, sock)
            self._cond.notify()

    def disarm(self, key: int) -> None:
        # under the lock: once this returns the reaper never touches the socket again,
        # so it cannot shut down a later connection that reuses the file descriptor
        with self._cond:
            self._armed.pop(key, None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(2.0)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = self.clock()
                for key in [k for k, (deadline, _) in self._armed.items() if deadline <= now]:
                    _, sock = self._armed.pop(key)
                    try:
                        # the plain socket's shutdown, also under TLS: SSLSocket.shutdown
                        # would tear down the TLS object another thread is reading with
                        _socket.socket.shutdown(sock, socket.SHUT_RDWR)
                    except OSError:
                        pass
                wake = min((d for d, _ in self._armed.values()), default=now + 3600.0)
                self._cond.wait(max(0.0, wake - now))


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


_PLAIN_HTTP_ANSWER = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 64\r\n\r\n"
                      b"The client sent a plain HTTP request, but this port speaks HTTPS")


class _DeadlineRequest(cheroot_server.HTTPRequest):
    def respond(self):
        try:
            has_body = self.chunked_read or int(self.inheaders.get(b"Content-Length", 0) or 0) > 0
        except ValueError:
            has_body = True
        if not has_body:  # the head is in: what remains is ours to do, not the client's
            self.server.deadlines.disarm(id(self.conn))
        super().respond()


class _DeadlineConnection(cheroot_server.HTTPConnection):
    RequestHandlerClass = _DeadlineRequest
    _handshaken = False

    def communicate(self):
        self.server.deadlines.arm(id(self), self.socket, self.server.read_deadline)
        try:
            if isinstance(self.socket, ssl.SSLSocket) and not self._handshaken and not self._handshake():
                return False
            return super().communicate()
        finally:
            self.server.deadlines.disarm(id(self))

    def _handshake(self) -> bool:
        try:
            self.socket.do_handshake()
        except ssl.SSLError as exc:
            if "http request" in str(exc).lower():  # plain HTTP to our TLS port: say so in plain HTTP
                try:
                    _socket.socket.sendall(self.socket, _PLAIN_HTTP_ANSWER)
                except OSError:
                    pass
            log.debug("TLS handshake with %s failed: %s", self.remote_addr, exc)
            return False
        except OSError as exc:  # the client left, or missed the deadline
            log.debug("TLS handshake with %s did not complete: %s", self.remote_addr, exc)
            return False
        self._handshaken = True
        self.ssl_env = self.server.ssl_adapter.get_environ(self.socket)
        return True


class _Server(wsgi.Server):
    """cheroot hands a freshly accepted connection straight to a worker, which then
    blocks reading it: 300 clients that connect and send nothing hold every worker until
    they time out. Here a new connection first waits in the selector, like an idle
    keep-alive one, and reaches a worker only once it has bytes to read; the selector
    closes it after `timeout` if it never does."""

    ConnectionClass = _DeadlineConnection
    deadlines: _Deadlines
    read_deadline: float

    def process_conn(self, conn):
        manager = getattr(self, "_connections", None)
        if manager is not None and not getattr(conn, "_waited_for_bytes", False):
            conn._waited_for_bytes = True
            manager.put(conn)
            return
        super().process_conn(conn)


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
            own = {name.lower() for name, _ in headers}
            return start_response(status, list(headers) + [(k, v) for k, v in extra if k.lower() not in own], exc_info)
        return self.app(environ, respond)


class Server:
    """cheroot: a bounded pool of worker threads, request and idle timeouts, a real
    listen backlog, TLS from the web config, IPv4 and IPv6. `timeout` bounds each read
    and an idle connection; `read_deadline` bounds a whole request's handshake, head and
    body (a scraper sends its head in one packet; 5 s is generous on a busy network)."""

    def __init__(self, app, host: str, port: int, security: WebSecurity | None = None,
                 threads: int = 16, backlog: int = 1024, timeout: float = 10.0, read_deadline: float = 5.0):
        bind = (host or "0.0.0.0", port)
        self.app = _WithHeaders(app, security.headers if security is not None else ())
        self.httpd = _Server(bind, self.app, numthreads=threads, max=threads, request_queue_size=backlog,
                             timeout=int(max(1, timeout)), shutdown_timeout=1, accepted_queue_size=threads * 16,
                             accepted_queue_timeout=int(max(1, timeout)))
        self.httpd.server_name = "vllm-prefix-cache-exporter"
        self.httpd.max_request_header_size = 64 * 1024
        self.httpd.max_request_body_size = 1024 * 1024
        self.httpd.read_deadline = read_deadline
        if security is not None and security.tls is not None:
            self.httpd.ssl_adapter = _TLSAdapter(TLSContexts(security.tls))
        self.httpd.prepare()  # binds now, so a busy port fails at build time
        self.httpd.deadlines = _Deadlines()
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
        """Also for a server built and never started: prepare() started its workers."""
        self.httpd.stop()
        self.httpd.deadlines.stop()
        if self._thread.ident is not None:
            self._thread.join(5.0)
