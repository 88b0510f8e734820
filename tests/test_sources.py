"""Discovery sources against real files and HTTP servers on 127.0.0.1: a file_sd file
that appears, changes, breaks and goes; a Prometheus that answers, fails or is down."""
import json
import logging
import os

import pytest

from exporter.config.discovery import DiscoveryConfig, PrometheusSDConfig
from exporter.discovery.sources import FILE_SD, PROMETHEUS, Discovery

from conftest import FIXTURES, free_port
from fakeserver import FakeServer, reply, text

from test_poller import Clock

RECORDED = (FIXTURES / "discovery" / "prometheus-2.42-targets.json").read_text()


def group(*addresses, **labels):
    return {"targets": list(addresses), "labels": labels}


def write(path, groups, bump=0):
    path.write_text(json.dumps(groups))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))  # a distinct mtime on fast writes


def names(targets):
    return sorted(t.name for t in targets)


def test_file_sd_targets_come_change_and_go(tmp_path, caplog):
    sd = tmp_path / "vllm.json"
    write(sd, [group("127.0.0.1:1", pod="a"), group("127.0.0.1:2", pod="b")])
    clock = Clock()
    d = Discovery(DiscoveryConfig(file_sd=(str(tmp_path / "*.json"),)), clock)
    assert names(d.refresh()) == ["a", "b"]
    write(sd, [group("127.0.0.1:1", pod="a"), group("127.0.0.1:3", pod="c")], bump=1)
    assert names(d.refresh()) == ["a", "c"]
    (tmp_path / "more.json").write_text(json.dumps([group("127.0.0.1:4", pod="d")]))
    assert names(d.refresh()) == ["a", "c", "d"]
    (tmp_path / "more.json").unlink()
    assert names(d.refresh()) == ["a", "c"]
    (state,) = d.snapshot()
    assert state.name == FILE_SD and state.ok and state.failures == 0


def test_a_malformed_file_sd_file_keeps_its_last_targets_and_says_so(tmp_path, caplog):
    sd = tmp_path / "vllm.yml"
    sd.write_text("- targets: ['127.0.0.1:1']\n  labels: {pod: a}\n")
    d = Discovery(DiscoveryConfig(file_sd=(str(sd),)), Clock())
    assert names(d.refresh()) == ["a"]
    with caplog.at_level(logging.WARNING):
        sd.write_text("- targets: ['127.0.0.1:1'\n")  # truncated mid-write
        os.utime(sd, ns=(0, sd.stat().st_mtime_ns + 1_000_000_000))
        assert names(d.refresh()) == ["a"]
    (state,) = d.snapshot()
    assert not state.ok and state.failures == 1 and "not valid YAML" in state.error
    assert "not valid YAML" in caplog.text and "keeping the last 1 target" in caplog.text
    sd.write_text("- targets: ['127.0.0.1:1', '127.0.0.1:2']\n")
    assert len(d.refresh()) == 2 and d.snapshot()[0].ok


def test_no_file_matching_is_an_error_not_a_crash(tmp_path):
    d = Discovery(DiscoveryConfig(file_sd=(str(tmp_path / "none-*.json"),)), Clock())
    assert d.refresh() == []
    (state,) = d.snapshot()
    assert not state.ok and "no file matches" in state.error


def prometheus_config(url, job="vllm"):
    return DiscoveryConfig(prometheus=PrometheusSDConfig(url=url, job=job, timeout=2.0))


def test_targets_from_a_prometheus_and_its_outage_keeps_them(caplog):
    answer = {"body": RECORDED, "status": 200}
    seen = []

    def route(h):
        seen.append(h.path)
        reply(h, answer["status"], answer["body"].encode(), [("Content-Type", "application/json"), ("Connection", "close")])
        h.close_connection = True  # so that the outage below is one

    with FakeServer({"/api/v1/targets": route}) as server:
        d = Discovery(prometheus_config(server.base), Clock())
        assert len(d.refresh()) == 3
        assert "state=active" in seen[0] and "scrapePool" not in seen[0]  # a pool is not a job (see test_targets)
        with caplog.at_level(logging.WARNING):
            answer.update(status=503, body="{}")
            assert len(d.refresh()) == 3
            answer.update(status=200, body="<html>not json</html>")
            assert len(d.refresh()) == 3
        (state,) = d.snapshot()
        assert state.name == PROMETHEUS and not state.ok and state.failures == 2 and "not JSON" in state.error
        assert "HTTP 503" in caplog.text
    # the Prometheus is gone altogether
    assert len(d.refresh()) == 3
    assert "unreachable" in d.snapshot()[0].error and d.snapshot()[0].failures == 3


