"""The Prometheus source (exporter/poll/promread.py, exporter/discovery/promseries.py): the
pods' samples read from a real Prometheus that scrapes them, fed to the same engine as the
scrape path. Its windowed ratios equal PromQL's on the same samples and the scrape path's
on the same fleet; versions, the gate and shards work on what it finds; a pod whose
series stop is down, not frozen."""
import logging
import math
import re
import time
from contextlib import contextmanager
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from exporter.config.sections import ConfigError, load
from exporter.discovery import promseries
from exporter.poll.poller import Poller
from exporter.serve.collector import PrefixCacheCollector
from exporter.serve.state import State
from exporter.series.window import stats_between
from exporter.sim import simulator
from exporter.sim.server import Fleet

from conftest import wait_for
from prom import Prometheus

MODEL = "demo/llama-3-8b"
PODS = {"vllm-a": "v1", "vllm-b": "v1", "vllm-c": "v2"}


def registry_of(state: State) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["1m", "5m", "1h"]))
    return registry


def read_config(prom_url: str, **discovery) -> dict:
    return {"global": {"poll_interval": "1s", "jitter": "0s", "min_query_tokens": 1, "windows": ["1m", "5m", "1h"], "connect_timeout": "500ms", "read_timeout": "1s"},
            "discovery": {"read_prometheus": {"url": prom_url, "match_labels": {"job": "vllm"}}, **discovery}}


def test_the_config_reads_the_source_strictly():
    cfg = load(read_config("http://prometheus:9090"))
    read = cfg.discovery.read_prometheus
    assert read.url == "http://prometheus:9090" and read.match_labels == (("job", "vllm"),) and read.target_label == "pod"
    assert cfg.discovery.enabled and not read.reexport_engine_series
    again = read_config("http://prometheus:9090")
    again["discovery"]["read_prometheus"]["reexport_engine_series"] = True
    assert load(again).discovery.read_prometheus.reexport_engine_series
    again["discovery"]["read_prometheus"]["reexport_engine_series"] = "yes"
    with pytest.raises(ConfigError, match="reexport_engine_series"):
        load(again)
    with pytest.raises(ConfigError, match="match_labels"):
        load({"discovery": {"read_prometheus": {"url": "http://prometheus:9090"}}})
    with pytest.raises(ConfigError, match="read_prometheus.scrape_interval"):
        load({"discovery": {"read_prometheus": {"url": "http://p:9090", "match_labels": {"job": "x"}, "scrape_interval": "1s"}}})
    # a size as body_size_limit reads one (512MiB was refused as "not a whole number"); bytes still do
    for size, expected in (("64MiB", 64 * 2**20), (1_000_000, 1_000_000)):
        sized = read_config("http://prometheus:9090")
        sized["discovery"]["read_prometheus"]["max_answer"] = size
        assert load(sized).discovery.read_prometheus.max_answer == expected


def test_the_query_asks_every_name_the_parser_reads_of_the_matched_targets_only():
    q = promseries.query((("job", "llm/vllm"), ("namespace", 'a"b')), 42.2)
    assert q.endswith(',job="llm/vllm",namespace="a\\"b"}[43s]')
    assert "vllm:prefix_cache_queries_total|" in q and "vllm:time_to_first_token_seconds_bucket" in q


