"""Targets from Prometheus's targets API and file_sd files, merging, sharding and the
last-good rule: pure functions on recorded answers."""
import json

import pytest

from collections import Counter

from exporter.config.sections import RESERVED_LABELS, Target
from exporter.discovery.targets import (
    DiscoveryError,
    Limits,
    Selector,
    SourceState,
    from_file_sd,
    from_targets_api,
    in_shard,
    limit_targets,
    merge,
    settle,
    shard_key,
    shard_of,
)

from conftest import FIXTURES

RECORDED = json.loads((FIXTURES / "discovery" / "prometheus-2.42-targets.json").read_text())
JOB_VLLM = Selector((("job", "vllm"),))


def targets_of(payload, selector=JOB_VLLM, limits=Limits()):
    return from_targets_api(payload, selector, "prometheus", limits).targets


def file_sd(text, path="sd.json", limits=Limits()):
    return from_file_sd(text, path, limits).targets


def test_the_active_targets_of_one_job_with_their_labels_and_scrape_urls():
    targets = targets_of(RECORDED)
    assert sorted(t.url for t in targets) == ["http://127.0.0.1:18001/metrics", "http://127.0.0.1:18002/metrics",
                                             "http://127.0.0.1:18003/qwen/metrics"]
    qwen = next(t for t in targets if t.name == "qwen-0")
    assert dict(qwen.labels) == {"deployment": "qwen", "instance": "127.0.0.1:18003", "job": "vllm", "namespace": "llm",
                                 "pod": "qwen-0", "shard": "0", "version": "v7"}


def test_prometheus_hashmod_and_ours_agree():
    checked = 0
    for t in RECORDED["data"]["activeTargets"]:
        labels = t["labels"]
        for key_label, modulus in (("key", 7), ("deployment", 3)):
            if key_label in labels:
                assert shard_of(labels[key_label], modulus) == int(labels["shard"]), labels
                checked += 1
    assert checked == 13


@pytest.mark.parametrize("payload, message", [
    pytest.param({"status": "error", "error": "x"}, "not a Prometheus targets API answer", id="error-status"),
    pytest.param([], "not a Prometheus targets API answer", id="not-an-object"),
    pytest.param({"status": "success", "data": {}}, "activeTargets is missing", id="no-active-targets"),
    pytest.param({"status": "success", "data": {"activeTargets": [{"labels": {"job": "vllm"}}]}}, "no usable scrapeUrl", id="no-address"),
    pytest.param({"status": "success", "data": {"activeTargets": ["x"]}}, "has no labels", id="garbage-target"),
])
def test_a_malformed_targets_answer_is_a_clear_error(payload, message):
    with pytest.raises(DiscoveryError, match=message):
        from_targets_api(payload, JOB_VLLM, "prometheus")


def test_file_sd_json_and_yaml_read_alike(tmp_path):
    text = (FIXTURES / "discovery" / "file_sd.json").read_text()
    from_json = file_sd(text, "sd.json")
    import yaml
    from_yaml = file_sd(yaml.safe_dump(json.loads(text)), "sd.yml")
    assert from_json == from_yaml
    assert [t.url for t in from_json] == ["http://127.0.0.1:18001/metrics", "http://127.0.0.1:18002/metrics",
                                          "http://127.0.0.1:18003/qwen/metrics"]
    assert dict(from_json[0].labels)["instance"] == "127.0.0.1:18001"  # as Prometheus sets it
    assert "__metrics_path__" not in dict(from_json[2].labels)


@pytest.mark.parametrize("text, path, message", [
    pytest.param("{not json", "sd.json", "not valid JSON", id="bad-json"),
    pytest.param("a: [", "sd.yml", "not valid YAML", id="bad-yaml"),
    pytest.param('{"targets": []}', "sd.json", "must be a list", id="not-a-list"),
    pytest.param('[{"targets": ["a:1"], "extra": 1}]', "sd.json", "only `targets` and `labels`", id="unknown-key"),
    pytest.param('[{"targets": [""]}]', "sd.json", "has no address", id="empty-address"),
    pytest.param('[{"targets": ["http://a:1/metrics"]}]', "sd.json", "not a host:port", id="url-not-address"),
    pytest.param('[{"targets": ["a:1"], "labels": {"bad-name": "x"}}]', "sd.json", "not a valid label name", id="bad-label"),
    pytest.param('[{"targets": ["a:1"], "labels": {"__scheme__": "ftp"}}]', "sd.json", "not http or https", id="bad-scheme"),
    pytest.param('[{"targets": ["a:1"], "labels": {"version": 1.10}}]', "sd.json", "must have a string value", id="number-value"),
    pytest.param('- targets: ["a:1"]\n  labels: {version: [1]}\n', "sd.yml", "must have a string value", id="list-value"),
])
def test_a_malformed_file_sd_file_is_a_clear_error(text, path, message):
    with pytest.raises(DiscoveryError, match=message):
        from_file_sd(text, path)


