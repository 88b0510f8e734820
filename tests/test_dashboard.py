"""dashboards/: structure Grafana needs to import it, and every query run against a real
Prometheus holding simulator and sidecar data."""
import json
import re
from pathlib import Path

import pytest
import requests
import yaml

ROOT = Path(__file__).parent.parent
DASHBOARD = json.loads((ROOT / "dashboards" / "vllm-prefix-cache.json").read_text())
PANELS = DASHBOARD["panels"]
VARIABLES = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
BUILTIN = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__all", "__from", "__to", "__dashboard"}
ALL = {"job": ".*", "namespace": ".*", "model_name": ".*", "instance": ".*", "pod": ".*"}
# one of everything, as an on-call narrows the dashboard down to one pod of one model
ONE = {"job": "vllm", "namespace": "llm", "model_name": "demo/llama-3-8b", "instance": "vllm-1:8000", "pod": "vllm-1"}


def queries():
    for p in PANELS:
        for t in p.get("targets", []):
            yield p["title"], t["expr"]
    for a in DASHBOARD["annotations"]["list"]:
        if "expr" in a:
            yield "annotation " + a["name"], a["expr"]


def substitute(expr: str, values=None) -> str:
    values = {**ALL, "price": VARIABLES["price"]["query"], "__rate_interval": "1m", **(values or {})}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def test_importable_shape():
    assert DASHBOARD["uid"] == "vllm-prefix-cache" and DASHBOARD["title"]
    assert 36 <= DASHBOARD["schemaVersion"] <= 41  # Grafana 10 and 11
    # no __inputs: every query goes through the datasource variable, so an import asks for nothing it does not use
    assert "__inputs" not in DASHBOARD and "DS_PROMETHEUS" not in json.dumps(DASHBOARD)
    assert VARIABLES["datasource"]["type"] == "datasource" and VARIABLES["datasource"]["query"] == "prometheus"
    assert {"job", "namespace", "model_name", "instance", "pod", "price"} <= set(VARIABLES)


def test_panel_ids_unique_and_layout_does_not_overlap():
    ids = [p["id"] for p in PANELS]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in PANELS:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps at {(x, y)}"
                cells.add((x, y))


def test_no_hard_coded_datasource_uid():
    def walk(node):
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and ds.get("type") == "prometheus":
                assert ds.get("uid") in ("${datasource}", "${DS_PROMETHEUS}"), ds
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(DASHBOARD)


def test_every_panel_has_a_query_and_every_variable_is_defined():
    for p in PANELS:
        if p["type"] != "row":
            assert p.get("targets") and all(t.get("expr") for t in p["targets"]), p["title"]
    text = json.dumps({k: v for k, v in DASHBOARD.items() if k != "templating"}) + json.dumps(
        [v.get("definition", "") for v in VARIABLES.values()])
    used = set(re.findall(r"\$\{?(\w+)\}?", text))
    assert used - BUILTIN - set(VARIABLES) == set(), used - BUILTIN - set(VARIABLES)


def test_every_query_filters_by_the_dashboards_variables():
    """vLLM's series by job, namespace, instance, pod and model; the sidecar's (whose job
    and instance are the exporter's) by namespace, pod and model."""
    for title, expr in queries():
        for selector in re.findall(r"(vllm:\w+)\{([^}]*)\}", expr):
            assert all(f'{v}=~"${v}"' in selector[1] for v in ("job", "namespace", "instance", "pod", "model_name")), (title, selector)
        for name, selector in re.findall(r"\b(prefixcache_\w+|ALERTS)\{([^}]*)\}", expr):
            wanted = ("model_name",) if name == "prefixcache_alert_state" else \
                ("namespace", "model_name") if name in ("prefixcache_predicted_hit_ratio", "prefixcache_router_delivered_hit_ratio") else \
                ("namespace", "pod") if name in ("prefixcache_deploy_events_total", "prefixcache_last_deploy_timestamp_seconds") else \
                ("namespace", "pod") if name.startswith("prefixcache_kv_") else \
                ("namespace", "pod", "model_name")
            assert all(f"${v}" in selector for v in wanted), (title, name, selector)
        assert not re.search(r"\b(vllm:\w+|prefixcache_\w+)(\[|\))", expr), (title, "a series without a selector")