def test_the_query_leaves_out_only_the_names_whose_fields_nothing_reads():
    """What the Prometheus source does not ask for is filed by the parser and read by
    nothing else: no rule, window, cause, export or page (a module outside parse/ that
    came to read one of these fields fails here, and the name goes back into the query)."""
    from pathlib import Path
    from exporter.parse.names import QUERY_NAMES, ROLE_BY_NAME, SAMPLE_NAMES, UNREAD_FIELDS
    left_out = set(SAMPLE_NAMES) - set(QUERY_NAMES)
    assert {ROLE_BY_NAME[n][1] for n in left_out} == UNREAD_FIELDS
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
            "sglang:num_queue_reqs", "trtllm_num_requests_running"} <= left_out
    query = promseries.query((("job", "vllm"),), 30.0)
    assert all(f"{n}|" in query or f'{n}"' in query for n in QUERY_NAMES) and not any(f"{n}|" in query for n in left_out)
    package = Path(promseries.__file__).parent.parent
    for module in package.rglob("*.py"):
        if module.parent.name in ("parse", "sim"):  # the parser files them; the simulator makes them
            continue
        text = module.read_text()
        assert not [f for f in UNREAD_FIELDS if f in text], module


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Three simulated pods on one clock that moves in whole seconds (so that a pod's
    answer is the same to whoever asks within a second), scraped every second by a real
    Prometheus as a PodMonitor would: job, namespace, pod and version labels."""
    work = tmp_path_factory.mktemp("promread")
    now = math.floor(time.time())
    replicas = [simulator.Replica(name, simulator.Scenario(request_rate=4.0), start=now - 900, seed=i, model_names=[MODEL])
                for i, name in enumerate(PODS)]
    for r in replicas:
        r.advance(now)
    fleet = Fleet(replicas, clock=lambda: math.floor(time.time())).start()
    scrape_configs = [{"job_name": f"pod-{name}", "metrics_path": f"/{name}/metrics",
                       "static_configs": [{"targets": [f"127.0.0.1:{fleet.port}"],
                                           "labels": {"namespace": "llm", "pod": name, "version": version, "deployment": "llama"}}],
                       "relabel_configs": [{"target_label": "job", "replacement": "vllm"}]} for name, version in PODS.items()]
    prom = Prometheus(work, scrape_configs, scrape_interval="1s")
    prom.start()
    try:
        prom.wait_for_history('vllm:prefix_cache_queries_total{pod="vllm-c"}', 5, 60)
        yield prom, fleet
    finally:
        prom.stop()
        fleet.stop()


@pytest.mark.slow
def test_read_from_prometheus_equals_promql_and_the_scrape_path_and_stale_pods_go_down(stack):
    prom, fleet = stack
    state = State()
    reader = Poller(load(read_config(prom.url)), state)
    direct_state = State()
    direct_cfg = load({"global": {"poll_interval": "1s", "jitter": "0s", "min_query_tokens": 1, "windows": ["1m", "5m", "1h"], "connect_timeout": "500ms", "read_timeout": "1s"},
                       "targets": [{"name": name, "url": fleet.metrics_url(name)} for name in PODS]})
    # the scrape path on the same fleet, its clock in the fleet's whole seconds: each poll sees what Prometheus saw that second
    direct = Poller(direct_cfg, direct_state, clock=lambda: math.floor(time.time()))
    reader.start()
    direct.start()
    try:
        assert wait_for(lambda: sorted(v.target.name for v in state.targets()) == sorted(PODS) and all(v.up for v in state.targets()), 30)
        time.sleep(65)  # a full 1m window for the scrape path too
        # discovery and versions: the pods with their labels from Prometheus
        view = state.target("vllm-c")
        assert dict(view.target.labels)["version"] == "v2" and dict(view.target.labels)["namespace"] == "llm"
        assert view.target.url == prom.url + "#vllm-c" and dict(view.scrapes)["success"] >= 60
        # the real Prometheus's answers are in the layout read from the text: every pod is known there
        assert sorted(reader.reader.memo.pods) == sorted(PODS)
        compared = 0
        for name in PODS:
            ours, theirs = state.target(name), direct_state.target(name)
            t = ours.last_t
            window = ours.stats[MODEL]["1m"]
            # PromQL over the samples ours holds, (t - 60, t]: its range starts halfway between the last sample
            # left out and the first one in, so neither the range's closed or open left edge (Prometheus 2 or 3)
            # nor a scrape that ran late on a loaded machine puts a sample on one side and not the other
            (raw,) = prom.range_samples(f'vllm:prefix_cache_queries_total{{pod="{name}"}}', "2m", t)
            stamps = [round(float(ts) * 1000) for ts, _ in raw["values"]]
            end_ms = round(t * 1000)
            first = next(i for i, ms in enumerate(stamps) if ms > end_ms - 60_000)
            assert first > 0, stamps  # Prometheus holds a sample before the window: its edge is known
            span_ms = end_ms - (stamps[first - 1] + stamps[first]) // 2
            (promql,) = prom.query(f'increase(vllm:prefix_cache_hits_total{{pod="{name}"}}[{span_ms}ms]) / '
                                   f'increase(vllm:prefix_cache_queries_total{{pod="{name}"}}[{span_ms}ms])', at=t)
            assert window.hit_ratio == pytest.approx(float(promql["value"][1]), rel=1e-9), name
            # the scrape path over the same second's answers: Prometheus's sample at t is the fleet's second floor(t)
            end = math.floor(t)
            scraped = stats_between(theirs.samples, MODEL, end - 60, end, 1.0, theirs.snapshot.block_size)
            if scraped.query_increase == window.query_increase:  # both saw the same first and last samples
                assert abs(window.hit_ratio - scraped.hit_ratio) <= 0.001, name
                compared += 1
        assert compared >= 2
        # the gate judges the versions it found
        verdict = reader.analyze(time.time(), MODEL, "v2", None)
        assert verdict.baseline_version == "v1" and verdict.replicas == 1 and verdict.baseline_replicas == 2, verdict
        # a pod whose series stop while Prometheus still has its target (its scrapes fail: up == 0)
        # is down, not frozen, and says that Prometheus cannot scrape it
        fleet.remove("vllm-c")
        assert wait_for(lambda: not state.target("vllm-c").up, 20)
        assert state.target("vllm-c").last_result == "stale" and state.target("vllm-a").up
        assert re.fullmatch(r"Prometheus cannot scrape it \(up == 0\); its last sample is from \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                            state.target("vllm-c").last_error), state.target("vllm-c").last_error
        from exporter.serve.statuspage import StatusPage
        page = StatusPage(state).get([], "test").decode()
        assert "resolution is Prometheus&#x27;s scrape interval (observed 1s)" in page, [p for p in page.split("<p") if "resolution" in p]
        from exporter.serve.app import status_json
        assert "resolution is Prometheus's scrape interval (observed 1s)" in status_json(state)["samples_source"]
        status = [s for s in state.published.discovery if s.name == "read_prometheus"]
        assert status and status[0].ok and len(status[0].targets) == 3
        # vLLM's own series are in the Prometheus read: their copies are not exported again, where the
        # scrape path's are; what we convert (the lookup pair and its unit) is exported by both
        assert state.published.engine_series_withheld == frozenset(PODS) and not direct_state.published.engine_series_withheld
        read_text, direct_text = (generate_latest(registry_of(s)).decode() for s in (state, direct_state))
        assert "prefixcache_vllm_time_to_first_token_seconds_bucket{" not in read_text and 'prefixcache_effective_hit_ratio{' in read_text
        assert "prefixcache_vllm_time_to_first_token_seconds_bucket{" in direct_text
        assert all('prefixcache_vllm_prefix_cache_queries_total{' in text for text in (read_text, direct_text))
    finally:
        reader.stop(1.0)
        direct.stop(1.0)


@pytest.mark.slow
def test_shards_split_the_pods_read_from_prometheus(stack):
    prom, _ = stack
    names = []
    for index in (0, 1):
        raw = read_config(prom.url, shard={"index": index, "count": 2, "key_label": "pod"})
        raw["discovery"]["read_prometheus"]["partitions"] = 3  # three queries a read, each of whole pods
        cfg = load(raw)
        state = State()
        poller = Poller(cfg, state)
        poller.read()
        names.append({v.target.name for v in state.targets()})
        assert all(v.polled for v in state.targets()) and not poller.dispatcher.entries  # read, never scraped
        poller.stop(0.5)
    assert names[0] | names[1] >= {"vllm-a", "vllm-b"} and not names[0] & names[1]


@pytest.mark.slow
def test_limits_that_drop_pods_or_labels_are_said_once_as_they_start_and_stop_by_both_prometheus_sources(stack, caplog):
    """The real Prometheus's three pods, target_limit 2 and label_limit 5 (each pod has six
    labels): read_prometheus and discovery.prometheus each say once what they dropped, with
    the numbers and the keys that raise the limits; reads and refreshes that follow say
    nothing more; the status page and /api/v1/status show it; raising the limits by a
    reload (the reader made anew with them) says once that nothing is dropped any more."""
    from exporter.config.discovery import DiscoveryConfig, PrometheusSDConfig
    from exporter.discovery.sources import Discovery
    from exporter.serve.app import App, status_json
    from test_app import call

    prom, _ = stack
    labels = "3 label(s) over discovery.label_limit=5 (raise it, or 0 for no limit)"
    pods = "3 target(s) found, 2 kept: 1 over discovery.target_limit=2 (raise it, or 0 for no limit)"
    state = State()
    poller = Poller(load(read_config(prom.url, target_limit=2, label_limit=5)), state)
    discovery = Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=prom.url, match_labels=(("job", "vllm"),)),
                                          target_limit=2, label_limit=5), time.time)
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(3):
                poller.read()
                assert len(discovery.refresh()) == 2
                time.sleep(1.1)  # a new scrape of every pod between reads
        (read,) = [s for s in state.published.discovery if s.name == "read_prometheus"]
        (found,) = discovery.snapshot()
        assert read.over_limits == found.over_limits == f"{labels}; {pods}"
        assert sorted(v.target.name for v in state.targets()) == ["vllm-a", "vllm-b"]
        lines = [r.getMessage() for r in caplog.records if "limits" in r.getMessage()]
        assert lines == [f"read_prometheus: over its limits, dropping {labels}; {pods}",
                         f"discovery prometheus: over its limits, dropping {labels}; {pods}"], lines
        page = call(App(state, CollectorRegistry(), ready=lambda: (True, "")), "GET", "/")[2].decode()
        assert f"Discovery source read_prometheus is over its limits: {labels}; {pods}." in page
        (source,) = status_json(state)["discovery"]
        assert source["found"] == 3 and source["targets"] == 2 and source["dropped"] == {"label_limit": 3, "target_limit": 1}
        caplog.clear()
        poller.reload(load(read_config(prom.url, target_limit=0, label_limit=0)), refresh=False)
        with caplog.at_level(logging.INFO):
            for _ in range(2):
                time.sleep(1.1)
                poller.read()
        lines = [r.getMessage() for r in caplog.records if "limits" in r.getMessage()]
        assert lines == [f"read_prometheus: no longer over its limits (3 target(s) found, 3 kept; it was: {labels}; {pods})"], lines
        assert sorted(v.target.name for v in state.targets()) == sorted(PODS)
        assert dict(state.target("vllm-a").target.labels)["version"] == "v1"
        assert "over its limits" not in call(App(state, CollectorRegistry(), ready=lambda: (True, "")), "GET", "/")[2].decode()
    finally:
        poller.stop(0.5)
        discovery.close()


def test_compression_none_asks_prometheus_for_its_answers_as_they_are_and_reads_the_same_samples(stack):
    """gzip (the default) and none against the real Prometheus: it compresses when asked,
    and the two answers are the same text; a compression it does not know is a config error."""
    from urllib.parse import urlencode

    from exporter.peers.http import exchange
    from exporter.poll.promread import PrometheusReader

    prom, _ = stack
    query = {"query": promseries.query((("job", "vllm"),), 5.0), "time": str(math.floor(time.time()) - 2)}
    bodies = {}
    for compression in ("gzip", "none"):
        raw = read_config(prom.url)
        raw["discovery"]["read_prometheus"]["compression"] = compression
        if compression == "gzip":
            del raw["discovery"]["read_prometheus"]["compression"]  # the default
        api = PrometheusReader(load(raw).discovery, 1.0).api
        try:
            answer = exchange(api.endpoint, path="/api/v1/query?" + urlencode(query), headers=api.headers, timeout=10,
                              size_limit=api.max_answer)
        finally:
            api.close()
        assert answer.status == 200 and answer.headers.get("content-encoding") == ("gzip" if compression == "gzip" else None)
        bodies[compression] = answer.body
    assert bodies["gzip"] == bodies["none"] and b'"pod":"vllm-a"' in bodies["none"]
    raw = read_config(prom.url)
    raw["discovery"]["read_prometheus"]["compression"] = "zstd"
    with pytest.raises(ConfigError, match="read_prometheus.compression: 'zstd' is not one of gzip, none"):
        load(raw)


def test_partitions_cover_every_pod_name_once():
    import re
    parts = promseries.partitions("pod", 4)
    assert len(parts) == 4
    for name in ("vllm-0", "vllm-7f9c-x2b4q", "vllm-z", "vllm-_", "vllm-Ä", "a"):
        hits = 0
        for part in parts:
            label, op, regex = re.match(r'(\w+)(=~|!~)"(.*)"', part).groups()
            matched = re.fullmatch(regex, name) is not None
            hits += matched if op == "=~" else not matched
        assert hits == 1, name
    assert promseries.partitions("pod", 1) == [""]


def answer_of(scrapes: dict[float, str], pod_labels: dict[str, str]) -> dict:
    """Prometheus's matrix answer for one pod scraped at each time of `scrapes` with that
    body (its samples read by prometheus_client's parser, not ours), as the API gives it:
    a series per label set, its values oldest first, the target's labels on every series."""
    from prometheus_client.parser import text_string_to_metric_families
    series: dict[tuple, list] = {}
    for t, text in sorted(scrapes.items()):
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                metric = {"__name__": s.name, **s.labels, **pod_labels}
                series.setdefault(tuple(sorted(metric.items())), []).append([t, repr(float(s.value))])
    return {"status": "success", "data": {"resultType": "matrix",
                                          "result": [{"metric": dict(k), "values": v} for k, v in series.items()]}}


@pytest.mark.parametrize("fixture", ["vllm-metrics/v1-main-2026-08_vllm-pr-51670.txt", "vllm-metrics/v1-0.10.0_production-stack-issue-617.txt",
                                     "engine-metrics/lmcache-in-vllm_lmcache-pr-1300_tp4-worker-ids.txt",
                                     "engine-metrics/vllm_loggers_connector-sleep_asleep-level-2.txt",
                                     "engine-metrics/sglang_0.5.1_issue-13485_scheduler-labels.txt"])
def test_a_pods_samples_from_the_answer_make_the_snapshot_its_body_makes(fixture):
    """The samples of a scrape as Prometheus holds them, filed without a text written and
    read back, make the scrape path's snapshot of the body (but the warnings' line numbers:
    sample i stands for line i, and the answer has no comment lines)."""
    from pathlib import Path
    from dataclasses import replace
    from exporter.parse.vllm_metrics import parse
    text = (Path(__file__).parent / "fixtures" / fixture).read_text()
    grown = "\n".join(line if line.startswith("#") or not line.strip() else
                      line.rpartition(" ")[0] + " " + repr(float(line.rpartition(" ")[2]) * 2) for line in text.splitlines()) + "\n"
    pod = {"job": "vllm", "namespace": "llm", "pod": "vllm-0", "instance": "10.0.0.1:8000"}
    pods = promseries.pods(answer_of({100.0: text, 115.0: grown}, pod), "pod", "test")
    assert list(pods) == ["vllm-0"] and sorted(pods["vllm-0"].times) == [100.0, 115.0]
    for t, body in ((100.0, text), (115.0, grown)):
        ours, theirs = pods["vllm-0"].snapshot(t), parse(body)
        assert theirs.series and replace(ours, warnings=(), warnings_dropped=0) == replace(theirs, warnings=(), warnings_dropped=0)
        assert len(ours.warnings) == len(theirs.warnings)
    # samples at or before a pod's last read are left out, the newer ones kept
    later = promseries.pods(answer_of({100.0: text, 115.0: grown}, pod), "pod", "test", {"vllm-0": 100.0})
    assert sorted(later["vllm-0"].times) == [115.0]
    assert later["vllm-0"].snapshot(115.0) == pods["vllm-0"].snapshot(115.0)
    assert promseries.pods(answer_of({100.0: text, 115.0: grown}, pod), "pod", "test", {"vllm-0": 115.0}) == {}


def _compact(payload: dict, **dumps) -> bytes:
    """The answer as Prometheus writes it: no space, `metric` before `values`."""
    import json
    return json.dumps(payload, separators=(",", ":"), **dumps).encode()


ANSWER_FIXTURES = ["vllm-metrics/v1-main-2026-08_vllm-pr-51670.txt", "engine-metrics/lmcache-in-vllm_lmcache-pr-1300_tp4-worker-ids.txt",
                   "engine-metrics/sglang_0.5.1_issue-13485_scheduler-labels.txt"]


@pytest.mark.parametrize("fixture", ANSWER_FIXTURES)
def test_an_answer_in_prometheus_layout_is_read_from_its_text_as_the_decoded_one_is(fixture):
    """pods_of_answer reads Prometheus's layout from the text: the same pods, samples and
    snapshots as pods() of the decoded answer, the samples already read left out; the next
    answer with the same labels reuses what the memo learnt, one whose labels changed is
    learnt again."""
    import json
    from pathlib import Path
    text = (Path(__file__).parent / "fixtures" / fixture).read_text()
    grown = "\n".join(line if line.startswith("#") or not line.strip() else
                      line.rpartition(" ")[0] + " " + repr(float(line.rpartition(" ")[2]) * 2) for line in text.splitlines()) + "\n"
    merged = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    for pod in ("vllm-0", "vllm-1"):
        one = answer_of({100.0: text, 115.0: grown}, {"job": "vllm", "namespace": "llm", "pod": pod, "instance": f"{pod}:8000"})
        merged["data"]["result"] += one["data"]["result"]
    merged["data"]["result"].sort(key=lambda s: sorted(s["metric"].items()))  # Prometheus's order: by label set, pods interleaved
    body = _compact(merged)
    memo = promseries.PodMemo()
    for newer in ({}, {"vllm-0": 100.0}, {"vllm-0": 115.0, "vllm-1": 100.0}):
        ours = promseries.pods_of_answer(body, "pod", "test", newer, memo)
        assert ours == promseries.pods(json.loads(body), "pod", "test", newer) and ours
        for pod in ours.values():
            for t in pod.times:
                assert pod.snapshot(t) == promseries.pods(json.loads(body), "pod", "test")[pod.name].snapshot(t)
    learnt = memo.pods["vllm-0"]
    promseries.pods_of_answer(body, "pod", "test", {}, memo)
    assert memo.pods["vllm-0"] is learnt  # the same labels: read as they were
    relabelled = json.loads(body)
    for s in relabelled["data"]["result"]:
        s["metric"]["zone"] = "z2"
    ours = promseries.pods_of_answer(_compact(relabelled), "pod", "test", {}, memo)
    assert memo.pods["vllm-0"] is not learnt and ours["vllm-0"].labels["zone"] == "z2"
    assert ours == promseries.pods(relabelled, "pod", "test")


def test_answers_in_any_other_layout_are_decoded_whole_to_the_same_pods():
    """Spaces, escapes, a key Prometheus adds only at times, a series of native histograms,
    a pod label that is empty: each read as pods() reads the decoded answer; what is not
    JSON, or not a matrix, is an error naming the source."""
    import json
    from exporter.discovery.targets import DiscoveryError
    series = lambda pod, name, value, **labels: {"metric": {"__name__": name, "pod": pod, "instance": "i:1", **labels},
                                                 "values": [[100.5, value], [115.5, value]]}
    base = {"status": "success", "data": {"resultType": "matrix", "result": [
        series("vllm-0", "vllm:prefix_cache_queries_total", "10", model_name="m"),
        series("vllm-0", "vllm:prefix_cache_hits_total", "4", model_name="m")]}}
    variants = {
        "spaces": json.dumps(base).encode(),
        "escapes": _compact({**base, "data": {**base["data"], "result": base["data"]["result"] + [
            series("vllm-0", "vllm:num_requests_running", "1", model_name='a"b\\c')]}}),
        "non-ascii escaped": _compact({**base, "data": {**base["data"], "result": base["data"]["result"] + [
            series("vllm-0", "vllm:num_requests_running", "1", model_name="modèle")]}}),
        "warnings": _compact({**base, "warnings": ["a partial answer"]}),
        "a native histogram": _compact({**base, "data": {**base["data"], "result": base["data"]["result"] + [
            {"metric": {"__name__": "vllm:x", "pod": "vllm-0"}, "histograms": [[100.5, {"count": "1", "sum": "1"}]]}]}}),
        "values and histograms": _compact({**base, "data": {**base["data"], "result": [
            {**base["data"]["result"][0], "histograms": [[100.5, {"count": "1", "sum": "1"}]]}] + base["data"]["result"][1:]}}),
        "an empty pod label": _compact({**base, "data": {**base["data"], "result": [
            series("", "vllm:prefix_cache_queries_total", "3", model_name="m")] + base["data"]["result"]}}),
        "a value that is not a string": _compact({**base, "data": {**base["data"], "result": base["data"]["result"] + [
            {"metric": {"__name__": "vllm:num_requests_running", "pod": "vllm-0", "model_name": "m"}, "values": [[115.5, 3]]}]}}),
        "unicode as is": _compact({**base, "data": {**base["data"], "result": base["data"]["result"] + [
            series("vllm-1", "vllm:num_requests_running", "1", model_name="modèle ]]},\"values\":[[")]}}, ensure_ascii=False),
        "brackets in a label": _compact({**base, "data": {**base["data"], "result": base["data"]["result"] + [
            series("vllm-1", "vllm:num_requests_running", "1", model_name='m]]},{"metric":{')]}}),
        # a series with no values and one with its metric and values twice (JSON keeps the last):
        # as many values as series in all, each series' own in none
        "values missing and twice": PROLOGUE.encode() + b",".join(
            [_compact(s) for s in base["data"]["result"]]
            + [b'{"metric":{"__name__":"vllm:x","pod":"vllm-0"},"histograms":[[100.5,{"count":"1","sum":"1"}]]}',
               b'{"metric":{"__name__":"vllm:num_requests_running","pod":"vllm-0","model_name":"m"},"values":[[100.5,"1"]],'
               b'"metric":{"__name__":"vllm:num_requests_waiting","pod":"vllm-0","model_name":"m"},"values":[[115.5,"2"]]}']) + b"]}}",
    }
    for what, body in variants.items():
        memo = promseries.PodMemo()
        assert promseries.pods_of_answer(body, "pod", "test", {}, memo) == promseries.pods(json.loads(body), "pod", "test"), what
    assert set(promseries.PodMemo().pods) == set()
    for bad, said in ((b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{', "answer is not JSON"),
                      (b"\xff\xfe", "answer is not JSON"),
                      (_compact({"status": "success", "data": {"resultType": "vector", "result": []}}), "not a matrix")):
        with pytest.raises(DiscoveryError, match=said):
            promseries.pods_of_answer(bad, "pod", "test")


PROLOGUE = '{"status":"success","data":{"resultType":"matrix","result":['


@pytest.mark.parametrize("result", [
    '{"metric":{"__name__":"x","pod":"a","pod":"b"},"values":[[1,"1"]]}',  # a label twice: JSON keeps the last
    '{"metric":{"__name__":"x","pod":1,"instance":"i"},"values":[[1,"1"]]}',  # a pod that is not a string
    '{"metric":{"__name__":"x","n":{"pod":"q"},"instance":"i"},"values":[[1,"1"]]}',  # a label inside another
    '{"metric":{"x":"y"},"values":[[1,"1"]]}',  # no pod and no name
    '{"metric":{},"values":[[1,"1"]]}',
    '{"metric":{"__name__":"x","pod":"a"},"values":[[9,"],[5,"],[7,"1"]]}',  # a value holding the separator
    '{"metric":{"__name__":"x","pod":"a"},"values":[[1_0,"1"]]}',  # times JSON has not
    '{"metric":{"__name__":"x","pod":"a"},"values":[[+1,"1"]]}',
    '{"metric":{"__name__":"x","pod":"a"},"values":[[nan,"1"]]}',
    '{"metric":{"__name__":"x","pod":"a"},"values":[[\u0661,"1"]]}',
    '{"metric":{"__name__":"x","pod":"a"},"values":[[1,"1\n"]]}',  # a raw control character
    '{"metric":{"__name__":"x","pod":"a"},"values":[[-Infinity,"1"]]}',
    '{"metric":{"__name__":"x","pod":"a"},"values":[[' + "9" * 400 + ',"1"]]}',
    '{"metric":{"__name__":"x","pod":"a"},"values":[[1,"1"]]}\u00a0',  # trailing space that is not JSON's
    '{"metric":{"__name__":"x","pod":"a"},"values":[[07,"1"]]}',  # times float() reads and JSON has not
    '{"metric":{"__name__":"x","pod":"a"},"values":[[7.,"1"]]}',
    '{"metric":{"__name__":"x","pod":"a"},"values":[[.7e1,"1"]]}',
    '{"metric":{"__name__":"x","pod":"a"},"values":[[ 7,"1"]]}',
    '{"metric":{"__name__":"x","pod":"a"},"values":[[7,"1"]]|[8,"2"]]}',  # the columns' own series mark in a text
])
def test_a_text_that_only_looks_like_prometheus_layout_reads_as_the_decoder_reads_it(result):
    """Bodies a review built to tell the two readings apart: each gives what pods() gives
    the decoded answer (or the same error), and the memo learns nothing from one that is
    not read whole from its text."""
    import json
    from exporter.discovery.targets import DiscoveryError
    body = (PROLOGUE + result + "]}}").encode()
    memo = promseries.PodMemo()
    try:
        expected = promseries.pods(json.loads(body), "pod", "test", {"a": 6.0})
    except (ValueError, DiscoveryError):
        with pytest.raises(DiscoveryError):
            promseries.pods_of_answer(body, "pod", "test", {"a": 6.0}, memo)
    else:
        assert promseries.pods_of_answer(body, "pod", "test", {"a": 6.0}, memo) == expected
    assert not memo.pods


def test_series_of_one_pod_with_uneven_samples_are_not_read_as_columns():
    """Two series of one and three samples hold four in all, as two of two would, and their
    times read as one row repeated: a review's body, valid JSON, that the columns filed as
    two scrapes of both series. Read sample by sample, as the decoder reads it, in the answer's order."""
    import json
    body = (PROLOGUE + '{"metric":{"__name__":"x","pod":"a"},"values":[[1,"a"]]},'
            '{"metric":{"__name__":"y","pod":"a"},"values":[[2,"b"],[1,"c"],[2,"d"]]}]}}').encode()
    ours = promseries.pods_of_answer(body, "pod", "test", {}, promseries.PodMemo())
    assert ours == promseries.pods(json.loads(body), "pod", "test")
    assert [(name, value) for name, _, value, _ in ours["a"].times[2.0]] == [("y", "b"), ("y", "d")]


def test_a_known_answer_read_by_another_target_label_names_its_pods_by_that_label():
    """A reload may change read_prometheus.target_label and keeps the memo: the same answer is
    then cut into the pods the new label names, not those of the layout learnt before."""
    import json
    body = (PROLOGUE + '{"metric":{"__name__":"x","pod":"p1","instance":"i1"},"values":[[1,"5"]]}]}}').encode()
    memo = promseries.PodMemo()
    assert list(promseries.pods_of_answer(body, "pod", "test", {}, memo)) == ["p1"]
    assert promseries.pods_of_answer(body, "instance", "test", {}, memo) == promseries.pods(json.loads(body), "instance", "test")
    assert list(promseries.pods_of_answer(body, "instance", "test", {}, memo)) == ["i1"]


def test_the_memo_learns_only_from_an_answer_read_whole_and_matches_the_series_count():
    """A pod learnt before a later series breaks the text is not kept; label texts that
    join to what two series joined to are not those two series."""
    good = '{"metric":{"__name__":"x","pod":"a"},"values":[[1,"1"]]}'
    memo = promseries.PodMemo()
    with pytest.raises(Exception):
        promseries.pods_of_answer((PROLOGUE + good + ',{"metric":{"__name__":"x","pod":"b"},"values":[[1x,"1"]]}]}}').encode(),
                                  "pod", "test", {}, memo)
    assert not memo.pods
    two = PROLOGUE + '{"metric":{"__name__":"x","pod":"a"},"values":[[1,"1"]]},{"metric":{"__name__":"y","pod":"a"},"values":[[1,"2"]]}]}}'
    first = promseries.pods_of_answer(two.encode(), "pod", "test", {}, memo)
    assert [s[0] for s in first["a"].times[1.0]] == ["x", "y"] and "a" in memo.pods


def _regular(values_of_series: list[str]) -> bytes:
    return (PROLOGUE + ",".join('{"metric":{"__name__":"%s","model_name":"m","pod":"a"},"values":[%s]}' % (name, values)
                                for name, values in zip(["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                                                         "vllm:num_requests_running"], values_of_series)) + "]}}").encode()


def test_a_pod_whose_series_share_their_sample_times_is_filed_a_scrape_at_a_time_as_the_decoder_files_it():
    """A read every interval sees each series' last few samples, the newest one new (or a
    few, after a slow read): the pod is filed a scrape at a time, to what the decoder
    makes of them."""
    import json
    body = _regular(['[10,"1"],[25,"2"],[40,"3"]', '[10,"0"],[25,"1"],[40,"NaN"]', '[10,"5"],[25,"5"],[40,"+Inf"]'])
    memo = promseries.PodMemo()
    for newer in ({"a": 25.0}, {"a": 40.0}, {"a": 10.0}, {}):
        assert promseries.pods_of_answer(body, "pod", "test", newer, memo) == promseries.pods(json.loads(body), "pod", "test", newer)
    known = memo.pods["a"]
    values = tuple(promseries._series_texts(body.decode())[1])
    names = ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_requests_running"]

    def scrape(*texts):
        return [(name, {"model_name": "m"}, text, False) for name, text in zip(names, texts)]
    assert promseries._columns(values, 25.0, known) == {40.0: scrape("3", "NaN", "+Inf")}
    assert promseries._columns(values, 40.0, known) == {}
    assert promseries._columns(values, 10.0, known) == {40.0: scrape("3", "NaN", "+Inf"), 25.0: scrape("2", "1", "5")}


@pytest.mark.parametrize("series", [
    ['[10,"1"],[25,"2"],[40,"3"]', '[25,"1"],[40,"2"]', '[10,"5"],[25,"5"],[40,"6"]'],  # a series with fewer samples
    ['[10,"1"],[25,"2"],[40,"3"]', '[10,"1"],[25,"2"],[41,"3"]', '[10,"5"],[25,"5"],[40,"6"]'],  # newest times differ
    ['[10,"1"],[25,"2"],[40,"3"]', '[10,"1"],[26,"2"],[40,"3"]', '[10,"5"],[25,"5"],[40,"6"]'],  # older times differ
    ['[10,"1"],[25,"],[2"],[40,"3"]', '[10,"1"],[25,"2"],[40,"3"]', '[10,"5"],[25,"5"],[40,"6"]'],  # a value holding the separator
    ['[10,"1"],[nan,"2"],[40,"3"]', '[10,"1"],[25,"2"],[40,"3"]', '[10,"5"],[25,"5"],[40,"6"]'],  # a time JSON has not
    ['[10,"1"],[25,"2"],[1e999,"3"]', '[10,"1"],[25,"2"],[1e999,"3"]', '[10,"5"],[25,"5"],[1e999,"6"]'],
    ['[10,"1"],[25,"2"],[40,"3"x"]', '[10,"1"],[25,"2"],[40,"3"]', '[10,"5"],[25,"5"],[40,"6"]'],  # a value with a quote inside
    ['[10,"1"],[25,"2"],[40,3]', '[10,"1"],[25,"2"],[40,"3"]', '[10,"5"],[25,"5"],[40,"6"]'],  # a value that is no string
], ids=["fewer-samples", "newest-times-differ", "older-times-differ", "separator-in-a-value", "nan-time", "huge-time", "quote-in-a-value", "number-value"])
@pytest.mark.parametrize("newer", [{"a": 25.0}, {"a": 40.0}])
def test_a_pod_the_scrape_reading_does_not_judge_is_read_as_the_decoder_reads_it(series, newer):
    import json
    from exporter.discovery.targets import DiscoveryError
    body = _regular(series)
    try:
        expected = promseries.pods(json.loads(body), "pod", "test", newer)
    except (ValueError, DiscoveryError):
        with pytest.raises(DiscoveryError):
            promseries.pods_of_answer(body, "pod", "test", newer, promseries.PodMemo())
    else:
        assert promseries.pods_of_answer(body, "pod", "test", newer, promseries.PodMemo()) == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["vllm-0", "vllm-1", "", "a]]},{\"metric\":"]),
                          st.sampled_from(["vllm:prefix_cache_queries_total", "vllm:num_requests_running", "process_start_time_seconds"]),
                          st.dictionaries(st.sampled_from(["model_name", "le", "zone", "pod_x", "metric"]),
                                          st.text(alphabet=st.sampled_from(list('ab,:"[]{}\\ é0.')), max_size=6), max_size=3),
                          st.lists(st.tuples(st.sampled_from([100.0, 100.5, 115.25]), st.sampled_from(["1", "2.5", "NaN", "+Inf", "x"])),
                                   min_size=1, max_size=3, unique_by=lambda v: v[0])),
                min_size=1, max_size=6),
       st.booleans(), st.sampled_from([{}, {"vllm-0": 100.0}, {"vllm-1": 115.25}]))
