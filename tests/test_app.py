import gzip
import io
import json
import time

import pytest
from prometheus_client import CollectorRegistry

from exporter.serve.collector import PrefixCacheCollector
from exporter.config.sections import Target
from exporter.serve.app import App
from exporter.serve.state import State
from exporter.monitor.targetview import TargetView

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



def test_the_status_api_and_page_say_not_ready_as_the_probe_does():
    """No target yet and a Prometheus that does not answer: /-/ready is 503, and the status
    API and page say so with its reason (they said ready, and nothing was wrong)."""
    why = "discovery has not answered yet: read_prometheus (connection refused)"
    answer = [(False, why)]
    app = App(State(), CollectorRegistry(), ready=lambda: answer[0])
    assert call(app, "GET", "/-/ready")[0] == 503
    data = json.loads(call(app, "GET", "/api/v1/status")[2])
    assert data["ready"] is False and data["not_ready_because"] == why and data["targets"] == []
    page = call(app, "GET", "/")[2].decode()
    assert "Not ready: discovery has not answered yet: read_prometheus (connection refused)." in page
    answer[0] = (True, "")
    data = json.loads(call(app, "GET", "/api/v1/status")[2])
    assert data["ready"] is True and "not_ready_because" not in data
    assert "Not ready" not in call(app, "GET", "/")[2].decode()

def test_the_status_page_says_a_discovery_source_that_answered_once_now_fails():
    """/-/ready stays 200 (the source answered once), so the page is where a person sees it:
    the pods read from a Prometheus that stopped answering still show their last state."""
    from exporter.discovery.targets import SourceState
    state = State()
    app = App(state, CollectorRegistry(), ready=lambda: (True, ""))
    state.update(discovery=(SourceState("read_prometheus", ok=True, refreshed=True),))
    assert "Discovery source" not in call(app, "GET", "/")[2].decode()
    state.update(discovery=(SourceState("read_prometheus", ok=False, refreshed=True, failures=3,
                                        error="http://prometheus:9090/api/v1/query: connection refused"),
                            SourceState("file_sd", ok=False, refreshed=True, failures=1, error="targets.json: not a list")))
    page = call(app, "GET", "/")[2].decode()
    assert ("Discovery source read_prometheus fails (3 failure(s) since start): http://prometheus:9090/api/v1/query: "
            "connection refused; its pods keep their last state and none is judged until it answers again.") in page
    assert "Discovery source file_sd fails (1 failure(s) since start): targets.json: not a list; its last 0 target(s) are kept." in page


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
    from exporter.serve.app import deploy_handlers
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
    pytest.param({"version": "v1\nts=x level=ERROR msg=forged"}, {}, None, 400, id="newline-in-version"),
    pytest.param({"version": "v1", "description": "a\x1b[31mred"}, {}, None, 400, id="escape-in-description"),
    pytest.param({"version": "v1"}, {"HTTP_AUTHORIZATION": "Basic s3cret"}, None, 401, id="other-scheme"),
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


@pytest.mark.parametrize("header", ["Bearer s3cret", "bearer s3cret", "BEARER s3cret", "  Bearer   s3cret "])
def test_the_bearer_scheme_is_case_insensitive(deploy_app, header):
    app, events = deploy_app
    assert post(app, {"version": "v1"}, {"HTTP_AUTHORIZATION": header})[0] == 202


def test_without_a_token_the_deploy_api_is_closed_unless_opened_on_purpose():
    """Open without a token, a POST from anywhere re-anchored every baseline and hid an
    unannounced prompt change behind a "deploy"."""
    from exporter.serve.app import deploy_handlers
    state = simulated_state()
    for opened, status in ((False, 403), (True, 202)):
        events = Events()
        app = App(state, CollectorRegistry())
        handler, _ = deploy_handlers(state, events.added.append, lambda: "", lambda: {"vllm-0"}, lambda: 1.0, lambda o=opened: o)
        app.route("POST", "/api/v1/deploys", handler)
        got, _, body = call(app, "POST", "/api/v1/deploys", {"CONTENT_TYPE": "application/json"}, b'{"version": "v1"}')
        assert got == status and len(events.added) == (1 if opened else 0), body
        if not opened:
            assert "deploys.api_open" in json.loads(body)["error"]