def test_a_yaml_label_value_is_its_text_as_prometheus_reads_it():
    (t,) = file_sd("- targets: ['10.0.0.1:8000']\n  labels: {version: 1.10, canary: true, build: 007}\n", "sd.yml")
    assert {k: v for k, v in t.labels if k != "instance"} == {"version": "1.10", "canary": "true", "build": "007"}


def test_an_empty_file_sd_file_has_no_targets():
    assert file_sd("", "sd.yml") == [] and file_sd("[]", "sd.json") == []


def test_labels_that_ours_use_are_kept_as_exported():
    (t,) = file_sd('[{"targets": ["a:1"], "labels": {"target": "x", "model_name": "m"}}]')
    assert dict(t.labels)["exported_target"] == "x" and dict(t.labels)["exported_model_name"] == "m"
    assert "target" not in dict(t.labels)


def test_merge_keeps_static_names_and_separates_pods_sharing_a_name():
    static = [Target("qwen-0", "http://static:1/metrics")]
    merged, warnings = merge(static, targets_of(RECORDED))
    names = [t.name for t in merged]
    assert names[0] == "qwen-0" and merged[0].url == "http://static:1/metrics"
    assert len(set(names)) == len(names) == 4
    assert "qwen-0@127.0.0.1:18003" in names and "llama-7f9c8d6b5-abcde@127.0.0.1:18002" in names
    assert not warnings


def test_a_pod_both_scraped_and_read_from_one_prometheus_is_said_once_as_polled_twice():
    """discovery.prometheus and read_prometheus on one Prometheus find the same pods: each is
    kept (renamed name@address), and one warning says why, not one a pod. Two ports of one
    pod (the recorded answer) and one name in two namespaces stay silent."""
    scraped = [Target(f"vllm-{i}", f"http://10.0.0.{i}:8000/metrics", (("namespace", "llm"),)) for i in range(5)]
    read = [Target(f"vllm-{i}", f"http://prometheus:9090#vllm-{i}", (("namespace", "llm"),)) for i in range(5)]
    elsewhere = [Target("vllm-0", "http://10.0.1.0:8000/metrics", (("namespace", "staging"),))]
    merged, warnings = merge([], scraped + read + elsewhere)
    assert len(merged) == 11 and {"vllm-0@prometheus:9090", "vllm-0@10.0.1.0:8000"} <= {t.name for t in merged}
    (said,) = warnings
    assert said.startswith("5 discovered target(s) share name and namespace with another (vllm-0 in llm, vllm-1 in llm, "
                           "vllm-2 in llm, ...): one pod that two sources found, polled twice")
    assert merge([], scraped + elsewhere)[1] == []


def test_every_replica_of_a_model_lands_in_one_shard():
    pods = [Target(f"llama-7f9c8d6b5-{s}", "http://x/metrics") for s in ("abcde", "fghij", "klmno")] + \
           [Target(f"qwen-{i}", "http://y/metrics") for i in range(3)]
    assert {shard_key(t, "deployment") for t in pods} == {"llama", "qwen"}
    for count in (2, 3, 5):
        for prefix in ("llama", "qwen"):
            assert len({i for i in range(count) for t in pods if t.name.startswith(prefix) and in_shard(t, i, count, "deployment")}) == 1
    labelled = Target("whatever-0", "http://z/metrics", labels=(("deployment", "llama"),))
    assert shard_key(labelled, "deployment") == "llama"


def test_every_target_is_in_exactly_one_shard():
    pods = [Target(f"model{i}-0", "http://x/metrics") for i in range(50)]
    for count in (1, 2, 4):
        assert sorted(t.name for i in range(count) for t in pods if in_shard(t, i, count, "deployment")) == sorted(t.name for t in pods)


A, B = Target("a", "http://a/metrics"), Target("b", "http://b/metrics")


