"""A local HTTP server whose paths answer in chosen bad ways, for scrape and poller tests."""
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    def __init__(self, routes):
        """routes: path -> callable(handler) that writes the whole response."""
        self.routes = routes
        self.requests = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

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