def test_landing_page_says_when_the_deploy_api_is_open():
    state = simulated_state()
    open_app = App(state, CollectorRegistry(), deploy_api_open=lambda: True)
    closed_app = App(state, CollectorRegistry(), deploy_api_open=lambda: False)
    assert b"POST /api/v1/deploys is open" in call(open_app, "GET", "/")[2]
    assert b"is open" not in call(closed_app, "GET", "/")[2]


def test_the_status_api_gives_query_tokens_in_tokens_also_for_a_block_counting_target():
    """A vLLM 0.8 target counts blocks: `query_tokens` were its block counts (`unit`
    says what the engine counts in)."""
    state = simulated_state(generation="v0.8")
    data = json.loads(call(App(state, CollectorRegistry()), "GET", "/api/v1/status")[2])
    (up,) = [t for t in data["targets"] if t["name"] == "vllm-0"]
    window = up["models"]["demo/llama-3-8b"]["5m"]
    ws = state.targets()[0].stats["demo/llama-3-8b"]["5m"]
    assert window["unit"] == "blocks" and window["query_tokens"] == ws.query_increase * 16 > 0
    assert window["hit_tokens"] == ws.hit_increase * 16 and window["effective_hit_ratio"] == ws.effective_hit_ratio


def test_credentials_in_target_urls_never_reach_the_status_api():
    from dataclasses import replace
    state = simulated_state()
    view = state.targets()[0]
    secret = replace(view.target, url="http://scraper:hunter2@127.0.0.1:1/metrics")
    state.set_targets([replace(view, target=secret)])
    body = call(App(state, CollectorRegistry()), "GET", "/api/v1/status")[2]
    assert b"hunter2" not in body and b"scraper:xxxxx@127.0.0.1:1" in body


def test_every_endpoint_answers_after_every_kind_of_event():
    """An event of each source, then every GET route: each answers 200 with its own
    content type; the JSON ones parse. (The status and deploys APIs once answered 500
    forever after the first deploy event.)"""
    from exporter.alerting import deploys
    from exporter.config.sections import Config, GlobalConfig, Target
    from exporter.alerting.deploys import DeployEvent
    from exporter.serve.app import deploy_handlers
    from exporter.poll.poller import Poller

    targets = (Target("vllm-0", "http://127.0.0.1:1/metrics"),)
    cfg = Config(targets=targets, global_=GlobalConfig(windows=(("1m", 60.0),)))
    state = State()
    poller = Poller(cfg, state, clock=lambda: 1000.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m"]))
    app = App(state, registry, render_interval=0.0)
    post_handler, get_handler = deploy_handlers(state, poller.add_event, lambda: "", lambda: {"vllm-0"}, lambda: 1000.0, lambda: True)
    app.route("POST", "/api/v1/deploys", post_handler)
    app.route("GET", "/api/v1/deploys", get_handler)
    sources = (deploys.API, deploys.RESTART, deploys.CONFIG_CHANGE, deploys.ANNOTATIONS, deploys.CHANGE_POINT, deploys.RECORDING)
    for i, source in enumerate(sources):
        poller.add_event(DeployEvent(1000.0 + i, "vllm-0" if i % 2 else None, f"v{i}", source, "why"))
        poller.evaluate()
        for method, path in sorted(app.routes):
            if method != "GET":
                continue
            status, headers, body = call(app, "GET", path)
            assert status in (200, 503) if path == "/-/ready" else status == 200, (source, path, body[:200])
            if headers["Content-Type"] == "application/json":
                json.loads(body)
    counts = json.loads(call(app, "GET", "/api/v1/deploys")[2])["counts"]
    assert counts == {"": {"api": 1, "config_change": 1, "change_point": 1}, "vllm-0": {"restart": 1, "annotations_file": 1, "recording": 1}}
    metrics = call(app, "GET", "/metrics")[2].decode()
    assert 'prefixcache_deploy_events_total{source="recording",target="vllm-0"} 1.0' in metrics


def test_the_exposition_is_rendered_once_per_state_change():
    state = simulated_state()
    calls = []

    class Counting(PrefixCacheCollector):
        def collect(self):
            calls.append(1)
            return super().collect()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Counting(state, ["1m", "5m"]))
    app = App(state, registry)
    clock = [100.0]
    app.exposition.clock = lambda: clock[0]
    first = [call(app, "GET", "/metrics")[2] for _ in range(5)]
    zipped = [call(app, "GET", "/metrics", {"HTTP_ACCEPT_ENCODING": "gzip"})[2] for _ in range(3)]
    assert len(calls) == 1 and len(set(first)) == 1 and gzip.decompress(zipped[0]) == first[0]
    state.update(config_reload_success=False)
    clock[0] += 0.5  # changes within the render interval share one render...
    assert b"prefixcache_config_last_reload_successful 1.0" in call(app, "GET", "/metrics")[2]
    clock[0] += 0.5  # ...and the next scrape after it sees them
    assert b"prefixcache_config_last_reload_successful 0.0" in call(app, "GET", "/metrics")[2]
    assert len(calls) == 2