def test_reading_the_text_equals_decoding_it_whatever_the_labels_hold(series, ascii_only, newer):
    """Label values holding the layout's own tokens, quotes, backslashes or other scripts:
    the text read (or decoded whole where it cannot be) gives what pods() gives, with a
    fresh memo and with one that learnt the same answer before."""
    import json
    result = [{"metric": {"__name__": name, **labels, **({"pod": pod} if pod else {}), "instance": "i:1"},
               "values": [[t, v] for t, v in sorted(values)]} for pod, name, labels, values in series]
    body = _compact({"status": "success", "data": {"resultType": "matrix", "result": result}}, ensure_ascii=ascii_only)
    present = set()
    try:
        expected = promseries.pods(json.loads(body), "pod", "test", newer, present)
    except Exception as exc:  # noqa: BLE001 - the same error either way
        with pytest.raises(type(exc)):
            promseries.pods_of_answer(body, "pod", "test", newer)
        return
    memo = promseries.PodMemo()
    for _ in range(2):  # learning, then with what it learnt
        named = set()
        assert promseries.pods_of_answer(body, "pod", "test", newer, memo, named) == expected
        assert named == present >= set(expected)  # the pods with series, new samples or none


def test_a_read_goes_part_by_part_and_a_failed_part_waits_for_the_next_read():
    """Each part's pods are polled and fed as its answer comes; a part that fails ends the
    read (the source is failing), what the parts before it fed stays fed and is not fed
    again, and the next read brings the rest."""
    import json
    from urllib.parse import parse_qs, urlsplit
    from fakeserver import FakeServer, reply
    now = 20_000.0
    replicas = {name: simulator.Replica(name, simulator.Scenario(request_rate=4.0), start=now - 900, seed=i, model_names=[MODEL])
                for i, name in enumerate(("vllm-a", "vllm-z"))}
    bodies = {}
    for name, r in replicas.items():
        r.advance(now - 20)
        first = r.render()
        r.advance(now - 5)
        bodies[name] = {now - 20: first, now - 5: r.render()}
    failing = {"on": True}

    def query(h):
        asked = parse_qs(urlsplit(h.path).query)
        q, at = asked["query"][0], float(asked["time"][0])
        name = "vllm-z" if "!~" in q else "vllm-a"  # the last part takes the names the others do not
        if name == "vllm-z" and failing["on"] and at >= now - 20:  # the first read's slice that holds its samples
            return reply(h, 500, b'{"status":"error","error":"overloaded"}')
        # as Prometheus answers a range selector: nothing after the query's time
        reply(h, 200, json.dumps(answer_of({t: b for t, b in bodies[name].items() if t <= at}, {"job": "vllm", "pod": name})).encode())

    with FakeServer({"/api/v1/query": query}) as prom:
        raw = read_config(prom.base)
        raw["discovery"]["read_prometheus"]["partitions"] = 2
        state = State()
        poller = Poller(load(raw), state, clock=lambda: now)
        poller.reader.stepped = 0.0  # the read back's slices of a regular reach: its last `for` a second at a time is another test's
        try:
            poller.read()
            assert [v.target.name for v in state.targets() if v.up] == ["vllm-a"]
            assert dict(state.target("vllm-a").scrapes)["success"] == 2
            (source,) = [s for s in state.published.discovery if s.name == "read_prometheus"]
            assert not source.ok and "overloaded" in source.error
            failing["on"] = False
            poller.read()
            assert sorted(v.target.name for v in state.targets() if v.up) == ["vllm-a", "vllm-z"]
            assert dict(state.target("vllm-a").scrapes)["success"] == 2  # its samples were fed once
            assert dict(state.target("vllm-z").scrapes)["success"] == 2
            (source,) = [s for s in state.published.discovery if s.name == "read_prometheus"]
            assert source.ok and len(source.targets) == 2
        finally:
            poller.stop(0.5)


