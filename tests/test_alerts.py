"""alerts/: the Prometheus rules against the real promtool, the Alertmanager example
against the real amtool, the generated PrometheusRule, and the runbook's anchors."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.alerting import causes, rules as sidecar_rules

from conftest import require_binary

ROOT = Path(__file__).parent.parent
ALERTS = ROOT / "alerts"
RULES = yaml.safe_load((ALERTS / "prefix-cache.rules.yml").read_text())
ALL_RULES = [r for g in RULES["groups"] for r in g["rules"]]
ALERT_RULES = [r for r in ALL_RULES if "alert" in r]
RECORDING_RULES = sorted({r["record"] for r in ALL_RULES if "record" in r})
RUNBOOK = (ALERTS / "runbook.md").read_text()
CONFIG = yaml.safe_load((ALERTS / "rules.config.yml").read_text())
RELAY_GROUP = "vllm-prefix-cache-relay.alerts"


def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_promtool_check_rules():
    out = run(require_binary("promtool"), "check", "rules", str(ALERTS / "prefix-cache.rules.yml"))
    assert out.returncode == 0, out.stdout + out.stderr


def _promtool_groups():
    for path in sorted((ALERTS / "tests").glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        for k, group in enumerate(doc["tests"]):
            yield pytest.param(path, k, id=f"{path.stem}-{k}-{group.get('name', '')}"[:80])


@pytest.mark.slow
@pytest.mark.parametrize("path, index", list(_promtool_groups()))
def test_promtool_unit_tests_pass(path, index, tmp_path):
    """promtool runs one file's groups one after the other (minutes of CPU in all): each
    group runs as a test of its own, with the file's rules and settings, so that the suite's
    workers share them."""
    doc = yaml.safe_load(path.read_text())
    doc["rule_files"] = [str((path.parent / f).resolve()) for f in doc["rule_files"]]
    doc["tests"] = [doc["tests"][index]]
    one = tmp_path / path.name
    one.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = run(require_binary("promtool"), "test", "rules", str(one))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == 1


def _tests():
    for path in (ALERTS / "tests").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["tests"]:
            yield group


def test_every_alert_has_a_positive_and_a_negative_case():
    seen = {}
    for group in _tests():
        for case in group.get("alert_rule_test", []):
            seen.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for r in ALERT_RULES:
        assert seen.get(r["alert"]) == {True, False}, r["alert"]


def _seconds(duration: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[u] for n, u in re.findall(r"(\d+)([smhd])", duration))


def test_every_case_that_fires_an_alert_also_shows_it_resolving():
    """A test that shows an alert firing also shows it resolving: a later evaluation of
    the same case with no alert."""
    unresolved = []
    for group in _tests():
        cases = group.get("alert_rule_test", [])
        fired: dict[str, int] = {}
        for case in cases:
            if case.get("exp_alerts"):
                fired[case["alertname"]] = max(fired.get(case["alertname"], 0), _seconds(case["eval_time"]))
        for name, last in fired.items():
            if not any(c["alertname"] == name and not c.get("exp_alerts") and _seconds(c["eval_time"]) > last for c in cases):
                unresolved.append((group["name"], name))
    assert unresolved == []


def test_every_recording_rule_has_a_positive_and_a_negative_case():
    seen = {}
    for group in _tests():
        for case in group.get("promql_expr_test", []):
            name = re.match(r"[a-z_:0-9]+", case["expr"]).group(0)
            seen.setdefault(name, set()).add(bool(case.get("exp_samples")))
    for name in RECORDING_RULES:
        assert seen.get(name) == {True, False}, name


@pytest.mark.parametrize("rule", ALERT_RULES, ids=[r["alert"] for r in ALERT_RULES])
def test_alert_conventions(rule):
    assert "for" in rule and rule["labels"]["severity"] in ("critical", "warning", "info", "{{ $labels.severity }}")
    assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
    # no dashboard link unless alerts/rules.config.yml names one (an example host sends the on-call nowhere)
    assert ("dashboard_url" in rule["annotations"]) == bool(CONFIG["dashboard_url"])
    # the mixin habit: the values are in the description too (many receivers show only it)
    assert "$labels." in rule["annotations"]["description"] and (
        "$value" not in rule["annotations"]["summary"] or "$value" in rule["annotations"]["description"])
    anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
    assert anchor == rule["alert"].lower() and f"### {anchor}\n" in RUNBOOK
    # a traffic floor, or an alert about a target rather than traffic
    # (the exporter's own health, prefixcache_*, is about the exporter)
    assert "> 100" in rule["expr"] or "> 0" in rule["expr"] or "up{" in rule["expr"] or "prefixcache_" in rule["expr"]


def test_no_alert_name_carries_two_severities():
    """kube-prometheus-stack's default inhibition (critical over warning, equal namespace and
    alertname) let one pod's critical silence another pod's warning of the same name. Each
    name of alerts/ has one literal severity; the relay's are the sidecar's own, one per name
    by its registry (tests/test_rules.py)."""
    severities: dict[str, set[str]] = {}
    for group in RULES["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                severities.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    relayed = {r["alert"] for g in RULES["groups"] if g["name"] == RELAY_GROUP for r in g["rules"]}
    for name, found in severities.items():
        assert len(found) == 1, (name, found)
        if name in relayed:
            assert found == {"{{ $labels.severity }}"} and name in sidecar_rules.ALERT_NAMES
        else:
            assert found <= {"critical", "warning", "info"}, name


def test_the_relay_raises_every_alert_the_sidecar_can_fire():
    """PrefixCacheRouterPredictionGap had no relay rule: the sidecar and attach variants never
    delivered it. The relay group is written from the registry, every name an alert is
    delivered under, and selects exactly that name."""
    import re
    relay = [r for g in RULES["groups"] if g["name"] == RELAY_GROUP for r in g["rules"]]
    assert [r["alert"] for r in relay] == list(sidecar_rules.ALERT_NAMES)
    for r in relay:
        assert re.search(r'alertname="([^"]+)"', r["expr"]).group(1) == r["alert"] and 'state="firing"' in r["expr"]
    assert sidecar_rules.ROUTER_PREDICTION_GAP in sidecar_rules.ALERT_NAMES
    assert sidecar_rules.TRAFFIC_MIX_CHANGED in sidecar_rules.ALERT_NAMES


def test_the_runbook_links_are_the_releases():
    """`blob/main` describes the alerts of the next release, not of the one deployed."""
    import tomllib
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    urls = {r["annotations"]["runbook_url"].split("#")[0] for r in ALERT_RULES}
    assert urls == {f"https://github.com/vllm-prefix-cache-exporter/vllm-prefix-cache-exporter/blob/v{version}/alerts/runbook.md"}


def test_recording_rules_follow_level_metric_operation():
    for name in RECORDING_RULES:
        assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", name), name


def test_runbook_covers_every_sidecar_alert_and_cause():
    for name in sidecar_rules.ALERT_NAMES:
        assert f"### {sidecar_rules.RUNBOOK_ANCHORS[name]}\n" in RUNBOOK
    for cause in causes.CAUSES:
        assert f"### {cause}\n" in RUNBOOK


def test_prometheusrule_is_generated_from_the_rules_and_current():
    out = run(sys.executable, "scripts/gen-manifests", "--check")
    assert out.returncode == 0, out.stderr
    resource = yaml.safe_load((ALERTS / "kubernetes" / "prometheusrule.yaml").read_text())
    assert resource["kind"] == "PrometheusRule" and resource["spec"]["groups"] == RULES["groups"]


def test_amtool_accepts_the_example_and_it_inhibits_hit_rate_alerts_of_a_down_target():
    out = run(require_binary("amtool"), "check-config", str(ALERTS / "alertmanager.example.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    cfg = yaml.safe_load((ALERTS / "alertmanager.example.yml").read_text())
    assert any("PrefixCacheTargetDown" in m and r["equal"] == ["namespace", "target"] for r in cfg["inhibit_rules"] for m in r["source_matchers"])
    assert "model_name" in cfg["route"]["group_by"]


def test_amtool_routes_by_severity_and_cause():
    amtool = require_binary("amtool")
    cases = {("severity=critical", "cause=prompt_prefix_change"): "app-team-pager",
             ("severity=critical", "cause=eviction_pressure"): "llm-serving-pager",
             ("severity=warning", "cause=load_balancer_scatter"): "llm-serving-capacity",
             ("alertname=PrefixCacheTrafficMixChanged", "severity=warning", "cause=traffic_mix"): "llm-serving-capacity",
             ("alertname=VLLMPrefixCacheExporterDown", "severity=warning"): "llm-serving-tickets"}
    for labels, receiver in cases.items():
        out = run(amtool, "config", "routes", "test", f"--config.file={ALERTS / 'alertmanager.example.yml'}", *labels)
        assert out.stdout.strip() == receiver, (labels, out.stdout, out.stderr)


def test_a_real_alertmanager_applies_the_example_inhibitions(tmp_path):
    """Alerts as each variant sends them, posted to a real Alertmanager loaded with the
    example config: the covered ones come back inhibited, the others not."""
    import time

    import requests

    from am import Alertmanager

    am = Alertmanager(tmp_path, "http://127.0.0.1:9/unused")
    am.config.write_text((ALERTS / "alertmanager.example.yml").read_text())
    sent = {
        "version-drop": {"alertname": "PrefixCacheHitRateDropAfterDeploy", "namespace": "llm", "model_name": "m", "version": "v2", "severity": "critical"},
        "low-on-new-pod": {"alertname": "PrefixCacheHitRateLow", "namespace": "llm", "target": "new-0", "model_name": "m", "version": "v2", "severity": "warning"},
        "low-on-old-pod": {"alertname": "PrefixCacheHitRateLow", "namespace": "llm", "target": "old-1", "model_name": "m", "version": "v1", "severity": "warning"},
        "target-down": {"alertname": "PrefixCacheTargetDown", "namespace": "llm", "target": "a", "model_name": "", "severity": "critical"},
        "low-on-down": {"alertname": "PrefixCacheHitRateLow", "namespace": "llm", "target": "a", "model_name": "m", "severity": "warning"},
        # relayed through Prometheus: the sidecar's names, with the scraped pod's labels
        "relay-down": {"alertname": "PrefixCacheTargetDown", "namespace": "llm", "pod": "b", "job": "vllm-prefix-cache-exporter", "target": "b", "severity": "critical"},
        "relay-low": {"alertname": "PrefixCacheHitRateLow", "namespace": "llm", "pod": "b", "job": "vllm-prefix-cache-exporter", "target": "b", "model_name": "m", "severity": "warning"},
    }
    inhibited = {"low-on-new-pod", "low-on-down", "relay-low"}
    am.start()
    try:
        r = requests.post(am.url + "/api/v2/alerts", json=[{"labels": {k: v for k, v in labels.items() if v}} for labels in sent.values()], timeout=5)
        assert r.status_code == 200, r.text

        def states():
            alerts = requests.get(am.url + "/api/v2/alerts", timeout=5).json()
            by_labels = {tuple(sorted(a["labels"].items())): bool(a["status"]["inhibitedBy"]) for a in alerts}
            return {name: by_labels.get(tuple(sorted((k, v) for k, v in labels.items() if v))) for name, labels in sent.items()}

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and {n for n, i in states().items() if i} != inhibited:
            time.sleep(0.5)
        assert {n for n, i in states().items() if i} == inhibited, states()
    finally:
        am.stop()


def test_the_rules_are_generated_from_their_config_and_current():
    out = run(sys.executable, str(ROOT / "scripts" / "gen-rules"), "--check")
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_a_global_ruler_config_keeps_cluster_and_namespace_apart(tmp_path):
    config = yaml.safe_load((ALERTS / "rules.config.yml").read_text())
    config["aggregation"] = ["cluster", "namespace"]
    config["runbook_url"] = "https://runbooks.example/prefix-cache.md"
    config["dashboard_url"] = "https://grafana.example/d/vllm-prefix-cache"  # set: every alert links it
    config["selectors"]["vllm"] = 'job=~".+-engine-service"'
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config))
    out_file = tmp_path / "rules.yml"
    out = run(sys.executable, str(ROOT / "scripts" / "gen-rules"), f"--config={tmp_path / 'config.yml'}", f"--out={out_file}")
    assert out.returncode == 0, out.stderr
    assert run(require_binary("promtool"), "check", "rules", str(out_file)).returncode == 0
    rules = {r.get("record") or r["alert"]: r["expr"] for g in yaml.safe_load(out_file.read_text())["groups"] for r in g["rules"]}
    assert "sum by (cluster, namespace, model_name)" in rules["model_name:vllm_prefix_cache_hits:rate5m"]
    assert 'job=~".+-engine-service"' in rules["instance:vllm_prefix_cache_queries:rate5m"]
    assert "job=~\".*vllm.*\"" not in out_file.read_text()
    # the same two fleets in two clusters, one of them low: only that cluster's alert fires
    test = {"rule_files": [str(out_file)], "evaluation_interval": "30s", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'vllm:prefix_cache_{what}_total{{job="r-engine-service",cluster="{c}",namespace="llm",instance="a:8000",pod="a",model_name="m",engine="0"}}',
             "values": f"0+{n}x30"}
            for c, q, h in (("eu", 7680, 960), ("us", 7680, 7000)) for what, n in (("queries", q), ("hits", h))],
        "alert_rule_test": [{"eval_time": "20m", "alertname": "VLLMPrefixCacheFleetHitRateLow", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "cluster": "eu", "namespace": "llm", "model_name": "m"},
            "exp_annotations": {
                "summary": "Prefix-cache hit rate of m is 12.5%",
                "description": "Prefix-cache hit rate of m is 12.5%. The token-weighted hit ratio of the whole m fleet has been under 50% for 10m. Misses are prefilled again: TTFT and input cost rise.",
                "runbook_url": config["runbook_url"] + "#vllmprefixcachefleethitratelow",
                "dashboard_url": config["dashboard_url"] + "?var-model_name=m"}}]}],
    }]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    out = run(require_binary("promtool"), "test", "rules", str(tmp_path / "test.yml"))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("change, message", [
    pytest.param({"aggregation": ["pod"]}, "aggregation", id="pod-is-not-a-fleet-label"),
    pytest.param({"dashboard_url": "/d/relative"}, "absolute", id="relative-url"),
    pytest.param({"thresholds": {"low_ratio": 5}}, "between 0 and 1", id="ratio-out-of-range"),
])
def test_a_bad_rules_config_is_refused_with_the_key(tmp_path, change, message):
    config = {**yaml.safe_load((ALERTS / "rules.config.yml").read_text()), **change}
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config))
    out = run(sys.executable, str(ROOT / "scripts" / "gen-rules"), f"--config={tmp_path / 'config.yml'}", f"--out={tmp_path / 'x.yml'}")
    assert out.returncode == 2 and message in out.stderr