def test_per_pod_legends_name_the_pod():
    for p in PANELS:
        for t in p.get("targets", []):
            if "by (" in t["expr"] and "pod" in re.search(r"by \(([^)]*)\)", t["expr"]).group(1):
                assert "{{pod}}" in t.get("legendFormat", ""), p["title"]


def test_latency_panels_show_what_misses_cost():
    titles = {p["title"]: p for p in PANELS}
    for metric in ("time_to_first_token_seconds", "request_prefill_time_seconds", "request_queue_time_seconds", "e2e_request_latency_seconds"):
        (panel,) = [p for p in PANELS if any(f"vllm:{metric}_bucket" in t["expr"] and "0.9," in t["expr"] for t in p.get("targets", []))]
        assert panel["fieldConfig"]["defaults"]["unit"] == "s"
        assert {"p50", "p90", "p99"} <= {t["legendFormat"] for t in panel["targets"]}
    assert titles["Query and hit token rates"]["fieldConfig"]["defaults"]["unit"] == "suffix: tokens/s"
    assert len(titles["Estimated cost of recomputed tokens"]["fieldConfig"]["defaults"]["thresholds"]["steps"]) >= 2
    correlation = next(p for t, p in titles.items() if t.startswith("Hit ratio / TTFT correlation"))
    assert correlation["fieldConfig"]["overrides"][0]["properties"][1] == {"id": "custom.axisPlacement", "value": "right"}


def test_rate_queries_use_rate_interval_except_fixed_windows():
    for title, expr in queries():
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window in ("$__rate_interval", "5m"), (title, window)


# --- against a real Prometheus ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("title, expr", list(queries()), ids=[t for t, _ in queries()])
def test_every_panel_query_parses_and_returns_data(prometheus_fleet, title, expr):
    result = prometheus_fleet.prometheus.query(substitute(expr))
    assert result, f"{title}: no data for {substitute(expr)}"


@pytest.mark.slow
@pytest.mark.parametrize("title, expr", [q for q in queries() if not q[0].startswith(("Prometheus alerts", "Sidecar alert states"))],
                         ids=[t for t, _ in queries() if not t.startswith(("Prometheus alerts", "Sidecar alert states"))])
def test_every_panel_query_returns_data_with_every_variable_set(prometheus_fleet, title, expr):
    """The alert tables are left out: they are rightly empty while nothing fires for the
    chosen pod."""
    result = prometheus_fleet.prometheus.query(substitute(expr, ONE))
    assert result, f"{title}: no data for {substitute(expr, ONE)}"


@pytest.mark.slow
def test_panel_queries_with_one_model_selected(prometheus_fleet):
    expr = next(e for t, e in queries() if t == "Hit ratio per pod")
    result = prometheus_fleet.prometheus.query(substitute(expr, {"model_name": "demo/llama-3-8b"}))
    assert {r["metric"]["pod"] for r in result} == {"vllm-0", "vllm-1"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["job", "namespace", "model_name", "instance"])
def test_variable_queries_find_values(prometheus_fleet, name):
    m = re.fullmatch(r"label_values\((.+), (\w+)\)", VARIABLES[name]["definition"])
    selector, label = substitute(m.group(1)), m.group(2)
    r = requests.get(prometheus_fleet.prometheus.url + f"/api/v1/label/{label}/values", params={"match[]": selector}, timeout=10)
    assert r.status_code == 200 and r.json()["data"], (name, selector)


RULES = yaml.safe_load((ROOT / "alerts" / "prefix-cache.rules.yml").read_text())
RECORDS = [(r["record"], r["expr"]) for g in RULES["groups"] for r in g["rules"] if "record" in r]
# a series only for a pod that (re)started within the warm-up: none of the fleet's did (its
# promtool cases in alerts/tests/recording.test.yml show it on a restart)
AROUND_A_RESTART = {"instance:vllm_started:within_warmup"}


@pytest.mark.slow
@pytest.mark.parametrize("record, expr", RECORDS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(RECORDS)])
def test_every_recording_rule_runs_on_real_data(prometheus_fleet, record, expr):
    if record in AROUND_A_RESTART:
        assert prometheus_fleet.prometheus.query(expr) == [], f"{record}: no pod of the fleet restarted"
    else:
        assert prometheus_fleet.prometheus.query(expr), f"{record}: no data"
    # and Prometheus itself evaluated the loaded rule without error
    groups = prometheus_fleet.prometheus.rules()
    health = {(r["name"], r["health"]) for g in groups for r in g["rules"]}
    assert (record, "ok") in health