@pytest.mark.parametrize("left_open", [False, True], ids=["prometheus-2-closed-ranges", "prometheus-3-left-open-ranges"])
def test_a_long_read_is_asked_in_slices_of_a_regular_reads_reach_and_feeds_every_scrape_once_in_order(left_open):
    """The first read reaches 5 minutes back: at poll_interval 15 s it is asked in 7 slices
    of about 43 s (a regular read's reach, 45 s), oldest first, so no answer holds more
    than a regular read's samples; every scrape of the 5 minutes is fed once, in time
    order, a scrape on the edge of two slices too (a range holds both its ends before
    Prometheus 3, only its end from 3 on). The next read is one query a part again."""
    import json
    import re
    from urllib.parse import parse_qs, urlsplit
    from fakeserver import FakeServer, reply
    now = 20_000.0
    replica = simulator.Replica("vllm-a", simulator.Scenario(request_rate=4.0), start=now - 900, seed=3, model_names=[MODEL])
    times = [now - 300 + 15 * k for k in range(1, 21)] + [round(now - 300 + 300 / 7, 3)]  # every 15 s, and one on the first slice's end
    bodies = {}
    for t in sorted(times):
        replica.advance(t)
        bodies[t] = replica.render()
    asked, largest = [], [0]

    def query(h):
        q = parse_qs(urlsplit(h.path).query)
        at, span = float(q["time"][0]), float(re.search(r"\[(\d+)s\]$", q["query"][0]).group(1))
        asked.append((at, span))
        inside = {t: b for t, b in bodies.items() if (at - span < t if left_open else at - span <= t) and t <= at}
        largest[0] = max(largest[0], len(inside))
        reply(h, 200, json.dumps(answer_of(inside, {"job": "vllm", "pod": "vllm-a"})).encode())

    clock = [now]
    with FakeServer({"/api/v1/query": query}) as prom:
        raw = read_config(prom.base)
        raw["global"]["poll_interval"] = "15s"
        state = State()
        poller = Poller(load(raw), state, clock=lambda: clock[0])
        assert poller.reader.read_back == load(raw).anchored_seconds + 60  # what the rules look back on (read back on a restart)
        poller.reader.read_back = 300.0  # 5 minutes here: the slicing is what this test is about
        poller.reader.stepped = 0.0  # and no tail stepped at poll_interval (the next test's)
        try:
            poller.read()
            assert len(asked) == 7 and [a for a, _ in asked] == sorted(a for a, _ in asked) and asked[-1][0] == now
            assert all(40 <= span <= 44 for _, span in asked) and largest[0] <= 4  # a regular read's 45 s hold 3 or 4 scrapes
            assert dict(state.target("vllm-a").scrapes)["success"] == len(bodies)  # every scrape once, the edge's too
            assert state.target("vllm-a").up
            asked.clear()
            bodies[now + 15] = replica.render()
            clock[0] = now + 15
            poller.read()
            assert len(asked) == 1 and asked[0] == (now + 15, 45.0)
            assert dict(state.target("vllm-a").scrapes)["success"] == len(bodies)
        finally:
            poller.stop(0.5)


def test_a_read_back_steps_its_last_for_a_poll_interval_at_a_time_and_the_rest_in_a_regular_reads_reach():
    """The slices of a read back meet end to end, oldest first, up to now: those of the
    last `stepped` seconds (whole poll intervals) one interval each, as the live rules were
    evaluated, the time before in spans of about a regular read's reach (45 s at 15 s).
    By default `stepped` is the longest `for` or keep_firing_for of the enabled rules."""
    from exporter.poll.promread import PrometheusReader
    cfg = load(read_config("http://prometheus:9090"))
    assert cfg.rules.longest_hold == 300.0  # router_prediction_gap's `for`
    off = load({**read_config("http://prometheus:9090"), "rules": {"router_prediction_gap": {"enabled": False}}})
    assert off.rules.longest_hold == 180.0  # counters_disagree's
    reader = PrometheusReader(cfg.discovery, 15.0, 2160.0, cfg.rules.longest_hold)
    try:
        for reach, stepped, coarse, fine in ((300.0, 60.0, 5, 4), (300.0, 0.0, 7, 0), (2160.0, 300.0, 41, 20), (45.0, 300.0, 0, 3),
                                             (300.0, 20.0, 6, 1)):
            cuts = reader.slices(20_000.0, reach, stepped)
            assert len(cuts) == coarse + fine, (reach, stepped, cuts)
            assert [span for _, span in cuts[coarse:]] == [15.0] * fine
            assert all(40.0 <= span <= 50.0 for _, span in cuts[:coarse])
            assert cuts[-1][0] == 20_000.0 and abs(cuts[0][0] - cuts[0][1] - (20_000.0 - reach)) < 1e-6
            assert all(abs(b_at - b_span - a_at) < 1e-6 for (a_at, _), (b_at, b_span) in zip(cuts, cuts[1:]))
    finally:
        reader.close()