@pytest.mark.parametrize("steps, targets, ok", [
    pytest.param([(0, [A, B], "")], [A, B], True, id="first-success"),
    pytest.param([(0, [A, B], ""), (30, None, "down")], [A, B], False, id="failure-keeps-the-last-good-list"),
    pytest.param([(0, [A, B], ""), (30, [A], "")], [A], True, id="a-target-goes"),
    pytest.param([(0, [A, B], ""), (30, [], "")], [A, B], True, id="empty-answer-is-held"),
    pytest.param([(0, [A, B], ""), (30, [], ""), (700, [], "")], [], True, id="empty-answer-believed-after-a-while"),
    pytest.param([(0, [A, B], ""), (30, [], ""), (60, [B], ""), (90, [], "")], [B], True, id="hold-restarts"),
    pytest.param([(0, None, "down")], [], False, id="never-succeeded"),
])
def test_settle_keeps_the_last_good_list(steps, targets, ok):
    state = SourceState("x")
    for t, found, error in steps:
        state = settle(state, t, found, error, 600.0)
    assert list(state.targets) == targets and state.ok == ok
    assert bool(state.error) == (not ok or (found == [] and targets != []))


# --- what an operator-managed Prometheus answers (pool podMonitor/<ns>/<name>/<i>, job <ns>/<name>) ---
def active(pool, url, **labels):
    """One activeTargets entry as Prometheus's /api/v1/targets gives it."""
    return {"discoveredLabels": {"__address__": url.split("/")[2]}, "labels": labels, "scrapePool": pool, "scrapeUrl": url,
            "globalUrl": url, "lastError": "", "lastScrape": "0001-01-01T00:00:00Z", "health": "unknown"}


def answer(*targets):
    return {"status": "success", "data": {"activeTargets": list(targets), "droppedTargets": []}}


OPERATOR = answer(
    active("podMonitor/llm/vllm/0", "http://10.0.0.1:8000/metrics", job="llm/vllm", namespace="llm", pod="vllm-7f9c8d6b5-abcde",
           container="vllm", endpoint="http", instance="10.0.0.1:8000", version="v1"),
    active("podMonitor/llm/vllm/0", "http://10.0.0.2:8000/metrics", job="llm/vllm", namespace="llm", pod="vllm-7f9c8d6b5-fghij",
           container="vllm", endpoint="http", instance="10.0.0.2:8000", version="v2"),
    active("podMonitor/llm/other/0", "http://10.0.0.3:8000/metrics", job="llm/other", namespace="llm", pod="other-0",
           instance="10.0.0.3:8000"),
    active("serviceMonitor/monitoring/node-exporter/0", "http://10.0.0.9:9100/metrics", job="node-exporter", instance="10.0.0.9:9100"),
)


def test_a_real_operator_shaped_answer_is_selected_by_job_label_and_keeps_each_pods_version():
    recorded = json.loads((FIXTURES / "discovery" / "prometheus-2.42-operator-targets.json").read_text())
    targets = targets_of(recorded, Selector((("job", "llm/vllm"),)))
    assert {t.name: dict(t.labels)["version"] for t in targets} == {
        "vllm-7f9c8d6b5-abcde": "v1", "vllm-7f9c8d6b5-fghij": "v1", "vllm-5d4c3b2a1-klmno": "v2"}
    assert all(dict(t.labels)["namespace"] == "llm" for t in targets)
    before = from_targets_api(recorded, JOB_VLLM, "prometheus")  # job: vllm, as configs said before
    assert before.targets == [] and before.unmatched == ("podMonitor/llm/embedder/0 (job='llm/embedder')",
                                                         "podMonitor/llm/vllm/0 (job='llm/vllm') x3")


def test_targets_are_selected_by_their_labels_not_by_the_operators_pool_name():
    targets = targets_of(OPERATOR, Selector((("job", "llm/vllm"),)))
    assert [(t.name, dict(t.labels)["version"]) for t in targets] == [("vllm-7f9c8d6b5-abcde", "v1"), ("vllm-7f9c8d6b5-fghij", "v2")]
    assert targets_of(OPERATOR, Selector((("job", "llm/vllm"), ("version", "v2")))) == targets[1:]
    assert targets_of(OPERATOR, Selector(scrape_pool="podMonitor/llm/vllm/0")) == targets
    assert targets_of(OPERATOR, Selector((("job", "llm/vllm"),), scrape_pool="podMonitor/llm/other/0")) == []


