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


class Events:
    def __init__(self):
        self.added = []


@pytest.fixture
def deploy_app():
    from exporter.http import deploy_handlers
    state = simulated_state()
    events = Events()
    app = App(state, CollectorRegistry())
    post, get = deploy_handlers(state, events.added.append, lambda: "s3cret", lambda: {"vllm-0", "vllm-1"}, lambda: 1234.5)
    app.route("POST", "/api/v1/deploys", post)
    app.route("GET", "/api/v1/deploys", get)
    return app, events


def post(app, body, headers=None, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    h = {"CONTENT_TYPE": "application/json", "HTTP_AUTHORIZATION": "Bearer s3cret"}
    h.update(headers or {})
    return call(app, "POST", "/api/v1/deploys", h, data)


def test_deploy_is_accepted(deploy_app):
    app, events = deploy_app
    status, _, body = post(app, {"version": "v42", "target": "vllm-0", "description": "prompt v2"})
    assert status == 202 and json.loads(body)["event"]["version"] == "v42"
    (e,) = events.added
    assert (e.t, e.target, e.version, e.source, e.description) == (1234.5, "vllm-0", "v42", "api", "prompt v2")


@pytest.mark.parametrize("body, headers, raw, status", [
    pytest.param({"version": "v1"}, {"HTTP_AUTHORIZATION": ""}, None, 401, id="no-token"),
    pytest.param({"version": "v1"}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, None, 401, id="wrong-token"),
    pytest.param(None, {}, b"{not json", 400, id="not-json"),
    pytest.param([1, 2], {}, None, 400, id="not-an-object"),
    pytest.param({}, {}, None, 400, id="no-version"),
    pytest.param({"version": ""}, {}, None, 400, id="empty-version"),
    pytest.param({"version": "v1", "target": "nope"}, {}, None, 400, id="unknown-target"),
    pytest.param({"version": "v1", "extra": 1}, {}, None, 400, id="unknown-field"),
    pytest.param({"version": "v1"}, {"CONTENT_TYPE": "text/plain"}, None, 415, id="wrong-content-type"),
    pytest.param(None, {}, b"x" * (64 * 1024 + 1), 413, id="over-64KiB"),
    pytest.param(None, {}, "{\"version\": \"\\ud800\"}".encode(), 400, id="bad-unicode"),
])
def test_bad_deploy_requests_get_a_clear_4xx(deploy_app, body, headers, raw, status):
    app, events = deploy_app
    got, _, payload = post(app, body, headers, raw)
    assert got == status and "error" in json.loads(payload)
    assert events.added == []


def test_deploy_without_content_length_is_411(deploy_app):
    app, _ = deploy_app
    environ_headers = {"CONTENT_TYPE": "application/json", "HTTP_AUTHORIZATION": "Bearer s3cret"}
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/api/v1/deploys", "wsgi.input": io.BytesIO(b"{}"), **environ_headers}
    out = {}
    b"".join(app(environ, lambda s, h: out.setdefault("status", s)))
    assert out["status"].startswith("411")


def test_deploys_listing(deploy_app):
    app, _ = deploy_app
    status, _, body = call(app, "GET", "/api/v1/deploys")
    assert status == 200 and set(json.loads(body)) == {"recent", "counts", "last"}
