"""A new pod's first baseline from Prometheus: the reader against fake and real
Prometheus answers, and the deploy rule comparing a new pod with the fleet."""
import time

import pytest

from exporter.alerting.warmth import WARM_SPAN
from exporter.config.sections import FleetBaselineConfig, load
from exporter.monitor.engine import Engine
from exporter.discovery.prombaseline import BaselineError, FleetBaselineReader
from exporter.sim.simulator import Event, Replica, Scenario
from exporter.parse.vllm_metrics import parse

from conftest import free_port
from fakeserver import FakeServer, text

START = 10_000.0
MODEL = "demo/llama-3-8b"


def answer(*values):
    import json
    result = [{"metric": {"model_name": MODEL}, "value": [START, v]} for v in values]
    return text(json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}))


@pytest.mark.parametrize("route, expected", [
    pytest.param(answer("0.88"), 0.88, id="one-series"),
    pytest.param(answer(), None, id="no-data"),
    pytest.param(answer("NaN"), None, id="nan-is-no-baseline"),
])
def test_the_reader_reads_one_ratio(route, expected):
    seen = []

    def recording(h):
        seen.append(h.path)
        route(h)

    with FakeServer({"/api/v1/query": recording}) as server:
        reader = FleetBaselineReader(FleetBaselineConfig(prometheus_url=server.base))
        assert reader.read(MODEL, START) == expected
    assert "time=10000.000" in seen[0] and "demo%2Fllama-3-8b" in seen[0]


@pytest.mark.parametrize("route, message", [
    pytest.param(answer("0.5", "0.6"), "2 series", id="ambiguous-query"),
    pytest.param(text('{"status": "error", "error": "parse error"}', status=400), "parse error", id="bad-query"),
    pytest.param(text("<html>", status=502), "not JSON", id="proxy-error"),
])
def test_the_reader_says_what_went_wrong(route, message):
    with FakeServer({"/api/v1/query": route}) as server:
        with pytest.raises(BaselineError, match=message):
            FleetBaselineReader(FleetBaselineConfig(prometheus_url=server.base)).read(MODEL, START)


def test_an_unreachable_prometheus_is_an_error():
    with pytest.raises(BaselineError, match="unreachable"):
        FleetBaselineReader(FleetBaselineConfig(prometheus_url=f"http://127.0.0.1:{free_port()}", timeout=1.0)).read(MODEL, START)


def test_a_model_name_cannot_break_out_of_the_query():
    got = []
    with FakeServer({"/api/v1/query": lambda h: (got.append(h.path), answer("0.5")(h))}) as server:
        FleetBaselineReader(FleetBaselineConfig(prometheus_url=server.base)).read('m"} or vector(1) #', START)
    from urllib.parse import parse_qs, urlsplit
    assert parse_qs(urlsplit(got[0]).query)["query"][0] == 'model_name:vllm_prefix_cache_hit_ratio:rate1h{model_name="m\\"} or vector(1) #"}'


def new_pod(scenario, baseline=0.88, until=2400.0, step=5.0):
    """A pod a rollout just created: it starts at START, cold; the sidecar has nothing
    but the fleet's ratio before it started."""
    engine = Engine(load({"targets": [{"name": "vllm-new", "url": "http://127.0.0.1:1/"}]}))
    r = Replica("vllm-new", scenario, start=START, seed=3)
    transitions, t = [], START
    while t <= START + until:
        r.advance(t)
        engine.ingest("vllm-new", t, parse(r.render()))
        if t == START:
            engine.set_fleet_baseline("vllm-new", MODEL, baseline, START)
        transitions += engine.evaluate(t)
        t += step
    return [tr for tr in transitions if tr.alert.alertname == "PrefixCacheHitRateDropAfterDeploy"]