@pytest.fixture
def served():
    from exporter.serve.server import Server
    state = simulated_state()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m", "5m"]))
    server = Server(App(state, registry), "127.0.0.1", 0, timeout=2.0).start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


def test_half_open_connections_do_not_starve_a_scrape(served):
    """300 clients connect and send nothing; a real scrape still gets through quickly
    and the idle ones are dropped after the request timeout."""
    import socket
    import requests
    port = int(served.rsplit(":", 1)[1])
    idle = []
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(s)
        resp = requests.get(served + "/metrics", timeout=5)
        assert resp.status_code == 200 and "prefixcache_target_up" in resp.text
        idle[0].settimeout(10)
        assert idle[0].recv(1) == b""  # closed by the server after its timeout, not held forever
    finally:
        for s in idle:
            s.close()


def test_concurrent_scrapers_all_succeed(served):
    import concurrent.futures
    import requests

    def scrape(_):
        with requests.Session() as s:
            return [s.get(served + "/metrics", timeout=10).status_code for _ in range(5)]

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        codes = [c for batch in pool.map(scrape, range(50)) for c in batch]
    assert codes == [200] * 250


@pytest.mark.parametrize("listen", ["[::1]:0", "[::]:0"])
def test_ipv6_listen_addresses(listen):
    import requests
    from exporter.config.reader import parse_listen_address
    from exporter.serve.server import Server
    host, port = parse_listen_address(listen)
    state = simulated_state()
    server = Server(App(state, CollectorRegistry()), host, port).start()
    try:
        assert requests.get(f"http://[::1]:{server.port}/-/healthy", timeout=5).status_code == 200
    finally:
        server.stop()


@pytest.fixture
def rollout_app():
    """Four replicas of one model: three on v41 at ~88%, one on v42 whose prompt now
    carries a timestamp (~3%). The engine's side of the verdict is in test_engine."""
    from exporter.alerting import analysis
    from exporter.serve.app import analysis_handlers
    from test_analysis import ws
    members = [analysis.Member(f"vllm-{i}", version, ws(hits, 100_000))
               for i, (version, hits) in enumerate((("v41", 88_000), ("v41", 87_000), ("v41", 89_000), ("v42", 3_000)))]
    app = App(State(), CollectorRegistry())
    get, flagger = analysis_handlers(
        lambda model, version, baseline, where: analysis.analyze(members if model == "m" else [], model, version, baseline))
    app.route("GET", "/api/v1/analysis", get)
    app.route("POST", "/api/v1/analysis/flagger", flagger)
    return app


def analysis(app, query):
    environ = {"QUERY_STRING": query}
    status, headers, body = call(app, "GET", "/api/v1/analysis", environ)
    assert headers["Content-Type"] == "application/json"  # always: Argo passes a body that is not JSON
    return status, json.loads(body)