def test_a_selector_that_matches_nothing_says_what_the_answer_held():
    found = from_targets_api(OPERATOR, JOB_VLLM, "prometheus")
    assert found.targets == []
    assert found.unmatched == ("podMonitor/llm/other/0 (job='llm/other')", "podMonitor/llm/vllm/0 (job='llm/vllm') x2",
                               "serviceMonitor/monitoring/node-exporter/0 (job='node-exporter')")
    many = answer(*(active(f"pool{i}", f"http://10.0.1.{i}:1/metrics", job=f"j{i}") for i in range(25)))
    unmatched = from_targets_api(many, JOB_VLLM, "prometheus").unmatched
    assert len(unmatched) == 11 and unmatched[-1] == "and 15 more"
    assert from_targets_api(OPERATOR, Selector((("job", "llm/vllm"),)), "prometheus").unmatched == ()


# --- labels we can expose ---------------------------------------------------------------------------
def test_label_names_prometheus_3_may_send_are_dropped_never_merged_into_one():
    """Prometheus 3 allows UTF-8 label names (`app.kubernetes.io/version`); the text
    format we expose does not, and sanitising would turn two names into one."""
    found = from_targets_api(answer(active("p", "http://10.0.0.1:8000/metrics", job="vllm", pod="a", **{
        "app.kubernetes.io/version": "v1", "app_kubernetes_io_version": "v2", "__meta_y": "x", "": "empty", "1x": "digit",
        "ok": "yes"})), JOB_VLLM, "prometheus")
    (t,) = found.targets
    assert dict(t.labels) == {"app_kubernetes_io_version": "v2", "job": "vllm", "pod": "a", "ok": "yes"}
    assert found.dropped == Counter(invalid_label_name=4)


def test_exported_names_never_collide():
    (t,) = file_sd('[{"targets": ["a:1"], "labels": {"target": "x", "exported_target": "y", "exported_exported_target": "z"}}]')
    names = [k for k, _ in t.labels]
    assert len(names) == len(set(names)) and not set(names) & RESERVED_LABELS
    assert dict(t.labels)["exported_target"] == "y" and dict(t.labels)["exported_exported_exported_target"] == "x"


def test_labels_over_the_limits_are_dropped_and_counted_and_the_target_stays():
    huge = "v" * (4 * 1024 * 1024)
    payload = answer(active("p", "http://10.0.0.1:8000/metrics", job="vllm", pod="a", version=huge, team="t",
                            **{f"l{i:02d}": str(i) for i in range(10)}))
    found = from_targets_api(payload, JOB_VLLM, "prometheus", Limits(label_limit=8, label_value_length_limit=1024))
    (t,) = found.targets
    assert "version" not in dict(t.labels) and len(t.labels) == 8 and t.name == "a"
    assert [k for k, _ in t.labels] == ["job", "l00", "l01", "l02", "l03", "l04", "l05", "pod"]
    assert found.dropped == Counter(label_value_length_limit=1, label_limit=5)
    unlimited = from_targets_api(payload, JOB_VLLM, "prometheus", Limits(label_limit=0, label_value_length_limit=0))
    assert dict(unlimited.targets[0].labels)["version"] == huge and not unlimited.dropped
    (f,) = file_sd(json.dumps([{"targets": ["a:1"], "labels": {"version": huge, "pod": "p"}}]))
    assert dict(f.labels) == {"instance": "a:1", "pod": "p"}


def test_a_target_whose_url_is_too_long_to_be_a_name_is_dropped_and_counted():
    host = "h" * 5000
    found = from_targets_api(answer(active("p", f"http://{host}:1/metrics", job="vllm"),
                                    active("p", "http://10.0.0.1:8000/metrics", job="vllm")), JOB_VLLM, "prometheus")
    assert [t.name for t in found.targets] == ["10.0.0.1:8000"] and found.dropped == Counter(url_length_limit=1)
    found = from_file_sd(json.dumps([{"targets": [f"{host}:1", "10.0.0.1:8000"]}]), "sd.json")
    assert [t.name for t in found.targets] == ["10.0.0.1:8000"] and found.dropped == Counter(url_length_limit=1)