@pytest.mark.slow
def test_a_new_pod_whose_prompt_broke_is_compared_with_the_fleet_after_its_cold_start_and_resolves_when_fixed():
    fixed_at = 1500.0
    tr = new_pod(Scenario(events=(Event(0.0, "prompt", "timestamp"), Event(fixed_at, "prompt", "static"))))
    firing = [x for x in tr if x.state == "firing"]
    resolved = [x for x in tr if x.state == "resolved"]
    # once its refill stalled far under the fleet's ratio (two spans of a minute, not climbing),
    # before the 10 minutes of the old fixed grace
    assert len(firing) == 1 and START + 2 * WARM_SPAN <= firing[0].t < START + 600
    assert dict(firing[0].alert.labels)["cause"] == "prompt_prefix_change"
    assert len(resolved) == 1 and resolved[0].t > START + fixed_at


@pytest.mark.slow
def test_a_healthy_new_pod_matches_the_fleet():
    assert not [x for x in new_pod(Scenario()) if x.state in ("pending", "firing")]


@pytest.mark.slow
def test_the_reader_reads_the_recording_rule_from_a_real_prometheus(prometheus_fleet):
    reader = FleetBaselineReader(FleetBaselineConfig(prometheus_url=prometheus_fleet.prometheus.url))
    ratio = reader.read(MODEL, time.time())
    assert ratio is not None and 0.0 < ratio <= 1.0
    assert reader.read("no/such-model", time.time()) is None


def sidecar_with_a_fleet_baseline(prometheus_url, vllm, **baseline):
    import threading

    from exporter.config.sections import Target
    from exporter.poll.poller import TargetPoller
    from exporter.serve.state import State
    from exporter.config.load import read_secret_file
    from exporter.monitor.targetview import TargetView

    cfg = load({"targets": [{"name": "vllm-new", "url": vllm}],
                "fleet_baseline": {"prometheus_url": prometheus_url, "timeout": "1s", **baseline}}, read_secret_file)
    state, engine = State(), Engine(cfg)
    (target,) = cfg.targets
    state.set_targets([TargetView(target=target)])
    return TargetPoller(target, cfg, state, engine, threading.Lock()), state, engine


def test_a_dripping_prometheus_never_holds_the_first_poll():
    """Prometheus sends its headers, then a byte a second: the pod's first poll still
    publishes it up at once (readiness depends on it), the question is asked aside."""
    import threading

    from fakeserver import MisbehavingServer

    replica = Replica("vllm-new", Scenario(), start=time.time() - 60, seed=3)
    with MisbehavingServer() as prom, FakeServer({"/metrics": lambda h: (replica.advance(time.time()), text(replica.render())(h))}) as vllm:
        poller, state, engine = sidecar_with_a_fleet_baseline(prom.url("drip"), vllm.base + "/metrics")
        polling = threading.Thread(target=poller.poll, daemon=True)
        started = time.monotonic()
        polling.start()
        polling.join(5.0)
        took = time.monotonic() - started
        assert not polling.is_alive() and took < 0.9, took
        assert state.target("vllm-new").up
        deadline = time.monotonic() + 3
        while not prom.hits.get("drip") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert prom.hits.get("drip") == 1  # asked all the same, aside
        poller.close()


def test_the_baseline_is_asked_with_the_same_credentials_as_discovery(tmp_path):
    import base64
    import json

    replica = Replica("vllm-new", Scenario(), start=time.time() - 60, seed=3)
    seen = []
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [START, "0.77"]}]}}).encode()

    def query(h):
        from fakeserver import reply
        seen.append(h.headers.get("Authorization"))
        reply(h, 200, body)

    (tmp_path / "password").write_text("s3cret\n")
    with FakeServer({"/api/v1/query": query}) as prom, \
            FakeServer({"/metrics": lambda h: (replica.advance(time.time()), text(replica.render())(h))}) as vllm:
        poller, state, engine = sidecar_with_a_fleet_baseline(
            prom.base, vllm.base + "/metrics", basic_auth={"username": "reader", "password_file": str(tmp_path / "password")})
        poller.poll()
        deadline = time.monotonic() + 5
        while not engine.fleet_baselines and time.monotonic() < deadline:
            time.sleep(0.05)
        poller.close()
    assert [ratio for ratio, _ in engine.fleet_baselines.values()] == [0.77]
    assert seen and seen[0] == "Basic " + base64.b64encode(b"reader:s3cret").decode()
