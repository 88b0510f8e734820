"""Answers given by the server's selector thread (exporter/serve/immediate.py): what counts
as a simple request, that such answers need no worker and match what a worker sends, and
everything else (a body, a pipelined request, a password to check with bcrypt, an answer
the socket's buffer does not take at once) still answered whole, by a worker."""
import gzip
import socket
import threading

import bcrypt
import pytest
import requests
from prometheus_client import CollectorRegistry, ProcessCollector

from exporter.serve.app import App
from exporter.serve.immediate import response_head, send_now, simple_request, wants_close
from exporter.serve.server import Server
from exporter.serve.state import State
from exporter.serve.webconfig import WebSecurity


def test_a_simple_request_gives_the_environ_a_worker_would():
    environ = simple_request(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\n"
                             b"accept-encoding:  br \r\nAuthorization: Basic eDp5\r\n\r\n")
    assert environ == {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "x=1", "SERVER_PROTOCOL": "HTTP/1.1",
                       "HTTP_HOST": "a", "HTTP_ACCEPT_ENCODING": "gzip, br", "HTTP_AUTHORIZATION": "Basic eDp5"}
    assert simple_request(b"HEAD /-/healthy HTTP/1.1\r\n\r\n")["REQUEST_METHOD"] == "HEAD"


@pytest.mark.parametrize("data", [
    pytest.param(b"GET /metrics HTTP/1.1\r\nHost: a\r\n", id="head-without-its-end"),
    pytest.param(b"GET /metrics HTTP/1.0\r\n\r\n", id="http-1.0"),
    pytest.param(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", id="post"),
    pytest.param(b"GET /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nab", id="a-body"),
    pytest.param(b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", id="chunked"),
    pytest.param(b"GET /metrics HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", id="expect"),
    pytest.param(b"GET /metrics HTTP/1.1\r\n\r\nGET /-/ready HTTP/1.1\r\n\r\n", id="pipelined"),
    pytest.param(b"GET /m%65trics HTTP/1.1\r\n\r\n", id="percent-encoded"),
    pytest.param(b"GET http://a/metrics HTTP/1.1\r\n\r\n", id="absolute-form"),
    pytest.param(b"GET /metrics HTTP/1.1\r\nX: a\r\n  folded\r\n\r\n", id="obsolete-folding"),
    pytest.param(b"GET /metrics HTTP/1.1\r\nHost : a\r\n\r\n", id="space-before-colon"),
    pytest.param(b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", id="no-colon"),
    pytest.param(b"GET  /metrics HTTP/1.1\r\n\r\n", id="two-spaces"),
    pytest.param(b"GET /m\xe9trics HTTP/1.1\r\n\r\n", id="not-ascii"),
])
def test_anything_else_is_left_to_a_worker(data):
    assert simple_request(data) is None


def test_connection_close_is_a_token_of_the_connection_field():
    assert wants_close({"HTTP_CONNECTION": "keep-alive, Close"})
    assert not wants_close({"HTTP_CONNECTION": "closer"}) and not wants_close({})


def test_the_head_says_close_only_when_the_connection_ends():
    head = response_head("200 OK", [("Content-Length", "3")], True, "s").decode()
    assert head.startswith("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\nDate: ")
    assert head.endswith("\r\nServer: s\r\n\r\n")
    assert "Connection" not in response_head("200 OK", [], False, "s").decode()


def test_what_the_sockets_buffer_does_not_take_is_returned_to_send_later():
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(5)
        big = b"x" * (16 << 20)
        left = send_now(a.fileno(), [b"head", b"", big])
        assert left and sum(len(v) for v in left) < len(big) + 4
        assert bytes(left[-1]) == big[len(big) - len(left[-1]):]


def _hold(entered: threading.Event, release: threading.Event):
    """A handler that holds its worker until `release`."""
    def handler(env):
        entered.set()
        release.wait(20)
        return 200, "text/plain", b"held\n"
    return handler


@pytest.fixture
def held():
    """A server with one worker, held by a request, and its runtime registry."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    app = App(State(), registry)
    app.route("GET", "/healthy-by-a-worker", lambda env: (200, "text/plain", b"Healthy.\n"))
    entered, release = threading.Event(), threading.Event()
    app.route("GET", "/hold", _hold(entered, release))
    server = Server(app, "127.0.0.1", 0, threads=1).start()
    holder = threading.Thread(target=lambda: requests.get(f"http://127.0.0.1:{server.port}/hold", timeout=30))
    holder.start()
    assert entered.wait(10)
    yield server, app, release
    release.set()
    holder.join(30)
    server.stop()


def test_metrics_and_probes_are_answered_while_every_worker_is_busy(held):
    server, app, release = held
    base = f"http://127.0.0.1:{server.port}"
    with requests.Session() as session:
        for _ in range(3):  # on one kept-alive connection
            metrics = session.get(base + "/metrics", timeout=5)
            assert metrics.status_code == 200 and b"process_cpu_seconds_total" in metrics.content
            assert session.get(base + "/-/healthy", timeout=5).text == "Healthy.\n"
        assert session.head(base + "/metrics", timeout=5).headers["Content-Length"] == metrics.headers["Content-Length"]
        zipped = session.get(base + "/metrics", headers={"Accept-Encoding": "gzip"}, stream=True, timeout=5)
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert b"# TYPE process_cpu_seconds_total counter" in gzip.decompress(zipped.raw.read())
    with pytest.raises(requests.Timeout):  # a route that needs the worker waits for it
        requests.get(base + "/healthy-by-a-worker", timeout=0.5)
    release.set()
    assert requests.get(base + "/healthy-by-a-worker", timeout=5).text == "Healthy.\n"


def test_an_answer_given_at_once_has_the_head_a_worker_gives():
    app = App(State(), CollectorRegistry())
    app.route("GET", "/healthy-by-a-worker", lambda env: (200, "text/plain", b"Healthy.\n"))
    server = Server(app, "127.0.0.1", 0, security=WebSecurity(headers=(("X-Frame-Options", "deny"),))).start()
    try:
        def head(path: str) -> list[str]:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
            return sorted(line for line in out.split(b"\r\n\r\n")[0].decode().split("\r\n")[1:] if not line.startswith("Date:"))
        assert head("/-/healthy") == head("/healthy-by-a-worker")
        assert "X-Frame-Options: deny" in head("/-/healthy") and "Connection: close" in head("/-/healthy")
    finally:
        server.stop()


def test_a_password_is_checked_by_a_worker_once_then_remembered(held):
    server, app, release = held
    app.secure(WebSecurity(users=(("alice", bcrypt.hashpw(b"secret", bcrypt.gensalt(4))),)))
    base = f"http://127.0.0.1:{server.port}"
    with pytest.raises(requests.Timeout):  # never verified: bcrypt runs on a worker, and the only one is held
        requests.get(base + "/metrics", auth=("alice", "secret"), timeout=0.5)
    release.set()
    assert requests.get(base + "/metrics", auth=("alice", "wrong"), timeout=5).status_code == 401
    assert requests.get(base + "/metrics", auth=("alice", "secret"), timeout=5).status_code == 200
    entered, hold_again = threading.Event(), threading.Event()
    app.routes[("GET", "/hold")] = _hold(entered, hold_again)
    holder = threading.Thread(target=lambda: requests.get(base + "/hold", auth=("alice", "secret"), timeout=30))
    holder.start()
    try:
        assert entered.wait(10)
        assert requests.get(base + "/metrics", auth=("alice", "secret"), timeout=5).status_code == 200  # remembered: at once
        with pytest.raises(requests.Timeout):
            requests.get(base + "/metrics", auth=("alice", "wrong"), timeout=0.5)
    finally:
        hold_again.set()
        holder.join(30)


def test_an_answer_larger_than_the_sockets_buffer_is_finished_by_a_worker_and_the_connection_kept():
    app = App(State(), CollectorRegistry())
    body = bytes(range(256)) * (16 << 10)  # 4 MiB
    app.route("GET", "/metrics", lambda env: (200, "text/plain", body))
    server = Server(app, "127.0.0.1", 0).start()
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            s.settimeout(10)
            s.connect(("127.0.0.1", server.port))
            for _ in range(2):
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                out = bytearray()
                while len(out) < len(body) + 4 or b"\r\n\r\n" not in out[:4096]:
                    chunk = s.recv(1 << 16)
                    assert chunk, "the connection ended before the whole answer"
                    out += chunk
                head, _, rest = bytes(out).partition(b"\r\n\r\n")
                while len(rest) < len(body):
                    chunk = s.recv(1 << 16)
                    assert chunk, "the connection ended before the whole answer"
                    rest += chunk
                assert f"Content-Length: {len(body)}".encode() in head and rest == body
    finally:
        server.stop()


def test_a_connection_that_asks_to_close_is_closed_after_its_answer():
    server = Server(App(State(), CollectorRegistry()), "127.0.0.1", 0).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            out = b""
            while chunk := s.recv(65536):  # to the end the server makes (a timeout fails the test)
                out += chunk
        assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"Healthy.\n")
    finally:
        server.stop()


def test_an_answer_kept_gzipped_only_is_gunzipped_by_a_worker_for_a_plain_scrape():
    """Over `plain_up_to` (150-210 MB at 10,000 pods) /metrics keeps its answer gzipped only: a
    gzip scrape is still answered at once while the only worker is busy, a plain one waits
    for the worker, which gunzips it, and both carry the same text."""
    from exporter.serve.collector import PrefixCacheCollector

    state = State()
    app = App(state, CollectorRegistry(), collector=PrefixCacheCollector(state, ["1m"]))
    app.exposition.plain_up_to = 100
    state.update(config_reload_success=False)  # a change: its render is kept gzipped only
    entered, release = threading.Event(), threading.Event()
    app.route("GET", "/hold", _hold(entered, release))
    server = Server(app, "127.0.0.1", 0, threads=1).start()
    base = f"http://127.0.0.1:{server.port}"
    holder = None
    try:
        def scrape(encoding: str, timeout: float = 5) -> requests.Response:
            return requests.get(base + "/metrics", headers={"Accept-Encoding": encoding}, stream=True, timeout=timeout)
        first = scrape("gzip")  # waits for the render (on the worker, still free)
        assert first.headers["Content-Encoding"] == "gzip"
        text = gzip.decompress(first.raw.read())
        assert b"prefixcache_config_last_reload_successful 0.0" in text
        holder = threading.Thread(target=lambda: requests.get(base + "/hold", timeout=30))
        holder.start()
        assert entered.wait(10)
        assert gzip.decompress(scrape("gzip").raw.read()) == text  # at once, by the selector's thread
        with pytest.raises(requests.Timeout):
            scrape("identity", timeout=0.5).content  # to be gunzipped: it waits for the worker
        release.set()
        plain = scrape("identity")
        assert "Content-Encoding" not in plain.headers and plain.content == text
    finally:
        release.set()
        if holder is not None:
            holder.join(30)
        server.stop()
