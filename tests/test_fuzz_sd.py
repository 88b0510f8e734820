"""Property-based fuzz of the two discovery readers: whatever a Prometheus's targets API
or a file_sd file holds, `from_targets_api` and `from_file_sd` either give targets we can
expose (valid, unique label names none of ours, values within the limit, a name without
credentials) or raise DiscoveryError, nothing else."""
import json
import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.config.sections import RESERVED_LABELS
from exporter.discovery.targets import DiscoveryError, Limits, Selector, from_file_sd, from_targets_api

VALID_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
LIMITS = Limits(target_limit=50, label_limit=8, label_value_length_limit=40)

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True), st.text(max_size=20))
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=20)
LABEL_NAMES = st.one_of(st.sampled_from(["job", "pod", "instance", "namespace", "version", "target", "exported_target",
                                          "model_name", "__meta_y", "__address__", "app.kubernetes.io/version",
                                          "app_kubernetes_io_version", "", "1x", "reason"]),
                        st.text(max_size=12))
LABEL_VALUES = st.one_of(st.sampled_from(["vllm", "llm/vllm", "v1", "", "u:p@10.0.0.1:80"]), st.text(max_size=60))
URLS = st.one_of(st.sampled_from(["http://10.0.0.1:8000/metrics", "https://u:s3cret@10.0.0.2:8000/metrics", "ftp://x/", "http://",
                                  "http://[::1]:80/m", "http://[bad/", "/metrics", "", "http://a:99999999/"]),
                 st.text(max_size=30), st.integers(), st.none())


@st.composite
def active_target(draw):
    item = {"labels": draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=12)),
            "scrapePool": draw(st.one_of(st.sampled_from(["vllm", "podMonitor/llm/vllm/0"]), SCALARS)),
            "scrapeUrl": draw(URLS)}
    if draw(st.booleans()):
        item["labels"]["job"] = draw(st.sampled_from(["vllm", "llm/vllm"]))
    if draw(st.integers(0, 9)) == 0:
        item = draw(JSONISH)
    elif draw(st.integers(0, 9)) == 0:
        item["labels"] = draw(JSONISH)
    return item


ANSWERS = st.one_of(
    JSONISH,
    st.builds(lambda targets, extra: {"status": "success", "data": {"activeTargets": targets, **extra}},
              st.lists(active_target(), max_size=8), st.dictionaries(st.text(max_size=5), JSONISH, max_size=2)),
)
SELECTORS = st.sampled_from([Selector((("job", "vllm"),)), Selector((("job", "llm/vllm"),)), Selector(scrape_pool="vllm"), Selector()])


def assert_exposable(targets):
    for t in targets:
        names = [k for k, _ in t.labels]
        assert len(names) == len(set(names)), names
        assert all(VALID_NAME.match(k) and not k.startswith("__") and k not in RESERVED_LABELS for k in names), names
        assert all(len(v) <= LIMITS.label_value_length_limit for _, v in t.labels)
        assert len(names) <= LIMITS.label_limit + 1  # + an exported_ rename of ours
        assert "@" not in t.name and len(t.name) <= 4096
        assert t.url.startswith(("http://", "https://"))


@pytest.mark.slow
@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(ANSWERS, SELECTORS)
def test_a_targets_answer_is_targets_we_can_expose_or_a_discovery_error(payload, selector):
    try:
        found = from_targets_api(payload, selector, "prometheus", LIMITS)
    except DiscoveryError as exc:
        assert str(exc)
        return
    assert_exposable(found.targets)
    assert all(isinstance(n, int) and n > 0 for n in found.dropped.values())


@st.composite
def file_sd_text(draw):
    groups = draw(st.lists(st.one_of(
        st.builds(lambda targets, labels: {"targets": targets, "labels": labels},
                  st.lists(st.one_of(st.sampled_from(["10.0.0.1:8000", "u:p@10.0.0.2:1", "", " ", "a/b"]), st.text(max_size=10)), max_size=4),
                  st.dictionaries(LABEL_NAMES, st.one_of(LABEL_VALUES, SCALARS), max_size=6)),
        JSONISH), max_size=5))
    data = draw(st.one_of(st.just(groups), JSONISH))
    kind = draw(st.sampled_from(["json", "yaml", "garbage", "nested"]))
    if kind == "json":
        return json.dumps(data), "sd.json"
    if kind == "yaml":
        return yaml.safe_dump(data), "sd.yml"
    if kind == "nested":
        depth = draw(st.integers(100, 5000))
        return draw(st.sampled_from(["[" * depth, "- " * depth + "x", '{"a":' * depth])), draw(st.sampled_from(["sd.json", "sd.yml"]))
    return draw(st.text(max_size=200)), draw(st.sampled_from(["sd.json", "sd.yml", "sd.yaml"]))


@pytest.mark.slow
@settings(max_examples=200, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(file_sd_text())
def test_a_file_sd_file_is_targets_we_can_expose_or_a_discovery_error(text_and_path):
    text, path = text_and_path
    try:
        found = from_file_sd(text, path, LIMITS)
    except DiscoveryError as exc:
        assert str(exc).startswith(path)
        return
    assert_exposable(found.targets)