def test_a_read_reaches_30_s_past_the_last_one_and_back_to_a_lagging_fleets_next_scrapes():
    """A read reaches 30 s past the last one (scrapes are committed late), and further
    where the pods that were sending at the last read lag more than a scrape interval
    explains: a store that commits every scrape late. It then reaches each such pod's next
    scrape (an interval after its newest sample read, with half an interval's slack).
    Only pods within a scrape interval of the median age widen it, so a pod that stopped
    or went stale does not, and a part of the fleet behind another lag keeps the 30 s (a
    first version without the 30 s lost such pods). Never less than the 30 s margin."""
    from exporter.poll.promread import PrometheusReader
    now = 10_000.0
    reader = PrometheusReader(load(read_config("http://127.0.0.1:9")).discovery, 15.0)
    last = reader.last_read = now - 15

    def reached(pods: dict[str, float], gap: float = 15.0) -> float:
        reader.newest, reader.gap = dict(pods), dict.fromkeys(pods, gap)
        reach = reader.reach(now)
        assert reach >= now - reader.last_read + 30  # never short of the margin
        return reach

    try:
        fleet = {f"vllm-{k}": last - k % 15 for k in range(100)}  # scraped every 15 s at their own offsets
        assert reached(fleet) == 15 + 30
        stopped = {**fleet, **{f"stopped-{k}": last - 31 - k for k in range(10)}, "gone": last - 46}  # a rollout; stale
        assert reached(stopped) == 15 + 30
        lagging = {name: t - 25 for name, t in fleet.items()}  # a store that commits every scrape 25 s late
        reach = reached(lagging)
        assert reach == 15 + 25 + 14 - 7.5 and all(t + 15 > now - reach for t in lagging.values())  # each next scrape
        assert reached({name: t - 50 for name, t in fleet.items()}) == 15 + 30  # 50 s: stale after the default 45 s
        mixed = {**{f"a-{k}": last - k % 15 for k in range(80)}, **{f"b-{k}": last - 25 - k % 15 for k in range(20)}}
        reach = reached(mixed)  # a fifth behind a store 25 s late: the margin
        assert reach == 15 + 30 and all(t + 15 > now - reach for t in mixed.values())
        assert reached({name: t - 60 for name, t in mixed.items()}) == 15 + 30  # a stall: every pod stale at the last read
        every_minute = {f"m-{k}": last - k % 60 for k in range(120)}  # Prometheus scrapes every 60 s: no lag
        assert reached(every_minute, 60.0) == 15 + 30
        rolling = {**every_minute, **{f"old-{k}": last - 60 - k for k in range(10)}}  # stopped in a rollout, or a scrape missed
        assert reached(rolling, 60.0) == 15 + 32  # a little (a whole interval over the median: 15 + 39)
        lagging = {name: t - 50 for name, t in every_minute.items()}  # the same fleet behind a store 50 s late
        reader.read = replace(reader.read, stale_after=180.0)
        reach = reached(lagging, 60.0)
        assert reach == 15 + 50 + 59 - 30 and all(t + 60 > now - reach for t in lagging.values())
        reader.read = replace(reader.read, stale_after=0.0)
        reader.last_read = now - 40  # a read failed between: from the last whole read, behind a store 25 s late
        behind = {name: t - 25 - 25 for name, t in fleet.items()}
        reach = reached(behind)
        assert reach == 40 + 25 + 14 - 7.5 and all(t + 15 > now - reach for t in behind.values())
        reader.read = replace(reader.read, stale_after=180.0)  # stale_after raised over a store's longer lag
        for lag in (50.0, 100.0):
            behind = {name: t - lag - 25 for name, t in fleet.items()}
            reach = reached(behind)
            assert reach == 40 + lag + 14 - 7.5 and all(t + 15 > now - reach for t in behind.values())
        reader.last_read = now - 400
        assert reader.reach(now) == 300.0  # never past MAX_RANGE
        reader.last_read = None
        assert reader.reach(now) == 300.0  # the first read
    finally:
        reader.close()


@pytest.mark.parametrize("left_open", [False, True], ids=["prometheus-2-closed-ranges", "prometheus-3-left-open-ranges"])
@pytest.mark.parametrize("lag,stale_after", [(0.0, None), (20.0, None), (29.0, None), (50.0, "2m")])
@pytest.mark.parametrize("offset", [1.0, 7.25, 12.0])
def test_a_pod_whose_scrapes_a_store_commits_late_is_fed_every_scrape_once(lag, stale_after, offset, left_open):
    """A store that commits every scrape `lag` seconds after it was taken (remote write
    into a store that lags), read every 15 s: every scrape is fed once and the pod stays
    up, up to a lag of an interval under the default stale_after (45 s), and beyond with a
    longer one. A read that reached only 30 s past the last one lost every scrape
    committed later than that; a first version of the reach judged a pod sending by its
    age at this read, not the last, and lost the pod for good from a lag of 20 s."""
    import json
    import re
    from urllib.parse import parse_qs, urlsplit
    from fakeserver import FakeServer, reply
    now = 20_000.0
    replica = simulator.Replica("vllm-a", simulator.Scenario(request_rate=4.0), start=now - 900, seed=5, model_names=[MODEL])
    bodies = {}
    for k in range(1, 41):  # 10 minutes of scrapes every 15 s, at an offset of their own
        t = now - 300 + 15 * k + offset
        replica.advance(t)
        bodies[t] = replica.render()

    def query(h):
        q = parse_qs(urlsplit(h.path).query)
        at, span = float(q["time"][0]), float(re.search(r"\[(\d+)s\]$", q["query"][0]).group(1))
        committed = {t: b for t, b in bodies.items() if (at - span < t if left_open else at - span <= t) and t <= at
                     and t + lag <= clock[0]}
        reply(h, 200, json.dumps(answer_of(committed, {"job": "vllm", "pod": "vllm-a"})).encode())

    clock = [now]
    with FakeServer({"/api/v1/query": query}) as prom:
        raw = read_config(prom.base)
        raw["global"]["poll_interval"] = "15s"
        if stale_after:
            raw["discovery"]["read_prometheus"]["stale_after"] = stale_after
        state = State()
        poller = Poller(load(raw), state, clock=lambda: clock[0])
        try:
            for _ in range(24):
                poller.read()
                assert state.target("vllm-a").up
                clock[0] += 15
            fed = [t for t in bodies if t + lag <= clock[0] - 15]
            assert dict(state.target("vllm-a").scrapes)["success"] == len(fed)
            assert state.target("vllm-a").up and state.target("vllm-a").last_scrape_time == max(fed)
        finally:
            poller.stop(0.5)


def test_a_prometheus_that_answers_with_no_series_of_ours_says_so_once(caplog):
    """An empty matrix every read: the source works, nothing matches; once that lasted
    accept_empty_after (a Prometheus that just started has scraped nothing yet), one
    warning names the selector, as discovery.prometheus's does."""
    import json
    from fakeserver import FakeServer, reply

    empty = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()
    with FakeServer({"/api/v1/query": lambda h: reply(h, 200, empty)}) as prom:
        state = State()
        now = [20_000.0]
        poller = Poller(load(read_config(prom.base)), state, clock=lambda: now[0])
        try:
            with caplog.at_level("WARNING"):
                poller.read()
                now[0] += 300
                poller.read()
                assert not [r for r in caplog.records if "no series of the engines matches" in r.getMessage()]
                for _ in range(2):
                    now[0] += 300
                    poller.read()
            (source,) = [s for s in state.published.discovery if s.name == "read_prometheus"]
            assert source.ok and not source.matched_ever and not source.targets
        finally:
            poller.stop(0.5)
    said = [r.getMessage() for r in caplog.records if "no series of the engines matches" in r.getMessage()]
    assert len(said) == 1 and '{job="vllm"}' in said[0], said


def test_a_sidecar_freezes_what_a_read_leaves_and_collects_its_cycles_at_the_full_collection(monkeypatch):
    """With freeze_reads (the sidecar's process), the collector waits for the whole read
    and what the read left is frozen, not walked; a cycle frozen that way and dropped
    later is collected by the full collection every FULL_COLLECTION_EVERY reads."""
    import gc
    import json
    import weakref
    from fakeserver import FakeServer, reply
    from exporter.poll import promread
    now = [20_000.0]
    replica = simulator.Replica("vllm-a", simulator.Scenario(request_rate=4.0), start=now[0] - 900, seed=1, model_names=[MODEL])

    def query(h):
        replica.advance(now[0] - 1)
        reply(h, 200, json.dumps(answer_of({now[0] - 1: replica.render()}, {"job": "vllm", "pod": "vllm-a"})).encode())

    class Node:
        pass

    monkeypatch.setattr(promread, "FULL_COLLECTION_EVERY", 3)
    with FakeServer({"/api/v1/query": query}) as prom:
        state = State()
        poller = Poller(load(read_config(prom.base)), state, clock=lambda: now[0])
        try:
            frozen = gc.get_freeze_count()
            poller.read()  # not the sidecar's process: the collector is left as it is
            assert gc.get_freeze_count() == frozen and gc.isenabled()
            poller.freeze_reads = True
            cycle = Node()
            cycle.me = cycle
            gone = weakref.ref(cycle)
            now[0] += 15
            poller.read()
            assert gc.isenabled() and gc.get_freeze_count() > frozen
            assert state.target("vllm-a").up
            del cycle
            gc.collect()
            assert gone() is not None  # frozen: no collection sees it
            now[0] += 15
            poller.read()
            assert gone() is not None and poller.reads_frozen == 2
            now[0] += 15
            poller.read()  # the third: the full collection
            assert gone() is None and gc.isenabled() and gc.get_freeze_count() > 0
            assert dict(state.target("vllm-a").scrapes)["success"] == 4
        finally:
            poller.stop(0.5)
            gc.unfreeze()


def test_a_long_reads_slices_count_a_pods_dropped_labels_once():
    """The limits' drops are counted by pod and read, as one query a part counted them: a
    first read asked in 7 slices learns a pod 7 times, and its label over label_limit is
    one dropped label, not 7. Answers in Prometheus's layout: the next read, whose pod
    labels the memo hands out again, counts the drop again; a pod whose labels changed
    gets the new ones."""
    import re
    from urllib.parse import parse_qs, urlsplit
    from fakeserver import FakeServer, reply
    now = 20_000.0
    replica = simulator.Replica("vllm-a", simulator.Scenario(request_rate=4.0), start=now - 900, seed=3, model_names=[MODEL])
    bodies = {}
    for k in range(1, 21):
        replica.advance(now - 300 + 15 * k)
        bodies[now - 300 + 15 * k] = replica.render()
    asked = []

    def query(h):
        q = parse_qs(urlsplit(h.path).query)
        at, span = float(q["time"][0]), float(re.search(r"\[(\d+)s\]$", q["query"][0]).group(1))
        asked.append(at)
        inside = {t: b for t, b in bodies.items() if at - span < t <= at}
        reply(h, 200, _compact(answer_of(inside, {"job": "vllm", "pod": "vllm-a", **pod_labels})))

    pod_labels = {"version": "v1", "zone": "z1"}
    clock = [now]
    with FakeServer({"/api/v1/query": query}) as prom:
        raw = read_config(prom.base, label_limit=3)  # job, pod, version and zone: one over
        raw["global"]["poll_interval"] = "15s"
        state = State()
        poller = Poller(load(raw), state, clock=lambda: clock[0])
        poller.reader.read_back, poller.reader.stepped = 300.0, 0.0  # 5 minutes: 7 slices
        try:
            poller.read()
            (source,) = [s for s in state.published.discovery if s.name == "read_prometheus"]
            assert len(asked) == 7 and source.ok and source.dropped == (("label_limit", 1),)
            assert dict(state.target("vllm-a").scrapes)["success"] == len(bodies)
            assert dict(state.target("vllm-a").target.labels)["version"] == "v1"
            for version in ("v1", "v2"):
                pod_labels["version"] = version
                clock[0] += 15
                replica.advance(clock[0] - 1)
                bodies[clock[0] - 1] = replica.render()
                poller.read()
                (source,) = [s for s in state.published.discovery if s.name == "read_prometheus"]
                assert source.dropped == (("label_limit", 1),)
                assert dict(state.target("vllm-a").target.labels)["version"] == version
            assert dict(state.target("vllm-a").scrapes)["success"] == len(bodies)
            assert "vllm-a" in poller.reader.memo.pods and "vllm-a" in poller.reader.learnt
        finally:
            poller.stop(0.5)


def test_a_pod_gone_from_prometheus_for_accept_empty_after_is_forgotten_with_all_the_reader_kept_of_it():
    """Everything the reader keeps by pod (its newest sample, its interval, its target, its
    labels' memo and what they were bounded to) goes when the pod is forgotten."""
    from fakeserver import FakeServer, reply
    clock = [20_000.0]
    replicas = {name: simulator.Replica(name, simulator.Scenario(request_rate=4.0), start=clock[0] - 900, seed=i, model_names=[MODEL])
                for i, name in enumerate(("vllm-a", "vllm-b"))}
    serving = set(replicas)

    def query(h):
        answer = {"status": "success", "data": {"resultType": "matrix", "result": []}}
        for name in sorted(serving):
            replicas[name].advance(clock[0] - 1)
            answer["data"]["result"] += answer_of({clock[0] - 1: replicas[name].render()}, {"job": "vllm", "pod": name})["data"]["result"]
        reply(h, 200, _compact(answer))

    with FakeServer({"/api/v1/query": query}) as prom:
        poller = Poller(load(read_config(prom.base, accept_empty_after="30s")), State(), clock=lambda: clock[0])
        reader = poller.reader
        kept = lambda: [set(m) for m in (reader.newest, reader.gap, reader.targets, reader.memo.pods, reader.learnt)]
        try:
            for _ in range(2):
                poller.read()
                clock[0] += 15
            assert kept() == [{"vllm-a", "vllm-b"}] * 5
            serving.discard("vllm-b")
            for _ in range(4):  # 60 s without a sample of vllm-b
                poller.read()
                clock[0] += 15
            assert kept() == [{"vllm-a"}] * 5
        finally:
            poller.stop(0.5)


