import gzip
import io
import json

import pytest
from prometheus_client import CollectorRegistry

from exporter.collector import PrefixCacheCollector
from exporter.config import Target
from exporter.http import App
from exporter.state import State, TargetView

from helpers import simulated_state


def call(app, method, path, headers=None, body=b""):
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))}
    environ.update(headers or {})
    out = {}

    def start_response(status, hdrs):
        out["status"], out["headers"] = status, dict(hdrs)
    body = b"".join(app(environ, start_response))
    return int(out["status"].split()[0]), out["headers"], body


@pytest.fixture
def app():
    state = simulated_state()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m", "5m"]))
    return App(state, registry)


def test_metrics(app):
    status, headers, body = call(app, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert b"prefixcache_hit_ratio{" in body


def test_metrics_gzip(app):
    status, headers, body = call(app, "GET", "/metrics", {"HTTP_ACCEPT_ENCODING": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert b"prefixcache_target_up" in gzip.decompress(body)


def test_healthy_and_landing(app):
    assert call(app, "GET", "/-/healthy")[0] == 200
    status, headers, body = call(app, "GET", "/")
    assert status == 200 and b'href="/metrics"' in body and b"vllm-0" in body


def test_ready_once_every_target_was_polled():
    state = State()
    state.set_targets([TargetView(target=Target("a", "http://127.0.0.1:1/metrics"))])
    app = App(state, CollectorRegistry())
    status, _, body = call(app, "GET", "/-/ready")
    assert status == 503 and b"Not ready" in body
    view = state.target("a")
    from dataclasses import replace
    state.publish(replace(view, polled=True, up=False))  # a failed poll still counts
    assert call(app, "GET", "/-/ready")[0] == 200


def test_status_json(app):
    status, headers, body = call(app, "GET", "/api/v1/status")
    assert status == 200 and headers["Content-Type"] == "application/json"
    data = json.loads(body)
    (up,) = [t for t in data["targets"] if t["name"] == "vllm-0"]
    window = up["models"]["demo/llama-3-8b"]["1m"]
    assert window["hit_ratio"] < 0.1 and window["ttft_seconds"]["0.99"] > 0
    (down,) = [t for t in data["targets"] if t["name"] == "vllm-down"]
    assert down["up"] is False and down["last_error"] == "connection refused"


@pytest.mark.parametrize("method, path, status", [
    pytest.param("GET", "/nope", 404, id="unknown-path"),
    pytest.param("POST", "/metrics", 405, id="wrong-method"),
    pytest.param("DELETE", "/", 405, id="delete-landing"),
])
def test_bad_requests(app, method, path, status):
    assert call(app, method, path)[0] == status


def test_head_has_no_body(app):
    status, headers, body = call(app, "HEAD", "/-/healthy")
    assert status == 200 and body == b""


def test_handler_bug_is_a_500_not_a_crash(app):
    app.route("GET", "/boom", lambda env: 1 / 0)
    assert call(app, "GET", "/boom")[0] == 500