def test_the_analysis_api_fails_the_broken_version_and_passes_the_old_one(rollout_app):
    status, data = analysis(rollout_app, "model=m&version=v42")
    assert status == 200 and data["verdict"] == "fail" and data["baseline_version"] == "v41"
    assert data["hit_ratio"] == pytest.approx(0.03) and data["baseline_hit_ratio"] == pytest.approx(0.88)
    assert {"verdict", "hit_ratio", "baseline_hit_ratio", "query_tokens", "baseline_query_tokens", "reason"} <= set(data)
    status, data = analysis(rollout_app, "model=m&version=v41&baseline=v42")
    assert data["verdict"] == "pass"


@pytest.mark.parametrize("query, status", [
    pytest.param("", 400, id="no-parameters"),
    pytest.param("model=m", 400, id="no-version"),
    pytest.param("model=nope&version=v1", 200, id="unknown-model-is-inconclusive"),
    pytest.param("model=m&version=v1%0Aforged", 400, id="control-characters"),
])
def test_the_analysis_api_answers_json_even_for_bad_queries(rollout_app, query, status):
    got, data = analysis(rollout_app, query)
    assert got == status and data["verdict"] == "inconclusive"


@pytest.mark.parametrize("metadata, status, verdict", [
    pytest.param({"model": "m", "version": "v42"}, 409, "fail", id="drop-fails-the-check"),
    pytest.param({"model": "m", "version": "v41", "baseline": "v42"}, 200, "pass", id="no-drop-passes"),
    pytest.param({"model": "m", "version": "v9"}, 422, "inconclusive", id="a-version-no-pod-runs-fails-the-check"),
])
def test_the_flagger_webhook_fails_only_on_a_drop(rollout_app, metadata, status, verdict):
    body = json.dumps({"name": "vllm", "namespace": "llm", "phase": "Progressing", "metadata": metadata}).encode()
    got, _, payload = call(rollout_app, "POST", "/api/v1/analysis/flagger", {"CONTENT_TYPE": "application/json"}, body)
    assert got == status and json.loads(payload)["verdict"] == verdict


def test_the_flagger_webhook_refuses_a_body_without_metadata(rollout_app):
    got, _, payload = call(rollout_app, "POST", "/api/v1/analysis/flagger", {}, b'{"name": "vllm"}')
    assert got == 400 and "metadata" in json.loads(payload)["error"]


def test_the_gate_hands_its_other_parameters_on_as_the_scope_to_judge_in():
    """Argo names the Rollout's namespace and name (`?namespace=prod&owner=vllm`); Flagger
    sends the Canary's namespace in every webhook: the engine keeps those that are
    analysis.scope_labels, so a version is judged among its own Deployment's replicas."""
    from exporter.alerting import analysis as gate
    from exporter.serve.app import analysis_handlers
    asked = []

    def verdict(model, version, baseline, where):
        asked.append((model, version, baseline, where))
        return gate.analyze([], model, version, baseline)
    app = App(State(), CollectorRegistry())
    get, flagger = analysis_handlers(verdict)
    app.route("GET", "/api/v1/analysis", get)
    app.route("POST", "/api/v1/analysis/flagger", flagger)
    analysis(app, "model=m&version=v42&namespace=prod&owner=vllm")
    analysis(app, "model=m&version=v42&baseline=v41")
    body = json.dumps({"name": "vllm", "namespace": "llm", "phase": "Progressing",
                       "metadata": {"model": "m", "version": "canary", "require": "pass", "owner": "vllm"}}).encode()
    call(app, "POST", "/api/v1/analysis/flagger", {"CONTENT_TYPE": "application/json"}, body)
    assert asked == [("m", "v42", None, {"namespace": "prod", "owner": "vllm"}), ("m", "v42", "v41", {}),
                     ("m", "canary", None, {"namespace": "llm", "owner": "vllm"})]
    status, data = analysis(app, "model=m&version=v42&namespace=pr%0Aod")
    assert status == 400 and data["verdict"] == "inconclusive"


