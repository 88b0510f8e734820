"""A local HTTP server whose paths answer in chosen bad ways, for scrape and poller tests."""
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    def __init__(self, routes, host="127.0.0.1", port=0):
        """routes: path -> callable(handler) that writes the whole response; `host` another
        loopback address (127.0.0.2) for a second server on the same port."""
        self.routes = routes
        self.requests = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out in two writes: with Nagle's algorithm the body waited
            # for the client's delayed ACK, 40 ms an answer on a kept-alive connection
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fake.requests.append((self.command, self.path, dict(self.headers), body))
                self.body = body
                route = fake.routes.get(self.path.split("?")[0])
                if route is None:
                    return reply(self, 404, b"no route\n")
                route(self)

            do_GET = do_POST = _any

        self.host = host
        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base(self):
        return f"http://{self.host}:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def reply(h, status, body, headers=()):
    h.send_response(status)
    for k, v in headers:
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def text(body: str, status=200):
    return lambda h: reply(h, status, body.encode(), [("Content-Type", "text/plain")])


def gzipped(body: str):
    data = gzip.compress(body.encode())
    return lambda h: reply(h, 200, data, [("Content-Encoding", "gzip")])


def slow(seconds: float, body: str = "vllm:x 1\n"):
    def handler(h):
        time.sleep(seconds)
        try:
            reply(h, 200, body.encode())
        except OSError:
            pass
    return handler


def endless_chunks(chunk: bytes, max_bytes: int):
    """A chunked body without Content-Length, bounded so the test always ends."""
    def handler(h):
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        sent = 0
        try:
            while sent < max_bytes:
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
            h.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client hung up once over its cap: what we want
    return handler


def drip(interval: float, count: int, headers_first: bool = True):
    """An answer that trickles one byte every `interval` seconds, `count` bytes in all
    (bounded, so the test ends): with headers_first the status line and headers come at
    once and the body drips; otherwise even the headers drip."""
    def handler(h):
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % count
        try:
            if headers_first:
                h.wfile.write(head)
                h.wfile.flush()
                payload = b"#" * count
            else:
                payload = head + b"#" * count
            for i in range(len(payload) if not headers_first else count):
                h.wfile.write(payload[i:i + 1])
                h.wfile.flush()
                time.sleep(interval)
        except OSError:
            pass  # the scraper hung up at its deadline: what we want
        h.close_connection = True
    return handler


# --- One server with a path per misbehaviour, for every outbound client ----------------------------
# A client is pointed at base + "/<behaviour>" and appends its own path (/api/v1/targets,
# /api/v1/query, /api/v2/alerts, /metrics): the first path segment picks the behaviour, so one
# server plays a misbehaving Prometheus, Alertmanager and vLLM at once. Every behaviour is
# bounded and ends when the server stops, so no test can hang on it.

BEHAVIOURS = ("drip", "drip-head", "silent", "endless", "redirect", "signin", "short", "badgzip", "ok")
JSON_OK = b'{"status":"success","data":{"resultType":"vector","result":[],"activeTargets":[],"droppedTargets":[]}}'


class MisbehavingServer(FakeServer):
    """paths: /drip (headers, then the body one byte a second), /drip-head (even the status line
    drips), /silent (headers, then nothing), /endless (a 200 chunked body that never ends, until
    the client hangs up or 4 GiB), /redirect (302 to /signin, an HTML sign-in page answering 200 to
    anything), /short (Content-Length larger than the body, then the connection closes), /badgzip
    (Content-Encoding: gzip over bytes that are not gzip), /ok (a small successful Prometheus API
    answer, also a 200 for an Alertmanager POST). `hits` counts requests per behaviour."""

    def __init__(self, ok_body: bytes = JSON_OK):
        self.stopping = threading.Event()
        self.hits: dict[str, int] = {}
        super().__init__({})
        stop = self.stopping

        def drip_body(h):
            # small enough for any size cap: only the deadline can cut it
            _raw(h, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
            _trickle(h, b"{" * 1000, stop)

        def drip_head(h):
            _trickle(h, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 100000, stop)

        def silent(h):
            _raw(h, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
            stop.wait(300)

        def endless(h):
            _raw(h, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b" " * 65536
            frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
            for _ in range(65536):  # 4 GiB at most: the client must hang up long before
                if stop.is_set() or not _raw(h, frame):
                    break

        def redirect(h):
            reply(h, 302, b"", [("Location", "/signin")])

        def signin(h):
            reply(h, 200, b"<html><body><form>Sign in</form></body></html>", [("Content-Type", "text/html")])

        def short(h):
            _raw(h, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + ok_body[:20])
            h.close_connection = True

        def badgzip(h):
            reply(h, 200, b"this is not gzip at all" * 10, [("Content-Type", "application/json"), ("Content-Encoding", "gzip")])

        def ok(h):
            reply(h, 200, ok_body, [("Content-Type", "application/json")])

        self.behaviours = {"drip": drip_body, "drip-head": drip_head, "silent": silent, "endless": endless,
                           "redirect": redirect, "signin": signin, "short": short, "badgzip": badgzip, "ok": ok}
        fake = self

        class Routes(dict):
            def get(self, path, default=None):
                name = path.lstrip("/").split("/", 1)[0]
                handler = fake.behaviours.get(name)
                if handler is None:
                    return default
                fake.hits[name] = fake.hits.get(name, 0) + 1
                return handler

        self.routes = Routes()

    def url(self, behaviour: str) -> str:
        assert behaviour in self.behaviours, behaviour
        return f"{self.base}/{behaviour}"

    def __exit__(self, *exc):
        self.stopping.set()
        super().__exit__(*exc)


def _raw(h, data: bytes) -> bool:
    try:
        h.wfile.write(data)
        h.wfile.flush()
        return True
    except OSError:
        h.close_connection = True
        return False


def _trickle(h, data: bytes, stop: threading.Event, interval: float = 1.0) -> None:
    """One byte every `interval` seconds until the client hangs up or the server stops."""
    for i in range(len(data)):
        if not _raw(h, data[i:i + 1]) or stop.wait(interval):
            break
    h.close_connection = True
