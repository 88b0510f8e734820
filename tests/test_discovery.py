"""Targets from Prometheus's targets API and file_sd files, merging, sharding and the
last-good rule: pure functions on recorded answers."""
import json

import pytest

from exporter.config import Target
from exporter.discovery import (
    DiscoveryError,
    SourceState,
    from_file_sd,
    from_targets_api,
    in_shard,
    merge,
    settle,
    shard_key,
    shard_of,
)

from conftest import FIXTURES

RECORDED = json.loads((FIXTURES / "discovery" / "prometheus-2.42-targets.json").read_text())


def test_the_active_targets_of_one_job_with_their_labels_and_scrape_urls():
    targets = from_targets_api(RECORDED, "vllm", "prometheus")
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
        from_targets_api(payload, "vllm", "prometheus")


def test_file_sd_json_and_yaml_read_alike(tmp_path):
    text = (FIXTURES / "discovery" / "file_sd.json").read_text()
    from_json = from_file_sd(text, "sd.json")
    import yaml
    from_yaml = from_file_sd(yaml.safe_dump(json.loads(text)), "sd.yml")
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
])
def test_a_malformed_file_sd_file_is_a_clear_error(text, path, message):
    with pytest.raises(DiscoveryError, match=message):
        from_file_sd(text, path)


def test_an_empty_file_sd_file_has_no_targets():
    assert from_file_sd("", "sd.yml") == [] and from_file_sd("[]", "sd.json") == []


def test_labels_that_ours_use_are_kept_as_exported():
    (t,) = from_file_sd('[{"targets": ["a:1"], "labels": {"target": "x", "model_name": "m"}}]', "sd.json")
    assert dict(t.labels)["exported_target"] == "x" and dict(t.labels)["exported_model_name"] == "m"
    assert "target" not in dict(t.labels)


def test_merge_keeps_static_names_and_separates_pods_sharing_a_name():
    static = [Target("qwen-0", "http://static:1/metrics")]
    merged, warnings = merge(static, from_targets_api(RECORDED, "vllm", "prometheus"))
    names = [t.name for t in merged]
    assert names[0] == "qwen-0" and merged[0].url == "http://static:1/metrics"
    assert len(set(names)) == len(names) == 4
    assert "qwen-0@127.0.0.1:18003" in names and "llama-7f9c8d6b5-abcde@127.0.0.1:18002" in names
    assert not warnings


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