def test_an_unreachable_prometheus_from_the_start_is_an_error_and_no_targets():
    d = Discovery(prometheus_config(f"http://127.0.0.1:{free_port()}"), Clock())
    assert d.refresh() == []
    assert "unreachable" in d.snapshot()[0].error


@pytest.mark.parametrize("route", [
    pytest.param(text('{"status": "success", "data": {"activeTargets": [{"labels": {"job": "vllm"}}]}}'), id="target-without-address"),
    pytest.param(text('{"status": "error", "errorType": "bad_data", "error": "x"}'), id="error-answer"),
])
def test_a_bad_targets_answer_is_a_failure(route):
    with FakeServer({"/api/v1/targets": route}) as server:
        d = Discovery(prometheus_config(server.base), Clock())
        assert d.refresh() == [] and not d.snapshot()[0].ok


def test_basic_auth_and_bearer_token_are_sent():
    got = []

    def route(h):
        got.append(h.headers.get("Authorization"))
        reply(h, 200, RECORDED.encode())

    with FakeServer({"/api/v1/targets": route}) as server:
        Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, job="vllm", bearer_token="tok")), Clock()).refresh()
        Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, job="vllm", username="u", password="p")), Clock()).refresh()
    assert got == ["Bearer tok", "Basic dTpw"]


# --- no source can hold us: deadlines, files that are not files, close ----------------------------
def bounded(fn, seconds):
    """Runs fn on a thread; fails the test (instead of hanging it) if it does not end in time."""
    import threading
    box = {}
    thread = threading.Thread(target=lambda: box.update(value=fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds}s"
    return box.get("value")


def test_a_prometheus_that_drips_its_answer_is_cut_at_the_refresh_deadline():
    import time
    from fakeserver import drip
    with FakeServer({"/api/v1/targets": drip(0.5, 120)}) as server:
        d = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, job="vllm", timeout=1.0)), Clock())
        started = time.monotonic()
        assert bounded(d.refresh, 10) == []
        assert time.monotonic() - started < 3
        (state,) = d.snapshot()
        assert not state.ok and not state.refreshed and "1s" in state.error
        d.close()


def test_a_source_that_hangs_is_given_its_deadline_and_is_not_asked_again_on_top_of_itself(tmp_path):
    """Whatever the layer below does (a file_sd path on a hung mount, a client without a
    deadline of its own), a refresh ends at the source's deadline."""
    import threading
    import time
    from exporter.discovery import sources as sdsources
    hung, calls = threading.Event(), []
    d = Discovery(DiscoveryConfig(file_sd=(str(tmp_path / "*.json"),)), Clock())
    d.files.deadline = 0.5
    d.files.fetch = lambda: (calls.append(1), hung.wait(30))
    started = time.monotonic()
    assert bounded(d.refresh, 5) == [] and time.monotonic() - started < 2
    assert "no complete answer within the 0.5s deadline" in d.snapshot()[0].error
    assert bounded(d.refresh, 5) == [] and "still unanswered" in d.snapshot()[0].error and len(calls) == 1
    hung.set()
    assert sdsources.FILE_SD_DEADLINE <= 10


def test_close_ends_a_refresh_in_flight_at_once():
    import threading
    import time
    from fakeserver import drip
    with FakeServer({"/api/v1/targets": drip(0.5, 120)}) as server:
        d = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, job="vllm", timeout=60.0)), Clock())
        refreshing = threading.Thread(target=d.refresh, daemon=True)
        refreshing.start()
        time.sleep(0.5)
        started = time.monotonic()
        d.close()
        refreshing.join(5)
        assert not refreshing.is_alive() and time.monotonic() - started < 2
        assert d.snapshot()[0].failures == 0  # shutting down is not a failure of the source
        assert bounded(d.refresh, 2) == []


def stalled_prometheus(body):
    """A /api/v1/targets that answers `body` only once the test releases it: -> (route, asked, release)."""
    import threading
    asked, release = threading.Event(), threading.Event()

    def route(h):
        asked.set()
        release.wait(120)
        reply(h, 200, body.encode(), [("Content-Type", "application/json")])
    return route, asked, release


