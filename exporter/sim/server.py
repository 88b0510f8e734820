"""Simulated vLLM replicas served over HTTP on 127.0.0.1: /<name>/metrics and the /tokenize, /detokenize
endpoints `diagnose` and `whatif --target` use, each replica on the clock the caller gives."""
from __future__ import annotations

import json
import socket
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Sequence

from .simulator import Replica


class Fleet:
    """Replicas served by one HTTP server on 127.0.0.1: `/<name>/metrics`, and `/metrics`
    too when there is a single replica."""

    def __init__(self, replicas: Sequence[Replica], clock, host: str = "127.0.0.1", port: int = 0, kv_events: bool = False):
        self.replicas = {r.name: r for r in replicas}
        self.clock = clock
        # each replica's KV events on a ZeroMQ PUB socket of its own, bound as vLLM binds tcp://*:PORT
        self.kv_ports: dict[str, int] = {}
        self._kv = KVPublisher(self) if kv_events else None
        for r in replicas:
            self._publish_kv(r)
        self.down: set[str] = set()
        self.received: list[tuple[str, str, dict]] = []  # (replica, endpoint, JSON body) of every POST
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep the demo console clean
                pass

            def do_GET(self):
                fleet._handle(self)

            def do_POST(self):
                fleet._handle(self)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="simulator", daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def metrics_url(self, name: str) -> str:
        return self.url(name) + "/metrics"

    def kv_endpoint(self, name: str) -> str:
        return f"tcp://127.0.0.1:{self.kv_ports[name]}"

    def _publish_kv(self, replica: Replica) -> None:
        if self._kv is not None:
            replica.kv_events = deque(maxlen=KV_EVENTS_KEPT)
            self.kv_ports[replica.name] = _free_port()

    def add(self, replica: Replica) -> None:
        """A new pod: served from now on under its name."""
        self._publish_kv(replica)
        self.replicas = {**self.replicas, replica.name: replica}

    def remove(self, name: str) -> None:
        """A pod gone: 404 from now on."""
        self.replicas = {n: r for n, r in self.replicas.items() if n != name}

    def start(self) -> "Fleet":
        self._thread.start()
        if self._kv is not None:
            self._kv.start()
        return self

    def stop(self) -> None:
        if self._kv is not None:
            self._kv.stop()
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        parts = req.path.split("?", 1)[0].strip("/").split("/")
        if parts[0] not in self.replicas and len(self.replicas) == 1:
            parts = [next(iter(self.replicas))] + parts
        replica = self.replicas.get(parts[0]) if len(parts) >= 2 else None
        if replica is None:
            return _reply(req, 404, b"not found\n", "text/plain")
        if replica.name in self.down:
            return _reply(req, 503, b"replica is down\n", "text/plain")
        endpoint = "/".join(parts[1:])
        if endpoint == "metrics" and req.command == "GET":
            replica.advance(self.clock())
            return _reply(req, 200, replica.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
        if endpoint == "health" and req.command == "GET":
            return _reply(req, 200, b"", "text/plain")
        if req.command == "POST" and endpoint in ("v1/chat/completions", "tokenize", "detokenize"):
            try:
                body = json.loads(req.rfile.read(int(req.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError:
                return _reply(req, 400, b'{"error": "body is not JSON"}', "application/json")
            if not isinstance(body, dict):
                return _reply(req, 400, b'{"error": "body must be an object"}', "application/json")
            self.received.append((replica.name, endpoint, body))
            if endpoint == "tokenize":
                if "messages" in body:
                    tokens = replica.render_chat(body, bool(body.get("add_generation_prompt", True)))
                else:
                    tokens = replica.tokenizer.encode(str(body.get("prompt", "")))
                answer = {"count": len(tokens), "max_model_len": 32768, "tokens": tokens}
            elif endpoint == "detokenize":
                answer = {"prompt": replica.tokenizer.decode([int(t) for t in body.get("tokens", [])])}
            else:
                replica.advance(self.clock())
                answer = replica.serve_chat(body, self.clock())
            return _reply(req, 200, json.dumps(answer).encode(), "application/json")
        return _reply(req, 404, b"not found\n", "text/plain")


KV_EVENTS_KEPT = 512  # requests' stored blocks a replica keeps until they are published


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KVPublisher:
    """Publishes every replica's stored blocks as vLLM 0.32 does: [topic, sequence, msgpack
    EventBatch], a batch a replica every PERIOD seconds. Its sockets live on its thread."""

    PERIOD = 0.25

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="simulator kv events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        import msgpack
        import zmq

        ctx = zmq.Context()
        sockets, seq = {}, {}
        try:
            while not self._stop.wait(self.PERIOD):
                for name, replica in list(self.fleet.replicas.items()):
                    if name not in sockets and name in self.fleet.kv_ports:
                        sockets[name] = ctx.socket(zmq.PUB)
                        sockets[name].bind(self.fleet.kv_endpoint(name))
                        seq[name] = 0
                    events = replica.kv_events
                    if name not in sockets or not events:
                        continue
                    with replica.lock:
                        batch = [events.popleft() for _ in range(len(events))]
                    sockets[name].send_multipart([b"kv", seq[name].to_bytes(8, "big"),
                                                  msgpack.packb([self.fleet.clock(), batch, 0])])
                    seq[name] += 1
        finally:
            ctx.destroy(linger=0)


def _reply(req: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    req.send_response(status)
    req.send_header("Content-Type", content_type)
    req.send_header("Content-Length", str(len(body)))
    req.end_headers()
    req.wfile.write(body)


# --- recordings without a server ----------------------------------------------------------