@pytest.mark.slow
def test_slowloris_connections_do_not_starve_scrapes_or_probes():
    """20 clients (more than the 16 workers) each send one header line every 0.3 s and
    never end the head. Each read is far inside the 10 s read timeout, so only a
    deadline on the whole head frees the workers: a scrape and a probe still answer,
    and every dripping client is dropped at the deadline."""
    import requests
    from exporter.serve.server import Server
    from slowclient import Dripping
    state = simulated_state()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m"]))
    app = App(state, registry)
    server = Server(app, "127.0.0.1", 0, timeout=10.0, read_deadline=1.0).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        with Dripping(server.port, 20, 0.3) as drip:
            started = time.monotonic()
            assert requests.get(base + "/metrics", timeout=8).status_code == 200
            assert requests.get(base + "/-/healthy", timeout=8).status_code == 200
            assert time.monotonic() - started < 5
            deadline = time.monotonic() + 8
            while drip.dropped < 20 and time.monotonic() < deadline:
                time.sleep(0.1)
        assert drip.dropped == 20 and max(drip.seconds_held) < 4, drip.seconds_held
        # a body that drips is bounded by the same deadline
        with Dripping(server.port, 3, 0.3, first=b"POST /api/v1/deploys HTTP/1.1\r\nContent-Type: application/json\r\n"
                                                 b"Content-Length: 60000\r\n\r\n") as drip:
            deadline = time.monotonic() + 8
            while drip.dropped < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
        assert drip.dropped == 3 and max(drip.seconds_held) < 4, drip.seconds_held
        # and a client that keeps its connection alive gets a fresh deadline per request
        with requests.Session() as session:
            for _ in range(3):
                assert session.get(base + "/-/healthy", timeout=5).status_code == 200
                time.sleep(0.6)
        for method, path in sorted(app.routes):  # and after all that, every route answers
            assert requests.request(method, base + path, timeout=5).status_code in (200, 503), (method, path)
    finally:
        server.stop()


@pytest.mark.parametrize("accept, gzipped", [
    pytest.param("gzip", True, id="gzip"),
    pytest.param("gzip;q=0", False, id="gzip-refused"),
    pytest.param("gzip; q=0.000", False, id="gzip-refused-spaced"),
    pytest.param("GZIP;Q=0.5", True, id="case-insensitive"),
    pytest.param("identity, gzip;q=0", False, id="identity-only"),
    pytest.param("*", True, id="anything"),
    pytest.param("*;q=0", False, id="nothing-but-identity"),
    pytest.param("gzip;q=0, *", False, id="gzip-refused-before-star"),
    pytest.param("br, deflate", False, id="other-codings"),
    pytest.param("x-gzip", True, id="x-gzip"),
    pytest.param("gzip;q=nope", False, id="bad-weight"),
])
def test_accept_encoding_weights_are_honoured(app, accept, gzipped):
    status, headers, body = call(app, "GET", "/metrics", {"HTTP_ACCEPT_ENCODING": accept})
    assert status == 200 and ("Content-Encoding" in headers) == gzipped
    assert b"prefixcache_target_up" in (gzip.decompress(body) if gzipped else body)


NESTED = b"[" * 20_000 + b"]" * 20_000  # under the 64 KiB cap, past any recursion limit


def test_deeply_nested_json_is_a_400_with_a_json_body(deploy_app, rollout_app):
    app, events = deploy_app
    status, headers, body = post(app, None, raw=NESTED)
    assert status == 400 and headers["Content-Type"] == "application/json" and "error" in json.loads(body)
    status, headers, body = post(app, None, raw=b'{"version": "v1", "description": ' + NESTED + b"}")
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert events.added == []
    status, headers, body = call(rollout_app, "POST", "/api/v1/analysis/flagger", {"CONTENT_TYPE": "application/json"},
                                 b'{"metadata": ' + NESTED + b"}")
    assert status == 400 and headers["Content-Type"] == "application/json" and "error" in json.loads(body)


def test_the_apis_answer_json_for_every_error(app):
    app.route("GET", "/api/v1/boom", lambda env: 1 / 0)
    for method, path, status in (("GET", "/api/v1/boom", 500), ("GET", "/api/v1/nope", 404), ("DELETE", "/api/v1/status", 405)):
        got, headers, body = call(app, method, path)
        assert got == status and headers["Content-Type"] == "application/json" and "error" in json.loads(body)