def test_a_refresh_out_of_budget_judges_no_source_and_the_next_one_takes_the_same_asks_answer(tmp_path):
    """A reload's refresh has a budget below the source's deadline: it ends there with None,
    the file_sd source beside the stalled Prometheus is settled all the same, the Prometheus
    is not counted failed, and the next refresh waits for the ask in flight (one request)."""
    route, asked, release = stalled_prometheus(RECORDED)
    write(tmp_path / "sd.json", [group("127.0.0.1:1", pod="f")])
    with FakeServer({"/api/v1/targets": route}) as server:
        d = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, job="vllm", timeout=120.0),
                                      file_sd=(str(tmp_path / "*.json"),)), Clock())
        try:
            assert bounded(lambda: d.refresh(budget=0.3), 30) is None
            assert asked.wait(30) and not release.is_set()
            states = {s.name: s for s in d.snapshot()}
            assert names(states[FILE_SD].targets) == ["f"] and states[FILE_SD].ok
            assert states[PROMETHEUS].failures == 0 and not states[PROMETHEUS].error and not states[PROMETHEUS].refreshed
            assert bounded(lambda: d.refresh(budget=0.0), 30) is None  # a spent budget: nothing waited for, nothing judged
            assert d.snapshot()[0].failures == 0
            release.set()
            assert len(bounded(d.refresh, 30)) == 3 + 1
            assert len(server.requests) == 1 and all(s.ok for s in d.snapshot())
            assert len(bounded(d.refresh, 30)) == 4 and len(server.requests) == 2  # a finished ask is not answered twice
        finally:
            release.set()
            d.close()


def test_an_answer_cut_short_is_a_failed_refresh_not_a_success():
    def short(h):
        h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + RECORDED.encode()[:100])
        h.wfile.flush()
        h.close_connection = True

    with FakeServer({"/api/v1/targets": short}) as server:
        d = Discovery(prometheus_config(server.base), Clock())
        assert bounded(d.refresh, 10) == []
        (state,) = d.snapshot()
        assert not state.ok and state.failures == 1 and state.error


def test_a_fifo_or_a_device_matching_the_glob_is_skipped_and_the_healthy_file_beside_it_is_read(tmp_path):
    write(tmp_path / "a-healthy.json", [group("127.0.0.1:1", pod="a")])
    os.mkfifo(tmp_path / "b-fifo.json")  # no writer: opening it for reading blocks
    (tmp_path / "c-zero.json").symlink_to("/dev/zero")  # st_size 0, endless
    (tmp_path / "d-dir.json").mkdir()
    d = Discovery(DiscoveryConfig(file_sd=(str(tmp_path / "*.json"),)), Clock())
    assert names(bounded(d.refresh, 10)) == ["a"]
    (state,) = d.snapshot()
    assert not state.ok and state.refreshed
    for bad in ("b-fifo.json", "c-zero.json", "d-dir.json"):
        assert f"{bad}: not a regular file" in state.error
    assert names(bounded(d.refresh, 10)) == ["a"]  # and again: nothing accumulates


def test_a_glob_over_many_bad_files_is_one_bounded_error(tmp_path):
    for i in range(40):
        (tmp_path / f"bad-{i:02d}.json").write_text("{not json")
    d = Discovery(DiscoveryConfig(file_sd=(str(tmp_path / "*.json"),)), Clock())
    d.refresh()
    error = d.snapshot()[0].error
    assert error.count("not valid JSON") == 5 and "and 35 more file(s) not read" in error


def test_a_file_over_the_cap_is_refused_whatever_its_size_claims(tmp_path, monkeypatch):
    from exporter.discovery import sources as sdsources
    monkeypatch.setattr(sdsources, "MAX_SD_FILE", 64)
    write(tmp_path / "big.json", [group(*(f"127.0.0.1:{p}" for p in range(1, 20)))])
    write(tmp_path / "small.json", [group("127.0.0.1:1", pod="a")])
    d = Discovery(DiscoveryConfig(file_sd=(str(tmp_path / "*.json"),)), Clock())
    assert names(d.refresh()) == ["a"] and "big.json: cannot read: larger than 64 bytes" in d.snapshot()[0].error