def test_the_target_limit_keeps_the_same_targets_every_refresh():
    targets = [Target(f"pod-{i:05d}", f"http://10.0.{i // 250}.{i % 250}:8000/metrics") for i in range(20_000)]
    dropped = Counter()
    kept = limit_targets(list(reversed(targets)), 2000, dropped)
    assert kept == targets[:2000] and dropped == Counter(target_limit=18_000)
    assert limit_targets(targets[:5], 2000, dropped) == targets[:5] and limit_targets(targets, 0, Counter()) == targets


# --- credentials never name a target ---------------------------------------------------------------
def test_a_target_is_never_named_by_a_url_with_credentials():
    payload = answer(active("p", "http://scraper:s3cret@10.0.0.1:8000/metrics", job="vllm"),
                     active("p", "http://scraper:s3cret@10.0.0.2:8000/metrics", job="vllm", instance="scraper:s3cret@10.0.0.2:8000"))
    a, b = targets_of(payload)
    assert (a.name, b.name) == ("10.0.0.1:8000", "10.0.0.2:8000")
    assert a.url == "http://scraper:s3cret@10.0.0.1:8000/metrics"  # still scraped with them
    assert "s3cret" not in repr(b.labels)
    (f,) = file_sd('[{"targets": ["u:s3cret@10.0.0.3:8000"]}]')
    assert f.name == "10.0.0.3:8000" and "s3cret" not in repr(f.labels)
    merged, warnings = merge([Target("10.0.0.1:8000", "http://x/metrics")], [a, a])
    assert [t.name for t in merged][1] == "10.0.0.1:8000@10.0.0.1:8000"
    assert warnings and not any("s3cret" in w for w in warnings)


def test_a_file_sd_alias_bomb_is_refused_before_it_expands():
    """336 KB of nested aliases stood for 20 million targets (1.3 GB) once walked."""
    import time
    groups = "g0: &g0 [{targets: ['10.0.0.1:8000'], labels: {pod: p}}]\n" + "".join(
        f"g{i}: &g{i} [" + ", ".join([f"*g{i - 1}"] * 10) + "]\n" for i in range(1, 9))
    bomb = groups + "all: *g8\n"
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match="once its aliases are expanded"):
        from_file_sd(bomb, "sd.yml")
    assert time.monotonic() - started < 1.0
    shared = "- &g {targets: ['10.0.0.1:8000'], labels: {pod: p}}\n- *g\n"
    assert len(file_sd(shared, "sd.yml")) == 2  # a small alias is fine: two groups, as written


def test_a_file_of_nested_brackets_is_refused_before_yaml_takes_quadratic_time_over_it():
    import time
    started = time.monotonic()
    for text in ("[" * 100_000, "{a: " * 20_000, "- [" * 10_000):
        with pytest.raises(DiscoveryError, match="nested deeper than 64 levels"):
            from_file_sd(text, "sd.yml")
    with pytest.raises(DiscoveryError, match="not valid JSON"):
        from_file_sd("[" * 100_000, "sd.json")
    assert time.monotonic() - started < 2
    flow = "[" + ", ".join(f"{{targets: ['10.0.0.{i}:8000'], labels: {{pod: p{i}}}}}" for i in range(200)) + "]"
    assert len(file_sd(flow, "sd.yml")) == 200  # many brackets, shallow: read as before


def test_discovered_pods_get_their_kv_events_at_their_address_and_static_ones_keep_their_own():
    from exporter.config.discovery import KVPorts, ShardConfig
    from exporter.config.kvevents import KVEndpoint
    from exporter.discovery.targets import polled

    static = Target("s", "http://10.0.0.9:8000/metrics", kv_events=KVEndpoint("tcp://10.0.0.9:6000"))
    pods = [Target("p1", "http://10.0.0.5:8000/metrics"), Target("p2", "http://[fd00::7]:8000/metrics"),
            Target("read", "http://prometheus:9090#read")]  # read from a Prometheus: no address of its own
    targets, _ = polled([static], pods, ShardConfig(), KVPorts(5557, 5558, "kv"))
    kv = {t.name: t.kv_events for t in targets}
    assert kv["s"] == KVEndpoint("tcp://10.0.0.9:6000")
    assert kv["p1"] == KVEndpoint("tcp://10.0.0.5:5557", topic="kv", replay="tcp://10.0.0.5:5558")
    assert kv["p2"].address == "tcp://[fd00::7]:5557" and kv["read"] is None
    assert all(t.kv_events is None for t in polled([], pods, ShardConfig())[0])