def test_reads_that_keep_failing_keep_no_more_layouts_than_one_reads():
    """The memo keeps the layouts of the answers of the last read; a read that fails settles
    it too, so a source that keeps failing while pods change does not grow it."""
    from exporter.poll.promread import PrometheusReader
    reader = PrometheusReader(load(read_config("http://127.0.0.1:9")).discovery, 15.0)
    for pod in ("a", "b", "c"):
        body = (PROLOGUE + '{"metric":{"__name__":"x","pod":"%s"},"values":[[1,"5"]]}]}}' % pod).encode()
        promseries.pods_of_answer(body, "pod", "test", {}, reader.memo)
    assert len(reader.memo.layouts) == 3
    reader.failed(100.0, "overloaded")  # this read's answers: kept for the next
    assert len(reader.memo.layouts) == 3
    reader.failed(115.0, "overloaded")  # a read that read nothing
    assert reader.memo.layouts == {} and reader.memo.used == set()
    reader.close()


def test_a_reload_that_flips_reexport_engine_series_keeps_the_reader_and_changes_what_is_exported():
    """The reader and what it read stay (a new reader would show the source as not yet
    refreshed); the vLLM pods' own series come back, and go again."""
    from fakeserver import FakeServer, reply
    clock = [20_000.0]
    replica = simulator.Replica("vllm-a", simulator.Scenario(request_rate=4.0), start=clock[0] - 900, seed=1, model_names=[MODEL])

    def query(h):
        replica.advance(clock[0] - 1)
        reply(h, 200, _compact(answer_of({clock[0] - 1: replica.render()}, {"job": "vllm", "pod": "vllm-a"})))

    with FakeServer({"/api/v1/query": query}) as prom:
        state = State()
        cfg = read_config(prom.base)
        poller = Poller(load(cfg), state, clock=lambda: clock[0])
        reader = poller.reader
        try:
            exported = []
            for reexport in (False, True, False):
                cfg["discovery"]["read_prometheus"]["reexport_engine_series"] = reexport
                poller.reload(load(cfg))
                poller.read()
                clock[0] += 15
                text = generate_latest(registry_of(state)).decode()
                exported.append(("prefixcache_vllm_time_to_first_token_seconds_bucket{" in text,
                                 "prefixcache_vllm_prefix_cache_queries_total{" in text))
            assert poller.reader is reader
            assert exported == [(False, True), (True, True), (False, True)]
        finally:
            poller.stop(0.5)


def test_a_reload_that_selects_other_pods_forgets_those_left_out_at_once_and_keeps_the_rest_and_their_history(caplog):
    """match_labels changed from {namespace: one} to {team: t}: vllm-a, selected no more, is
    forgotten by the first read after the reload (its target goes; judged stale instead it
    went down, a false TargetDown of every pod of the old selection), vllm-b, in both, keeps
    its target and history even when that read brings it no new sample, vllm-c comes."""
    from urllib.parse import parse_qs, urlsplit
    from fakeserver import FakeServer, reply
    clock = [20_000.0]
    labels = {"vllm-a": {"namespace": "one", "team": "u"}, "vllm-b": {"namespace": "one", "team": "t"},
              "vllm-c": {"namespace": "two", "team": "t"}, "vllm-d": {"namespace": "one", "team": "t"}}
    stopped = set()  # pods whose series stopped: a pod down before the reload, in both selections
    replicas = {name: simulator.Replica(name, simulator.Scenario(request_rate=4.0), start=clock[0] - 900, seed=i, model_names=[MODEL])
                for i, name in enumerate(labels)}

    def query(h):
        selector = parse_qs(urlsplit(h.path).query)["query"][0]
        answer = {"status": "success", "data": {"resultType": "matrix", "result": []}}
        for name, own in labels.items():
            matchers = dict(re.findall(r'(namespace|team)="([^"]*)"', selector))
            if name not in stopped and all(own.get(k) == v for k, v in matchers.items()):
                replicas[name].advance(clock[0] - 1)
                scrape = answer_of({clock[0] - 1: replicas[name].render()}, {"job": "vllm", "pod": name, **own})
                answer["data"]["result"] += scrape["data"]["result"]
        reply(h, 200, _compact(answer))

    with FakeServer({"/api/v1/query": query}) as prom:
        state = State()
        cfg = read_config(prom.base)
        cfg["discovery"]["read_prometheus"]["match_labels"] = {"namespace": "one"}
        poller = Poller(load(cfg), state, clock=lambda: clock[0])
        try:
            for _ in range(3):
                poller.read()
                clock[0] += 15
            stopped.add("vllm-d")
            for _ in range(4):  # 60 s without a sample: down
                poller.read()
                clock[0] += 15
            assert {v.target.name for v in state.read().targets} == {"vllm-a", "vllm-b", "vllm-d"}
            assert not state.target("vllm-d").up
            samples_of_b = state.target("vllm-b").samples
            cfg["discovery"]["read_prometheus"]["match_labels"] = {"team": "t"}
            with caplog.at_level(logging.INFO, logger="exporter.poll.promread"):
                poller.reload(load(cfg))
                clock[0] -= 15  # read again at once: nothing new of vllm-b since the last read
                poller.read()
            # vllm-d, down and still selected, stays down: the read reaches too little back to tell it is not
            # selected, and forgotten its TargetDown would resolve
            assert {v.target.name for v in state.read().targets} == {"vllm-b", "vllm-c", "vllm-d"}
            assert not state.target("vllm-d").up
            assert state.target("vllm-b").samples is samples_of_b and state.target("vllm-b").up
            assert "1 pod(s) not in what the new configuration selects (vllm-a); forgotten" in caplog.text
            assert "vllm-a" not in poller.reader.newest and "vllm-a" not in poller.reader.targets
            clock[0] += 15
            poller.read()
            assert len(state.target("vllm-b").samples) == len(samples_of_b) + 1
            assert all(v.up for v in state.read().targets if v.target.name != "vllm-d")
            # a URL where nothing answers: the source fails, and never says it matches nothing
            good_url = cfg["discovery"]["read_prometheus"]["url"]
            cfg["discovery"]["read_prometheus"]["url"] = "http://127.0.0.1:9/"
            poller.reload(load(cfg))
            clock[0] += 15
            poller.read()
            (source,) = [s for s in state.read().published.discovery if s.name == "read_prometheus"]
            assert not source.ok and not source.answered and not source.matched_ever
            assert "prefixcache_discovery_matched_nothing" not in generate_latest(registry_of(state)).decode()
            cfg["discovery"]["read_prometheus"]["url"] = good_url
            # a selector that matches nothing: the pods that were sending leave, and the source says it matches nothing
            cfg["discovery"]["read_prometheus"]["match_labels"] = {"team": "nobody"}
            poller.reload(load(cfg))
            clock[0] += 15
            poller.read()
            assert {v.target.name for v in state.read().targets} == {"vllm-d"}  # down before, ageing as before
            (source,) = [s for s in state.read().published.discovery if s.name == "read_prometheus"]
            assert source.ok and source.answered and not source.matched_ever
            assert 'prefixcache_discovery_matched_nothing{source="read_prometheus"} 1.0' in generate_latest(registry_of(state)).decode()
        finally:
            poller.stop(0.5)


def test_pods_are_not_judged_by_the_time_prometheus_did_not_answer_and_one_that_died_meanwhile_goes_down():
    """Prometheus stopped for 2.5 minutes (it scraped nothing then either): no pod goes
    down while it fails (their last state is kept, as a ruler keeps its alerts while its
    queries fail), none at the first read once it answers again without a new sample yet
    (judged by the wall clock, every pod went down there, at every Prometheus restart),
    and a pod that stopped during the outage goes down once the source has answered
    stale_after without a sample of it."""
    from fakeserver import FakeServer, reply
    clock = [20_000.0]
    replicas = {name: simulator.Replica(name, simulator.Scenario(request_rate=4.0), start=clock[0] - 900, seed=i, model_names=[MODEL])
                for i, name in enumerate(("vllm-a", "vllm-b"))}
    newest = {}  # pod -> the time of its newest scrape Prometheus holds
    mode = {"down": False, "scraping": {"vllm-a", "vllm-b"}}

    def query(h):
        if mode["down"]:
            return reply(h, 503, b"Service Unavailable")
        answer = {"status": "success", "data": {"resultType": "matrix", "result": []}}
        for name in sorted(replicas):
            if name in mode["scraping"]:
                replicas[name].advance(clock[0] - 1)
                newest[name] = (clock[0] - 1, replicas[name].render())
            if name in newest:
                t, body = newest[name]
                answer["data"]["result"] += answer_of({t: body}, {"job": "vllm", "pod": name})["data"]["result"]
        reply(h, 200, _compact(answer))

    def down() -> set[str]:
        return {v.target.name for v in state.read().targets if not v.up}

    with FakeServer({"/api/v1/query": query}) as prom:
        state = State()
        cfg = read_config(prom.base)
        cfg["global"]["poll_interval"] = "15s"
        poller = Poller(load(cfg), state, clock=lambda: clock[0])
        try:
            for _ in range(3):
                poller.read()
                clock[0] += 15
            assert down() == set() and poller.reader.stale_after("vllm-a") == 45.0
            mode["down"], mode["scraping"] = True, set()  # Prometheus stops: no answer, no scrape
            for k in range(10):
                poller.read()
                assert down() == set()
                clock[0] += 15
                if k == 5:  # a reload meanwhile (a new reader): it still knows the source failed
                    cfg["discovery"]["read_prometheus"]["timeout"] = "7s"
                    poller.reload(load(cfg))
            mode["down"] = False  # back, and not one scrape made yet
            poller.read()
            assert down() == set()
            mode["scraping"] = {"vllm-a"}  # it scrapes again; vllm-b stopped during the outage
            judged = []
            for _ in range(5):
                clock[0] += 15
                poller.read()
                judged.append(down())
            assert judged == [set(), set(), {"vllm-b"}, {"vllm-b"}, {"vllm-b"}]  # 45 s of answers without vllm-b
        finally:
            poller.stop(0.5)


def test_a_target_label_the_series_do_not_have_is_said_once_not_silently_taken_for_instance(caplog):
    """A mistyped target_label named every pod by its instance: two pods behind one address
    were read as one, their samples mixed, with no word of why. It is said once, naming the
    label, however many pods and reads follow."""
    from exporter.poll.promread import PrometheusReader
    cfg = read_config("http://127.0.0.1:9")
    cfg["discovery"]["read_prometheus"]["target_label"] = "kubernetes_pod_name"
    reader = PrometheusReader(load(cfg).discovery, 15.0)
    result = [{"metric": {"__name__": "vllm:prefix_cache_queries_total", "model_name": MODEL, "pod": pod, "instance": "10.0.0.9:8000",
                          "job": "vllm"}, "values": [[100.0 + i, "5"]]} for i, pod in enumerate(("vllm-a", "vllm-b"))]
    answer = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    with caplog.at_level(logging.WARNING, logger="exporter.poll.promread"):
        for _ in range(2):
            pods = promseries.pods(answer, "kubernetes_pod_name", "test")
            assert list(pods) == ["10.0.0.9:8000"]  # the fallback stands: a source with no pod label reads by address
            reader.learn(pods)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("read_prometheus: the series of 10.0.0.9:8000 have no 'kubernetes_pod_name' label "
                           "(read_prometheus.target_label), so it is named by its instance")
    reader.close()
    quiet = PrometheusReader(load(read_config("http://127.0.0.1:9")).discovery, 15.0)  # target_label: pod, which they have
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="exporter.poll.promread"):
        quiet.learn(promseries.pods(answer, "pod", "test"))
    assert not caplog.records
    quiet.close()