# --- limits and a selector that never matches ---------------------------------------------------
def test_targets_over_the_limit_are_dropped_counted_and_said_once_as_it_starts_and_stops(tmp_path, caplog):
    """A limit that drops targets says so once, with how many were found and kept, the
    limit and its key; a count that moves while it still drops says nothing more; once it
    drops nothing, one line says so. The state carries the sentence for the status page."""
    from exporter.serve.app import App, status_json
    from exporter.serve.state import State
    from prometheus_client import CollectorRegistry
    from test_app import call

    sd = tmp_path / "sd.json"
    write(sd, [group(*(f"127.0.0.1:{p}" for p in range(1, 31)))])
    d = Discovery(DiscoveryConfig(file_sd=(str(sd),), target_limit=10), Clock())
    with caplog.at_level(logging.INFO):
        assert len(d.refresh()) == 10
        assert len(d.refresh()) == 10
        write(sd, [group(*(f"127.0.0.1:{p}" for p in range(1, 36)))])
        assert len(d.refresh()) == 10
    (state,) = d.snapshot()
    assert state.ok and state.dropped == (("target_limit", 25),) and state.found == 35
    said = "35 target(s) found, 10 kept: 25 over discovery.target_limit=10 (raise it, or 0 for no limit)"
    assert state.over_limits == said
    lines = [r.getMessage() for r in caplog.records if "limits" in r.getMessage()]
    assert lines == ["discovery file_sd: over its limits, dropping 30 target(s) found, 10 kept: 20 over discovery.target_limit=10 "
                     "(raise it, or 0 for no limit)"]
    published = State()
    published.update(discovery=tuple(d.snapshot()))
    page = call(App(published, CollectorRegistry(), ready=lambda: (True, "")), "GET", "/")[2].decode()
    assert f"Discovery source file_sd is over its limits: {said}." in page
    (source,) = status_json(published)["discovery"]
    assert source == {"source": "file_sd", "ok": True, "error": "", "targets": 10, "found": 35,
                      "dropped": {"target_limit": 25}, "over_limits": said}
    caplog.clear()
    write(sd, [group(*(f"127.0.0.1:{p}" for p in range(1, 9)))])
    with caplog.at_level(logging.INFO):
        assert len(d.refresh()) == 8
        assert len(d.refresh()) == 8
    lines = [r.getMessage() for r in caplog.records if "limits" in r.getMessage()]
    assert lines == [f"discovery file_sd: no longer over its limits (8 target(s) found, 8 kept; it was: {said})"]
    assert d.snapshot()[0].over_limits == "" and d.snapshot()[0].dropped == ()


def operator_answer():
    from test_targets import OPERATOR
    return json.dumps(OPERATOR)


def test_a_selector_that_never_matches_is_said_once_with_what_the_answer_held(caplog):
    with FakeServer({"/api/v1/targets": text(operator_answer())}) as server:
        d = Discovery(prometheus_config(server.base, job="vllm"), Clock())
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                assert d.refresh() == []
        (state,) = d.snapshot()
        assert state.ok and state.refreshed and not state.matched_ever
        (line,) = [r.getMessage() for r in caplog.records if "nothing matches" in r.getMessage()]
        assert "job='vllm'" in line and "podMonitor/llm/vllm/0 (job='llm/vllm') x2" in line
        right = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, match_labels=(("job", "llm/vllm"),))), Clock())
        assert names(right.refresh()) == ["vllm-7f9c8d6b5-abcde", "vllm-7f9c8d6b5-fghij"] and right.snapshot()[0].matched_ever


def test_an_empty_prometheus_is_not_called_a_wrong_selector_unless_it_narrowed_the_answer_to_a_pool(caplog):
    empty = json.dumps({"status": "success", "data": {"activeTargets": [], "droppedTargets": []}})
    with FakeServer({"/api/v1/targets": text(empty)}) as server, caplog.at_level(logging.WARNING):
        Discovery(prometheus_config(server.base), Clock()).refresh()  # a Prometheus that just started
        assert "nothing matches" not in caplog.text
        pool = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, scrape_pool="vllm")), Clock())
        pool.refresh()
        assert "nothing matches scrape_pool='vllm'" in caplog.text and "the server kept only that scrape_pool" in caplog.text
        assert "scrapePool=vllm" in server.requests[-1][1]
        assert pool.snapshot()[0].matched_ever is False