@pytest.mark.parametrize("query", ["model=m&version=v42&baseline=v42", "model=m&version=v41&baseline=v41"])
def test_a_version_judged_against_itself_is_a_400(rollout_app, query):
    status, data = analysis(rollout_app, query)
    assert status == 400 and "baseline" in data["error"]
    model_version = dict(kv.split("=") for kv in query.split("&"))
    body = json.dumps({"metadata": model_version}).encode()
    got, headers, payload = call(rollout_app, "POST", "/api/v1/analysis/flagger", {"CONTENT_TYPE": "application/json"}, body)
    assert got == 400 and "baseline" in json.loads(payload)["error"]


def _every_route(sidecar):
    return sorted(sidecar.app.routes)


@pytest.mark.parametrize("basic_auth", [True, False], ids=["basic-auth-on", "basic-auth-off"])
def test_who_may_call_each_endpoint_follows_every_reload(tmp_path, basic_auth):
    """The deploy API's bearer token stands in for basic auth only while a token is
    configured, decided per request: a SIGHUP reload that drops the token puts the route
    back behind basic auth (it once answered 202 to anyone), and one that adds it lets
    the token in. Every other route keeps its answer across the reloads, live."""
    import base64
    import bcrypt
    import requests
    import yaml
    from exporter.sidecar import build_sidecar
    from exporter.config.load import load_file
    from exporter.serve.webconfig import parse_web_config

    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    cfg_path = tmp_path / "config.yml"

    def write_config(with_token: bool):
        deploys = {"api_token_file": str(token_file)} if with_token else {}
        cfg_path.write_text(yaml.safe_dump({"global": {"poll_interval": "1s", "connect_timeout": "200ms", "read_timeout": "200ms"},
                                            "targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/metrics"}], "deploys": deploys}))

    security = None
    if basic_auth:
        security = parse_web_config({"basic_auth_users": {"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4)).decode()}})
    write_config(True)
    sidecar = build_sidecar(load_file(str(cfg_path)), "127.0.0.1:0", security=security).start()
    base = f"http://127.0.0.1:{sidecar.server.port}"
    basic = {"Authorization": "Basic " + base64.b64encode(b"prometheus:right").decode()}
    bearer = {"Authorization": "Bearer s3cret"}
    deploy = json.dumps({"version": "v1"}).encode()

    def answer(method, path, headers):
        body = deploy if path == "/api/v1/deploys" else b"{}"
        resp = requests.request(method, base + path, headers={"Content-Type": "application/json", **headers},
                                data=body if method == "POST" else None, timeout=10)
        if path.startswith("/api/"):
            assert resp.headers["Content-Type"] == "application/json", (method, path, resp.text[:200])
            if method != "HEAD":
                resp.json()
        return resp.status_code

    def check_every_route(token_on: bool):
        for method, path in _every_route(sidecar):
            if (method, path) == ("POST", "/api/v1/deploys"):
                continue
            anonymous = answer(method, path, {})
            if basic_auth and path not in ("/-/healthy", "/-/ready"):
                assert anonymous == 401, (method, path, token_on)
            else:
                assert anonymous != 401, (method, path, token_on)
            allowed = answer(method, path, basic if basic_auth else {})
            assert allowed != 401 and allowed < 500, (method, path, token_on, allowed)
        post = lambda headers: answer("POST", "/api/v1/deploys", headers)  # noqa: E731
        if token_on:  # the token, and only the token, opens it (with basic auth on or off)
            assert (post({}), post(bearer), post(basic)) == (401, 202, 401), token_on
        elif basic_auth:  # behind basic auth, and closed without a token
            assert (post({}), post(bearer), post(basic)) == (401, 401, 403), token_on
        else:  # closed without a token
            assert (post({}), post(bearer)) == (403, 403)

    try:
        check_every_route(True)
        for token_on in (False, True, False):
            write_config(token_on)
            assert sidecar.reload(str(cfg_path))
            check_every_route(token_on)
    finally:
        sidecar.stop()