def test_pods_of_one_name_in_two_namespaces_are_two_pods_the_first_keeping_the_name():
    """A StatefulSet's vllm-0 in prod and in staging, read from one Prometheus: named by
    `pod` alone they were one pod whose scrapes alternated between the two, their counters
    stepping back and forth. The first namespace seen keeps the name, the other's is
    vllm-0@staging, and both keep their names whatever comes or goes."""
    from exporter.poll.promread import PrometheusReader
    clock = 20_000.0
    replicas = {ns: simulator.Replica(f"vllm-0-{ns}", simulator.Scenario(request_rate=rate), start=clock - 900, seed=i,
                                      model_names=[MODEL]) for i, (ns, rate) in enumerate((("prod", 8.0), ("staging", 1.0)))}

    def answer(at: float, namespaces) -> bytes:
        result = []
        for ns in namespaces:
            replicas[ns].advance(at - 1)
            result += answer_of({at - 1: replicas[ns].render()}, {"job": "vllm", "pod": "vllm-0", "namespace": ns})["data"]["result"]
        result.sort(key=lambda s: sorted(s["metric"].items()))  # as Prometheus orders them: prod first
        return _compact({"status": "success", "data": {"resultType": "matrix", "result": result}})

    reader = PrometheusReader(load(read_config("http://127.0.0.1:9")).discovery, 15.0)
    for k in range(3):
        body = answer(clock + 15 * k, ("prod", "staging"))
        ours = promseries.pods_of_answer(body, "pod", "test", reader.newest, reader.memo)
        import json
        assert ours == promseries.pods(json.loads(body), "pod", "test", reader.newest)  # the decoder names them alike
        assert sorted(ours) == ["vllm-0", "vllm-0@staging"]
        assert ours["vllm-0"].labels["namespace"] == "prod" and ours["vllm-0@staging"].labels["namespace"] == "staging"
        for name, pod in ours.items():
            assert len(pod.times) == 1  # one scrape each, not the two pods' scrapes in one
            snapshot = pod.snapshot(max(pod.times))
            assert not snapshot.warnings
            reader.read_samples(pod)
        reader.memo.settle()
    # prod's vllm-0 goes: staging's keeps its name, and a third namespace's vllm-0 takes the free one
    reader.update(clock + 60 + reader.cfg.accept_empty_after, {"vllm-0@staging"})
    assert "vllm-0" not in reader.newest and reader.memo.names.name("vllm-0", "staging") == "vllm-0@staging"
    assert reader.memo.names.name("vllm-0", "dev") == "vllm-0"
    reader.close()


def test_a_pod_silent_through_more_outages_than_are_kept_is_not_judged_by_them():
    """A Prometheus that failed 20 times in a row, answering 2 s between: a pod silent all
    along was silent 40 s of the time it answered, under its 45 s. With the oldest
    outages dropped it was stale (judged by 400 s the source failed); the closest merge."""
    from exporter.poll.promread import MAX_OUTAGES, PrometheusReader, _with_outage
    reader = PrometheusReader(load(read_config("http://127.0.0.1:9")).discovery, 15.0)
    start = 10_000.0
    reader.newest["vllm-0"], reader.gap["vllm-0"] = start, 15.0  # its stale_after: 3 intervals, 45 s
    spans = [(start + 102 * k + 2, start + 102 * (k + 1)) for k in range(20)]
    for span in spans:
        reader.outages = _with_outage(reader.outages, span, span[1], 3600.0)
    now = spans[-1][1]
    assert len(reader.outages) == MAX_OUTAGES and reader.outages[0][0] == spans[0][0] and reader.outages[-1] == spans[-1]
    assert reader.stale(now) == {} and reader.stale(now + 13) == {}
    # 46 s of answered time without a sample, less the 8 s between the outages that became one
    assert reader.stale(now + 14) == {"vllm-0": start}
    # those that ended longer ago than kept go first
    assert _with_outage([(0.0, 10.0), (20.0, 30.0)], (40.0, 50.0), 50.0, 25.0) == [(20.0, 30.0), (40.0, 50.0)]
    reader.close()


def test_a_name_given_to_a_pod_never_read_goes_at_the_next_whole_read():
    """A read that fails after its answers named their pods, and before it read them: a pod
    not seen again would keep its name for ever (and a later pod of its name in another
    namespace would be name@namespace). One in this read's answers keeps it."""
    from exporter.poll.promread import PrometheusReader
    reader = PrometheusReader(load(read_config("http://127.0.0.1:9")).discovery, 15.0)
    assert reader.memo.names.name("vllm-9", "prod") == "vllm-9"  # named, never read
    reader.memo.names.name("vllm-8", "prod")
    reader.present.add("vllm-8")  # in this read's answers, no sample newer than those read
    reader.update(1000.0, set())
    assert reader.memo.names.owner == {"vllm-8": ("vllm-8", "prod")}
    assert reader.memo.names.name("vllm-9", "staging") == "vllm-9"
    reader.close()


def test_pods_of_one_name_in_two_namespaces_are_read_polled_and_up_as_two_targets():
    """Through the reader and the poller, not only the answer: a review found vllm-0@staging
    made a target named `staging` (the name cut at its @ as an instance's user:pass@), whose
    samples no pod was fed, never up."""
    from fakeserver import FakeServer, reply
    clock = [20_000.0]
    pods = [("vllm-0", "prod"), ("vllm-0", "staging"), ("vllm-1", "staging")]
    replicas = {p: simulator.Replica("-".join(p), simulator.Scenario(request_rate=4.0), start=clock[0] - 900, seed=i,
                                     model_names=[MODEL]) for i, p in enumerate(pods)}

    def query(h):
        result = []
        for (pod, ns), replica in replicas.items():
            replica.advance(clock[0] - 1)
            result += answer_of({clock[0] - 1: replica.render()}, {"job": "vllm", "pod": pod, "namespace": ns})["data"]["result"]
        result.sort(key=lambda s: sorted(s["metric"].items()))
        reply(h, 200, _compact({"status": "success", "data": {"resultType": "matrix", "result": result}}))

    with FakeServer({"/api/v1/query": query}) as prom:
        state = State()
        poller = Poller(load(read_config(prom.base, target_limit=0)), state, clock=lambda: clock[0])
        try:
            for _ in range(4):
                poller.read()
                clock[0] += 15
            views = {v.target.name: v for v in state.read().targets}
            assert sorted(views) == ["vllm-0", "vllm-0@staging", "vllm-1"]
            assert all(v.up and len(v.samples) == 4 for v in views.values())
            assert dict(views["vllm-0@staging"].target.labels)["namespace"] == "staging"
            assert dict(views["vllm-0"].target.labels)["namespace"] == "prod"
        finally:
            poller.stop(0.5)


def test_reads_staleness_and_windows_follow_prometheuss_time_not_a_steady_clock_ahead_of_it():
    """The wall clock stepped 600 s forward and NTP stepped it back: the sidecar's steady
    clock stays ahead for hours (it slews at 1%). Samples carry Prometheus's time, so the
    reads ask the wall clock's instant, no pod goes stale and the windows hold the samples."""
    from urllib.parse import parse_qs, urlsplit
    from exporter.steadyclock import SteadyClock
    from fakeserver import FakeServer, reply
    wall, mono = [30_000.0], [0.0]
    asked = []
    replica = simulator.Replica("vllm-a", simulator.Scenario(request_rate=4.0), start=wall[0] - 900, seed=3, model_names=[MODEL])

    def query(h):  # a Prometheus on another host: its clock never stepped
        asked.append(float(parse_qs(urlsplit(h.path).query)["time"][0]))
        scraped = 30_000.0 + mono[0] - 1
        replica.advance(scraped)
        reply(h, 200, _compact(answer_of({scraped: replica.render()}, {"job": "vllm", "pod": "vllm-a"})))

    with FakeServer({"/api/v1/query": query}) as prom:
        state = State()
        clock = SteadyClock(wall=lambda: wall[0], monotonic=lambda: mono[0])
        poller = Poller(load(read_config(prom.base)), state, clock=clock)
        try:
            def tick(step=15.0, jump=0.0):
                wall[0] += step + jump
                mono[0] += step
                clock()  # the notifier and the HTTP side read it every few seconds
                poller.read()
                poller.evaluate()
            for _ in range(4):
                tick()
            tick(jump=600.0)  # the step forward...
            tick(jump=-600.0)  # ...and NTP's correction: the steady clock is 600 s ahead now
            assert clock() - wall[0] > 500
            for _ in range(8):
                tick()
            assert asked[-1] == pytest.approx(wall[0], abs=1e-3)
            view = state.target("vllm-a")
            assert view.up, view.last_error
            assert view.stats[MODEL]["1m"].query_increase
            assert not [a for a in poller.engine.alerts.values() if a.alertname == "PrefixCacheTargetDown"]
        finally:
            poller.stop(0.5)


def _history_prometheus(bodies: dict[float, str], pod_labels: dict[str, str]):
    """A Prometheus that holds `bodies` (scrape time -> text) and answers any range of them."""
    import re
    from urllib.parse import parse_qs, urlsplit
    from fakeserver import FakeServer, reply

    parsed: dict[float, list] = {}  # scrape time -> its series, each body parsed once: a read back asks for each many times

    def query(h):
        q = parse_qs(urlsplit(h.path).query)
        at, span = float(q["time"][0]), float(re.search(r"\[(\d+)s\]$", q["query"][0]).group(1))
        series: dict[tuple, list] = {}
        for t in sorted(t for t in bodies if at - span < t <= at):
            if t not in parsed:
                parsed[t] = answer_of({t: bodies[t]}, pod_labels)["data"]["result"]
            for s in parsed[t]:
                series.setdefault(tuple(sorted(s["metric"].items())), []).extend(s["values"])
        reply(h, 200, _compact({"status": "success", "data": {"resultType": "matrix",
                                                              "result": [{"metric": dict(k), "values": v} for k, v in series.items()]}}))
    return FakeServer({"/api/v1/query": query})


@pytest.mark.parametrize("read_back, pages", [(None, True), (300.0, False)])
def test_a_restart_of_ours_mid_incident_reads_back_the_baseline_and_the_page_is_firing_at_the_first_evaluation(read_back, pages):
    """The prompt got its timestamp 10 minutes before our process started; Prometheus holds
    the 40 minutes before. The first read reads back what the rules look back on and steps
    the rules through it, so the drop alert is firing at once, anchored before the
    incident, its cause the prompt. Reading back 5 minutes (as before) it never came back:
    no baseline, and Alertmanager resolved the page at its endsAt while the ratio was 3%."""
    start = 50_000.0  # our process starts here
    replica = simulator.Replica("vllm-a", simulator.incident(3000.0, request_rate=5.0), start=start - 3600, seed=5, model_names=[MODEL])
    bodies = {}
    for k in range(161):  # every 15 s of the 40 minutes before our start
        t = start - 2400 + 15 * k
        replica.advance(t)
        bodies[t] = replica.render()
    with _history_prometheus(bodies, {"job": "vllm", "pod": "vllm-a"}) as prom:
        raw = read_config(prom.base)
        raw["global"].update(poll_interval="15s", min_query_tokens=1000)
        state = State()
        poller = Poller(load(raw), state, clock=lambda: start)
        if read_back is not None:
            poller.reader.read_back = read_back
        try:
            poller.read()
            poller.evaluate()
            drops = [a for a in poller.engine.alerts.values() if a.alertname == "PrefixCacheHitRateDropAfterDeploy"]
            if not pages:
                assert not [a for a in drops if a.state == "firing"]
                return
            assert [a.state for a in drops] == ["firing"]
            (alert,) = drops
            assert dict(alert.labels)["cause"] == "prompt_prefix_change"
            assert alert.active_at < start - 300  # raised when it happened, not at our start
            assert alert.baseline is not None and alert.baseline > 0.6 and alert.value < 0.2
        finally:
            poller.stop(0.5)