def test_the_discovery_metrics_tell_a_wrong_selector_and_what_was_dropped(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.serve.collector import PrefixCacheCollector
    from exporter.serve.state import State

    sd = tmp_path / "sd.json"
    write(sd, [group(*(f"127.0.0.1:{p}" for p in range(1, 6)), version="v" * 2000)])
    with FakeServer({"/api/v1/targets": text(operator_answer())}) as server:
        d = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, job="vllm"), file_sd=(str(sd),), target_limit=3), Clock())
        d.refresh()
    state = State()
    state.update(discovery=tuple(d.snapshot()))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m"]))
    metrics = generate_latest(registry).decode()
    assert 'prefixcache_discovery_matched_nothing{source="prometheus"} 1.0' in metrics
    assert 'prefixcache_discovery_matched_nothing{source="file_sd"} 0.0' in metrics
    assert 'prefixcache_discovery_dropped{reason="target_limit",source="file_sd"} 2.0' in metrics
    assert 'prefixcache_discovery_dropped{reason="label_value_length_limit",source="file_sd"} 5.0' in metrics


# --- the whole process: a peer that drips never holds start-up, readiness or SIGTERM --------------
@pytest.mark.slow
def test_a_dripping_discovery_prometheus_holds_neither_start_up_nor_readiness_nor_sigterm(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import requests
    from fakeserver import drip

    from conftest import wait_for

    port = free_port()
    log = tmp_path / "sidecar.log"
    with FakeServer({"/api/v1/targets": drip(1.0, 600)}) as prom:
        cfg = tmp_path / "sidecar.yml"
        cfg.write_text(f"discovery:\n  prometheus: {{url: '{prom.base}', match_labels: {{job: llm/vllm}}, timeout: 30s}}\n")
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={cfg}",
                                 f"--web.listen-address=127.0.0.1:{port}"], cwd=Path(__file__).parent.parent,
                                stderr=open(log, "w"))
        try:
            assert wait_for(lambda: "listening on" in log.read_text(), timeout=15), log.read_text()
            ready = requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=5)
            assert ready.status_code == 503 and "discovery has not answered yet: prometheus" in ready.text
            assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
            time.sleep(1)  # a refresh is in flight, dripping
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
            assert time.monotonic() - started < 8, log.read_text()
            assert proc.returncode == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# --- a real Prometheus whose scrape config is shaped like prometheus-operator's ----------------------
def operator_scrape_config(pool_ns, name, sd_file, version_relabelling=True):
    """What prometheus-operator generates for a PodMonitor `name` in `pool_ns` with one
    podMetricsEndpoints entry on port `http` (pkg/prometheus/promcfg.go, v0.93.0): the pool
    is podMonitor/<ns>/<name>/0, `job` is relabelled to <ns>/<name>; then the PodMonitor's
    own relabelings (here: version from the pod label app.kubernetes.io/version).
    kubernetes_sd's pod labels come from a file_sd file with the same __meta_ names."""
    relabel = [
        {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "regex": name, "action": "keep"},
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http", "action": "keep"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{pool_ns}/{name}"},
        {"target_label": "endpoint", "replacement": "http"},
    ]
    if version_relabelling:
        relabel.append({"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_version"], "target_label": "version"})
    return {"job_name": f"podMonitor/{pool_ns}/{name}/0", "file_sd_configs": [{"files": [str(sd_file)]}], "relabel_configs": relabel}