@pytest.mark.parametrize("after", [0.0, 15.0, 30.0, 60.0])
def test_a_restart_just_after_the_page_fired_finds_it_firing_at_the_first_evaluation_as_the_live_rules_had_it(after):
    """The live exporter fired the page; a restart `after` seconds later reads back. Its
    rules stepped only at the ends of slices of a regular read's reach (45 s at 15 s), a
    condition that began within the last slice went pending at the first live evaluation
    and fired `for` later: the page pending again after a restart 2 s after it fired (a
    real Prometheus and exporter process, tests/test_central_paging.py). The last
    `for` of the read back is stepped at poll_interval, as the live rules ran."""
    t0 = 60_000.0
    replica = simulator.Replica("vllm-a", simulator.incident(300.0 + 480.0, request_rate=5.0), start=t0 - 300, seed=5,
                                model_names=[MODEL])
    bodies = {}
    for k in range(1, 61):  # every 15 s of 15 minutes; the prompt changes at 8 minutes
        replica.advance(t0 + 15 * k)
        bodies[t0 + 15 * k] = replica.render()

    def drops(poller):
        return {a.state: dict(a.labels) for a in poller.engine.alerts.values() if a.alertname == "PrefixCacheHitRateDropAfterDeploy"}

    with _history_prometheus(bodies, {"job": "vllm", "pod": "vllm-a"}) as prom:
        raw = read_config(prom.base)
        raw["global"].update(poll_interval="15s", min_query_tokens=1000)
        clock = [t0 + 420.0]
        live = Poller(load(raw), State(), clock=lambda: clock[0])
        try:
            while "firing" not in drops(live) and clock[0] < t0 + 900:
                live.read()
                live.evaluate()
                clock[0] += 15
            fired = clock[0] - 15
            assert "firing" in drops(live) and fired > t0 + 480, (fired - t0, drops(live))
        finally:
            live.stop(0.5)
        clock[0] = fired + after
        restarted = Poller(load(raw), State(), clock=lambda: clock[0])
        try:
            restarted.read()
            restarted.evaluate()
            assert drops(restarted) == {"firing": drops(live)["firing"]}
        finally:
            restarted.stop(0.5)


# --- samples at times a range selector never answers, values out of order -----------------------
def _prometheus_of(replicas, clock, edit=lambda name, result: result, pod_labels=lambda name: {"job": "vllm", "pod": name}):
    """A fake Prometheus over `replicas`, each scraped a second before every query while it
    is in the returned `scraping`; the answer holds each pod's last two scrapes, as a
    read reaching 30 s back at a 15 s interval does. `edit(pod, its series)` makes the
    answer hostile."""
    from fakeserver import reply
    held: dict[str, dict[float, str]] = {}
    scraping = set(replicas)

    def query(h):
        import json
        result = []
        for name in sorted(replicas):
            if name in scraping:
                replicas[name].advance(clock[0] - 1)
                held.setdefault(name, {})[clock[0] - 1] = replicas[name].render()
            recent = dict(sorted(held.get(name, {}).items())[-2:])
            if recent:
                result += edit(name, answer_of(recent, pod_labels(name))["data"]["result"])
        reply(h, 200, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode())
    return query, scraping


def _fleet(names, clock):
    return {name: simulator.Replica(name, simulator.Scenario(request_rate=4.0), start=clock[0] - 900, seed=i, model_names=[MODEL])
            for i, name in enumerate(names)}


@contextmanager
def _reading(edit, clock):
    """A Poller reading vllm-a from a fake Prometheus whose every answer goes through `edit`,
    every 15 s of `clock`: (poller, state, the pod's scrapes, stop them by clearing it)."""
    from fakeserver import FakeServer
    query, scraping = _prometheus_of(_fleet(("vllm-a",), clock), clock, edit)
    with FakeServer({"/api/v1/query": query}) as prom:
        state = State()
        cfg = read_config(prom.base)
        cfg["global"]["poll_interval"] = "15s"
        poller = Poller(load(cfg), state, clock=lambda: clock[0])
        try:
            yield poller, state, scraping
        finally:
            poller.stop(0.5)


@pytest.mark.parametrize("bad_time", [3600.0, math.inf, math.nan], ids=["an-hour-ahead", "infinity", "nan"])
def test_a_sample_after_the_querys_time_is_refused_counted_and_the_pod_still_goes_stale_when_it_stops(bad_time, caplog):
    """One sample of vllm-a an hour ahead of the query (or at JSON's Infinity, NaN): a
    range selector answers none there. Read, it was the pod's newest for good: every real
    sample after it "already read", the pod never stale. Refused and counted (by reason,
    said once in the log), the pod is fed every later scrape and goes down once stopped."""
    clock = [20_000.0]
    hostile = {"on": False}

    def edit(name, result):
        if hostile["on"]:
            for series in result:
                series["values"].append([clock[0] + bad_time, series["values"][-1][1]])
        return result
    with _reading(edit, clock) as (poller, state, scraping), caplog.at_level(logging.WARNING, "exporter.poll.promread"):
        for k in range(6):
            hostile["on"] = k in (2, 3)
            poller.read()
            clock[0] += 15
        view = state.target("vllm-a")
        assert view.up and dict(view.scrapes)["success"] == 6  # every real scrape fed, none taken for read
        assert math.isfinite(poller.reader.newest["vllm-a"]) and poller.reader.newest["vllm-a"] < clock[0]
        reason = "future_timestamp" if math.isfinite(bad_time) else "non_finite_timestamp"
        assert dict(view.rejected)[reason] > 0
        assert len([r for r in caplog.records if "after the query's time" in r.getMessage()]) == 1
        scraping.clear()  # the pod stops
        for _ in range(5):
            poller.read()
            clock[0] += 15
        assert not state.target("vllm-a").up
        registry_of(state)  # our /metrics renders, no time that is not one in it


def test_series_whose_values_come_newest_first_are_read_whole_and_the_pod_stays_up():
    """A store that answers each series' values in reverse time order: the reading
    stopped at the first sample already read, which was now the oldest, took nothing, and
    marked the pod down while every answer had fresh samples."""
    clock = [20_000.0]

    def reverse(name, result):
        for series in result:
            series["values"].reverse()
        return result
    with _reading(reverse, clock) as (poller, state, _):
        for _ in range(8):
            poller.read()
            clock[0] += 15
            assert state.target("vllm-a").up
        assert dict(state.target("vllm-a").scrapes)["success"] == 8


@pytest.mark.parametrize("honor_labels", [False, True])
def test_a_pod_label_named_model_name_is_the_targets_exported_model_name_and_the_engines_model_stays(honor_labels):
    """A PodMonitor relabelling that adds `model_name` to the pod: Prometheus keeps it under
    the name and the engine's as exported_model_name (honor_labels: false; true keeps the
    engine's under the name). Taken for a pod label and stripped from every series, it
    left no series of vLLM: the pod was down for good. As the scrape path has it: the
    engine's model, the pod's label as the target's exported_model_name."""
    clock = [20_000.0]

    def relabelled(name, result):
        for series in result:
            metric = series["metric"]
            if "model_name" in metric and not honor_labels:
                metric["exported_model_name"] = metric["model_name"]
            if "model_name" not in metric or not honor_labels:
                metric["model_name"] = "from-the-podmonitor"
        return result
    with _reading(relabelled, clock) as (poller, state, _):
        for _ in range(3):
            poller.read()
            clock[0] += 15
        view = state.target("vllm-a")
        assert view.up and {s.model_name for s in view.snapshot.series} == {MODEL}
        assert dict(view.target.labels)["exported_model_name"] == "from-the-podmonitor"


def test_a_pod_gone_from_prometheus_is_removed_not_down_one_it_cannot_scrape_is_down_and_an_empty_answer_is_no_mass_removal(caplog):
    """A rollout deleted vllm-a: its scrape target left Prometheus (no series, no `up`): it
    leaves, and no TargetDown opens a ticket. vllm-b's scrapes fail (Prometheus has only
    `up 0` of it): down, saying why. Then Prometheus answers success with no series at all
    (a Thanos with a partial response): taken for a failure of the source, every pod kept
    as it was, until it stays so for accept_empty_after."""
    import json
    from urllib.parse import parse_qs, urlsplit
    from fakeserver import FakeServer, reply
    clock = [40_000.0]
    replicas = {name: simulator.Replica(name, simulator.Scenario(request_rate=4.0), start=clock[0] - 900, seed=i, model_names=[MODEL])
                for i, name in enumerate(("vllm-a", "vllm-b", "vllm-c"))}
    scraped = {"vllm-a": 1.0, "vllm-b": 1.0, "vllm-c": 1.0}  # pod -> its `up`; gone from the dict: its target was removed
    nothing = [False]

    def query(h):
        q = parse_qs(urlsplit(h.path).query)["query"][0]
        if nothing[0]:
            body = {"status": "success", "data": {"resultType": "vector" if not q.endswith("s]") else "matrix", "result": []}}
        elif q.startswith("count("):
            body = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [clock[0], str(len(scraped))]}]}}
        elif q.startswith('{__name__="up"'):
            asked = re.search(r'pod=~"([^"]*)"', q).group(1).replace("\\\\", "").split("|")
            body = {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"__name__": "up", "job": "vllm", "pod": p}, "value": [clock[0], str(v)]} for p, v in scraped.items() if p in asked]}}
        else:
            body = {"status": "success", "data": {"resultType": "matrix", "result": []}}
            for name, up in scraped.items():
                if up == 1.0:
                    replicas[name].advance(clock[0] - 1)
                    body["data"]["result"] += answer_of({clock[0] - 1: replicas[name].render()}, {"job": "vllm", "pod": name})["data"]["result"]
        reply(h, 200, json.dumps(body).encode())

    with FakeServer({"/api/v1/query": query}) as prom:
        state = State()
        raw = read_config(prom.base)
        raw["global"]["poll_interval"] = "15s"
        poller = Poller(load(raw), state, clock=lambda: clock[0])
        poller.reader.read_back = 300.0
        try:
            def tick(n=1):
                for _ in range(n):
                    clock[0] += 15
                    poller.read()
                    poller.evaluate()
            tick(3)
            assert {v.target.name for v in state.read().targets} == {"vllm-a", "vllm-b", "vllm-c"}
            del scraped["vllm-a"]  # the rollout deleted it
            scraped["vllm-b"] = 0.0  # its scrapes fail
            with caplog.at_level(logging.INFO):
                tick(8)
            assert {v.target.name for v in state.read().targets} == {"vllm-b", "vllm-c"}
            assert "no longer scraped by Prometheus, removed: vllm-a" in caplog.text
            b = state.target("vllm-b")
            assert not b.up and b.last_error.startswith("Prometheus cannot scrape it (up == 0)")
            down = {a.target for a in poller.engine.alerts.values() if a.alertname == "PrefixCacheTargetDown" and a.state in ("pending", "firing")}
            assert down == {"vllm-b"}  # no ticket for the pod the rollout deleted
            nothing[0] = True  # success, and no series at all
            tick(4)
            (source,) = [s for s in state.read().published.discovery if s.name == "read_prometheus"]
            assert not source.ok and "no series of any pod" in source.error
            assert {v.target.name for v in state.read().targets} == {"vllm-b", "vllm-c"} and state.target("vllm-c").up
            tick(int(load(raw).discovery.accept_empty_after // 15) + 2)  # believed once it stayed so that long, not twice that
            assert {v.target.name for v in state.read().targets} == set()
        finally:
            poller.stop(0.5)