@pytest.mark.slow
def test_operator_shaped_prometheus_every_pod_is_found_with_its_version_by_match_labels(tmp_path, caplog):
    import subprocess
    import sys
    import time
    from pathlib import Path

    import requests
    import yaml

    from exporter.sim import simulator
    from exporter.sim.server import Fleet

    from conftest import wait_for
    from prom import Prometheus

    fleet = Fleet([], clock=time.time).start()
    pods = {"vllm-7f9c8d6b5-abcde": ("vllm", "v1"), "vllm-7f9c8d6b5-fghij": ("vllm", "v1"), "vllm-5d4c3b2a1-klmno": ("vllm", "v2"),
            "embedder-0": ("embedder", "e1")}
    for i, pod in enumerate(pods):
        fleet.add(simulator.Replica(pod, simulator.Scenario(), start=time.time() - 900, seed=i))
    sd = tmp_path / "pods.json"
    sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{fleet.port}"], "labels": {
        "__metrics_path__": f"/{pod}/metrics", "__meta_kubernetes_namespace": "llm", "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_container_name": app, "__meta_kubernetes_pod_container_port_name": "http",
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": app, "__meta_kubernetes_pod_label_app_kubernetes_io_version": version}}
        for pod, (app, version) in pods.items()]))
    prom = Prometheus(tmp_path, [operator_scrape_config("llm", "vllm", sd), operator_scrape_config("llm", "embedder", sd)])
    port = free_port()
    sidecar_cfg = tmp_path / "sidecar.yml"
    sidecar = None
    try:
        prom.start()
        new = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=prom.url, match_labels=(("job", "llm/vllm"),), timeout=5.0)), Clock())
        with caplog.at_level(logging.WARNING):
            assert wait_for(lambda: len(new.refresh()) == 3, timeout=20)
            # a config of before (job: vllm, the job named like the pool) finds nothing here, and says why
            old = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=prom.url, job="vllm", timeout=5.0)), Clock())
            assert old.refresh() == [] and old.snapshot()[0].ok and old.snapshot()[0].matched_ever is False
        assert {t.name: dict(t.labels)["version"] for t in new.refresh()} == {p: v for p, (app, v) in pods.items() if app == "vllm"}
        assert {t.url for t in new.refresh()} == {f"http://127.0.0.1:{fleet.port}/{p}/metrics" for p, (app, _) in pods.items() if app == "vllm"}
        # the whole sidecar, configured as the central variant is
        sidecar_cfg.write_text(yaml.safe_dump({
            "global": {"poll_interval": "1s", "connect_timeout": "500ms", "read_timeout": "1s", "jitter": "0s"},
            "discovery": {"refresh_interval": "1s", "prometheus": {"url": prom.url, "match_labels": {"job": "llm/vllm"}, "timeout": "5s"}}}))
        sidecar = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={sidecar_cfg}",
                                    f"--web.listen-address=127.0.0.1:{port}"], cwd=Path(__file__).parent.parent,
                                   stderr=open(tmp_path / "sidecar.log", "w"))
        base = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: requests.get(base + "/-/ready", timeout=5).status_code == 200, timeout=60), (tmp_path / "sidecar.log").read_text()
        assert wait_for(lambda: sum(t["up"] for t in requests.get(base + "/api/v1/status", timeout=5).json()["targets"]) == 3, timeout=30), \
            requests.get(base + "/api/v1/status", timeout=5).text[:2000]
        metrics = requests.get(base + "/metrics", timeout=5).text
        for pod, (app, version) in pods.items():
            up = [line for line in metrics.splitlines() if line.startswith("prefixcache_target_up{") and f'target="{pod}"' in line]
            if app == "vllm":
                assert len(up) == 1 and f'version="{version}"' in up[0] and 'job="llm/vllm"' in up[0] and up[0].endswith(" 1.0"), up
            else:
                assert not up
        assert 'prefixcache_discovery_matched_nothing{source="prometheus"} 0.0' in metrics
    finally:
        if sidecar is not None:
            sidecar.terminate()
            sidecar.wait(timeout=20)
        prom.stop()
        fleet.stop()
    hint = [r.getMessage() for r in caplog.records if "nothing matches" in r.getMessage()]
    assert len(hint) == 1 and "podMonitor/llm/vllm/0 (job='llm/vllm') x3" in hint[0] and "job='vllm'" in hint[0]


def test_record_from_a_dripping_discovery_prometheus_stops_at_once_on_sigterm(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from fakeserver import drip

    with FakeServer({"/api/v1/targets": drip(1.0, 600)}) as prom:
        cfg = tmp_path / "sidecar.yml"
        cfg.write_text(f"discovery:\n  prometheus: {{url: '{prom.base}', match_labels: {{job: llm/vllm}}, timeout: 60s}}\n")
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "record", f"--config.file={cfg}", f"--out={tmp_path / 'rec.jsonl'}",
                                 "--duration=120"], cwd=Path(__file__).parent.parent, stderr=subprocess.PIPE)
        try:
            assert wait_until_requested(prom, 15)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
            assert time.monotonic() - started < 5
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def wait_until_requested(server, seconds):
    import time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.requests:
            time.sleep(0.5)  # the ask is in flight, dripping
            return True
        time.sleep(0.1)
    return False


def test_discovery_kv_events_name_the_ports_every_discovered_pod_publishes_on():
    from exporter.config.discovery import KVPorts
    from exporter.config.sections import ConfigError, load

    cfg = load({"discovery": {"file_sd": {"files": ["/tmp/x.json"]}, "kv_events": {"port": 5557, "replay_port": 5558, "topic": "kv"}}})
    assert cfg.discovery.kv_events == KVPorts(5557, 5558, "kv")
    for bad, says in (({"replay_port": 5558}, "port: required"), ({"port": 70000}, "is not a port"), ({"port": "5557"}, "is not a port")):
        with pytest.raises(ConfigError, match=says):
            load({"discovery": {"file_sd": {"files": ["/tmp/x.json"]}, "kv_events": bad}})
