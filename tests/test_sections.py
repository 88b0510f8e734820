import os

import pytest

from exporter.config import sections as config, reader as config_reader
from exporter.config.load import load_file, read_secret_file
from exporter.config.sections import ConfigError, load, load_text

from conftest import FIXTURES


def test_good_config_loads_with_every_value():
    cfg = load_file(str(FIXTURES / "config" / "good.yml"))
    assert [t.name for t in cfg.targets] == ["vllm-0", "vllm-1"]
    assert cfg.targets[0].labels == (("namespace", "llm"), ("pod", "vllm-0"))
    assert cfg.global_.poll_interval == 5.0
    assert cfg.global_.body_size_limit == 16 * 1024 * 1024
    assert cfg.global_.windows == (("1m", 60.0), ("5m", 300.0), ("15m", 900.0), ("1h", 3600.0))
    assert cfg.global_.min_query_tokens == 2000
    assert cfg.longest_window == 3600.0


@pytest.mark.parametrize("raw, minutes", [
    ({}, 35),  # the look-back's 30 minutes and the deploy rule's 5-minute baseline before an event
    ({"rules": {"event_lookback": "45m"}}, 50),
    ({"rules": {"hit_rate_drop_after_deploy": {"baseline": "10m"}}}, 40),
    # the causes' earlier window: the 20 minutes before the last 20
    ({"global": {"windows": ["20m", "1h"]}, "rules": {"hit_rate_low": {"window": "20m"}, "router_prediction_gap": {"window": "20m"}}}, 40),
])
def test_anchored_seconds_is_how_far_back_a_read_ending_before_now_reaches(raw, minutes):
    assert load(raw).anchored_seconds == minutes * 60.0


def test_defaults_live_in_one_place():
    cfg = load_file(str(FIXTURES / "config" / "minimal.yml"))
    assert cfg.global_ == config.GlobalConfig()
    assert cfg.web.listen_address == ":9464"


def test_every_error_is_reported_at_once_with_its_key_path():
    with pytest.raises(ConfigError) as exc:
        load_file(str(FIXTURES / "config" / "bad.yml"))
    errors = exc.value.errors
    for path in ("global.poll_interval", "global.body_size_limit", "global.windows[1]", "global.retention: unknown key",
                 "web.listen_address", "targets[0].url", "targets[0].labels.target", "targets[0].labels.bad-name",
                 "targets[1].name: required", "targets[1].lables: unknown key", "targets[2].name: duplicate",
                 # windows: [1m] keeps a minute of history: the 5m rules would silently judge less
                 "rules.hit_rate_low: window looks back 300s", "rules.ttft_regression", "rules.hit_rate_drop_after_deploy",
                 "rules.counters_disagree",
                 # and the rules that read one of global.windows name one it does not keep
                 "rules.hit_rate_low.window: 5m is not one of global.windows (1m)", "rules.router_prediction_gap.window"):
        assert any(e.startswith(path) for e in errors), (path, errors)
    assert len(errors) == 17


@pytest.mark.parametrize("label", ["severity", "cause", "alertname", "model_name", "reason"])
def test_target_labels_may_not_override_alert_labels(label):
    with pytest.raises(ConfigError) as exc:
        load({"targets": [{"name": "a", "url": "http://127.0.0.1:1/metrics", "labels": {label: "x"}}]})
    assert exc.value.errors == [f"targets[0].labels.{label}: reserved by the exporter"]


def test_every_label_of_our_metrics_is_reserved():
    """A target label named like one of ours (`reason` on rejected_samples) would be
    overwritten silently on that metric: every label name of the table is reserved."""
    from exporter.serve.collector import METRICS
    from exporter.config.sections import is_reserved_label
    ours = {label for d in METRICS.values() if d.target_labels and "target" in d.labels for label in d.labels}
    assert {label for label in ours if not is_reserved_label(label)} == set()


@pytest.mark.parametrize("content, error", [
    pytest.param("", "is empty", id="empty"),
    pytest.param("  \n\t\n", "is empty", id="whitespace-only"),
    pytest.param("x" * (64 * 1024 + 1), "larger than 65536 bytes", id="too-large"),
    pytest.param("a\x00b", "control characters", id="control-characters"),
])
def test_a_token_file_that_would_disable_auth_is_rejected(tmp_path, content, error):
    token = tmp_path / "token"
    token.write_text(content)
    with pytest.raises(ConfigError) as exc:
        load({"deploys": {"api_token_file": str(token)}}, read_secret_file)
    assert len(exc.value.errors) == 1 and error in exc.value.errors[0]


def test_a_secret_file_is_read_bounded_and_never_waited_on(tmp_path):
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as exc:
        load({"deploys": {"api_token_file": str(fifo)}}, read_secret_file)
    assert exc.value.errors == [f"deploys.api_token_file: cannot read {fifo}: not a regular file (a FIFO or a device is never read)"]


def test_a_config_given_as_text_reads_no_file_it_names(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret")
    with pytest.raises(ConfigError, match="the files a config names are read only from a config file"):
        load({"deploys": {"api_token_file": str(token)}})


def test_the_deploy_api_is_closed_without_a_token_open_only_on_purpose_and_an_optional_token_may_be_absent(tmp_path):
    assert load({}).deploys.api_token == "" and not load({}).deploys.api_open
    assert load({"deploys": {"api_open": True}}).deploys.api_open
    missing = str(tmp_path / "secret" / "token")  # an optional Secret that was not created mounts nothing
    assert load({"deploys": {"api_token_file": missing, "api_token_optional": True}}, read_secret_file).deploys.api_token == ""
    with pytest.raises(ConfigError, match="cannot read"):
        load({"deploys": {"api_token_file": missing}}, read_secret_file)
    (tmp_path / "token").write_text("s3cret\n")
    assert load({"deploys": {"api_token_file": str(tmp_path / "token"), "api_token_optional": True}}, read_secret_file).deploys.api_token == "s3cret"
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="is empty"):  # optional means absent, never empty: that fails closed
        load({"deploys": {"api_token_file": str(tmp_path / "empty"), "api_token_optional": True}}, read_secret_file)
    with pytest.raises(ConfigError, match="deploys.api_open"):
        load({"deploys": {"api_open": True, "api_token": "x"}})
    with pytest.raises(ConfigError, match="api_token_optional"):
        load({"deploys": {"api_token_optional": True}}, read_secret_file)


@pytest.mark.parametrize("text, fragment", [
    pytest.param("targets: [", "not valid YAML", id="bad-yaml"),
    pytest.param("- 1\n- 2\n", "<root>: must be a mapping", id="not-a-mapping"),
    pytest.param("targets: {a: 1}", "targets: must be a list", id="targets-not-list"),
    pytest.param("global: {windows: []}", "global.windows", id="empty-windows"),
    pytest.param("global: {windows: [1m, 60s]}", "windows must differ", id="duplicate-windows"),
    pytest.param("global: {poll_interval: 1s, read_timeout: 10s}", "4 poll intervals", id="timeout-longer-than-polls"),
    pytest.param("global: {min_query_tokens: -1}", "global.min_query_tokens", id="negative-floor"),
    pytest.param("global: {poll_interval: true}", "global.poll_interval", id="bool-duration"),
    # a base URL gets the API's path appended: a query or fragment would come before it (/?x=1/api/v1/query)
    pytest.param("discovery: {read_prometheus: {url: 'http://p:9090/?x=1', match_labels: {job: v}}}",
                 "discovery.read_prometheus.url: 'http://p:9090/?x=1': the API's path is appended", id="read-prometheus-query"),
    pytest.param("discovery: {prometheus: {url: 'http://p:9090/#x', job: v}}", "discovery.prometheus.url", id="discovery-fragment"),
    pytest.param("alertmanager: {urls: ['http://am:9093/?tenant=a']}", "alertmanager.urls[0]", id="alertmanager-query"),
    pytest.param("fleet_baseline: {prometheus_url: 'http://p:9090?'}", "fleet_baseline.prometheus_url", id="baseline-empty-query"),
])
def test_bad_values(text, fragment):
    with pytest.raises(ConfigError) as exc:
        load_text(text)
    assert any(fragment in e for e in exc.value.errors), exc.value.errors


def test_missing_file_is_a_config_error():
    with pytest.raises(ConfigError) as exc:
        load_file("/nonexistent/config.yml")
    assert "cannot read" in exc.value.errors[0]


@pytest.mark.parametrize("text, seconds", [("5s", 5), ("1m30s", 90), ("500ms", 0.5), ("1h", 3600), (2, 2.0), ("1d", 86400)])
def test_durations(text, seconds):
    assert config_reader.parse_duration(text) == seconds


@pytest.mark.parametrize("text, size", [("16MiB", 16 * 2**20), ("1KB", 1000), (512, 512), ("2 GiB", 2 * 2**30)])
def test_sizes(text, size):
    assert config_reader.parse_size(text) == size


def test_empty_config_is_valid_and_has_no_targets():
    assert load(None).targets == ()


# --- discovery --------------------------------------------------------------------------------
def test_discovery_selects_by_labels_and_the_old_job_key_still_works():
    new = load({"discovery": {"prometheus": {"url": "http://prom:9090", "match_labels": {"job": "llm/vllm", "namespace": "llm"}}}})
    p = new.discovery.prometheus
    assert p.match_labels == (("job", "llm/vllm"), ("namespace", "llm")) and p.wanted_labels == p.match_labels and p.scrape_pool == ""
    old = load({"discovery": {"prometheus": {"url": "http://prom:9090", "job": "vllm"}}})
    assert old.discovery.prometheus.wanted_labels == (("job", "vllm"),)
    both = load({"discovery": {"prometheus": {"url": "http://prom:9090", "job": "llm/vllm", "match_labels": {"version": "v2"},
                                              "scrape_pool": "podMonitor/llm/vllm/0"}}})
    assert both.discovery.prometheus.wanted_labels == (("job", "llm/vllm"), ("version", "v2"))
    assert both.discovery.prometheus.scrape_pool == "podMonitor/llm/vllm/0"


def test_discovery_limits_have_defaults_like_prometheus_scrape_limits():
    d = load({}).discovery
    assert (d.target_limit, d.label_limit, d.label_value_length_limit) == (2000, 64, 1024)
    d = load({"discovery": {"target_limit": 0, "label_limit": 10, "label_value_length_limit": 256}}).discovery
    assert (d.target_limit, d.label_limit, d.label_value_length_limit) == (0, 10, 256)


@pytest.mark.parametrize("prometheus, message", [
    pytest.param({"url": "http://prom:9090"}, "say which targets are ours", id="no-selector"),
    pytest.param({"url": "http://prom:9090", "job": "a", "match_labels": {"job": "b"}}, "contradicts match_labels.job", id="two-jobs"),
    pytest.param({"url": "http://prom:9090", "match_labels": {"app.kubernetes.io/name": "vllm"}}, "not a valid label name", id="bad-name"),
    pytest.param({"url": "http://prom:9090", "match_labels": {"version": 2}}, "must be a string", id="number-value"),
    pytest.param({"url": "http://prom:9090", "match_labels": {"__meta_kubernetes_pod_name": "x"}}, "no target carries a __ label", id="meta-label"),
    pytest.param({"url": "http://prom:9090", "match_labels": {}}, "non-empty mapping", id="empty"),
    pytest.param({"job": "vllm"}, "discovery.prometheus.url: required", id="no-url"),
])
def test_a_discovery_selector_that_cannot_select_is_a_config_error(prometheus, message):
    with pytest.raises(ConfigError, match=message):
        load({"discovery": {"prometheus": prometheus}})


def test_a_discovery_limit_must_be_a_whole_number():
    with pytest.raises(ConfigError, match="discovery.target_limit"):
        load({"discovery": {"target_limit": -1}})


def test_a_bad_rule_setting_is_listed_with_its_key_path_not_a_crash():
    """A wrong `for` used to leave RuleSettings without it: a TypeError instead of the list."""
    with pytest.raises(ConfigError) as exc:
        load({"rules": {"hit_rate_low": {"for": "soon"}, "target_down": {"startup_grace": -1}, "cold_start_grace": "x",
                        "change_point": {"recent": "q"}}})
    assert [e.split(":")[0] for e in exc.value.errors] == [
        "rules.hit_rate_low.for", "rules.target_down.startup_grace", "rules.cold_start_grace", "rules.change_point.recent"]


def test_the_rules_defaults_are_the_packaged_yaml():
    """One home: what an empty config gets is exactly exporter/config/default_rules.yml."""
    packaged = config.default_rules_yaml()
    rc = load({}).rules
    assert rc.cold_start_grace == config_reader.parse_duration(packaged["cold_start_grace"])
    assert rc.event_lookback == config_reader.parse_duration(packaged["event_lookback"])
    assert rc.cause_settings().event_lookback == rc.event_lookback == 1800.0
    assert rc.change_point.min_query_tokens == packaged["change_point"]["min_query_tokens"]
    assert rc.rules["PrefixCacheTTFTRegression"].reference == config_reader.parse_duration(packaged["ttft_regression"]["reference"])


# --- a rule that reads one of global.windows must name one (issue 30) ----------------------------
@pytest.mark.parametrize("rules, path", [
    pytest.param({"router_prediction_gap": {"window": "2m"}}, "rules.router_prediction_gap.window: 2m is not one of global.windows",
                 id="router-gap-never-ran"),
    pytest.param({"hit_rate_low": {"window": "7m"}}, "rules.hit_rate_low.window: 7m is not one of global.windows",
                 id="no-fleet-ratios-no-scatter"),
])
def test_a_rule_window_the_windows_do_not_keep_is_refused_with_its_key_path(rules, path):
    """It loaded cleanly and the rule never ran (load_balancer_scatter could then never be
    a cause)."""
    with pytest.raises(ConfigError) as exc:
        load({"rules": rules})
    (error,) = exc.value.errors
    assert error.startswith(path) and "(1m, 5m, 15m, 1h)" in error


def test_a_rule_window_among_the_windows_or_a_disabled_rule_loads():
    among = load({"global": {"windows": ["1m", "2m", "1h"]}, "rules": {"router_prediction_gap": {"window": "2m"},
                                                                        "hit_rate_low": {"window": "2m"}}})
    assert among.global_.windows == (("1m", 60.0), ("2m", 120.0), ("1h", 3600.0))
    gap, low = among.rules.rules["PrefixCacheRouterPredictionGap"], among.rules.rules["PrefixCacheHitRateLow"]
    assert (gap.enabled, gap.window) == (True, 120.0) and (low.enabled, low.window) == (True, 120.0)
    disabled = load({"rules": {"router_prediction_gap": {"window": "2m", "enabled": False}}}).rules.rules["PrefixCacheRouterPredictionGap"]
    assert (disabled.enabled, disabled.window) == (False, 120.0)
    # the other rules compute their windows from the history: any span it keeps
    rules = load({"rules": {"hits_stuck_at_zero": {"window": "90s"}, "counters_disagree": {"window": "7m"}}}).rules.rules
    assert rules["PrefixCacheHitsStuckAtZero"].window == 90.0 and rules["PrefixCacheCountersDisagree"].window == 420.0


@pytest.mark.slow
def test_check_config_and_a_reload_refuse_a_rule_window_the_windows_do_not_keep(tmp_path, caplog):
    import subprocess
    import sys
    import yaml
    from exporter.sidecar import build_sidecar
    good = {"global": {"poll_interval": "1s", "connect_timeout": "200ms", "read_timeout": "200ms"},
            "targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/metrics"}]}
    bad = {**good, "rules": {"router_prediction_gap": {"window": "2m"}}}
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(bad))
    proc = subprocess.run([sys.executable, "-m", "exporter", "check-config", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "rules.router_prediction_gap.window: 2m is not one of global.windows" in proc.stderr + proc.stdout
    path.write_text(yaml.safe_dump(good))
    sidecar = build_sidecar(load_file(str(path)), "127.0.0.1:0").start()
    try:
        path.write_text(yaml.safe_dump(bad))
        assert sidecar.reload(str(path)) is False
        assert "rules.router_prediction_gap.window: 2m is not one of global.windows" in caplog.text
        assert sidecar.config.rules.rules["PrefixCacheRouterPredictionGap"].window == 300.0  # the old config kept
    finally:
        sidecar.stop()


# --- targets[].kv_events and kv_events: (exporter/config/kvevents.py) -----------------------------
def test_a_targets_kv_events_are_read_from_where_vllm_binds_them_or_where_we_bind():
    from exporter.config.kvevents import KVEndpoint, KVEventsConfig

    cfg = load({"targets": [
        {"name": "a", "url": "http://10.0.0.5:8000/metrics",
         "kv_events": {"endpoint": "tcp://10.0.0.5:5557", "topic": "kv", "replay_endpoint": "tcp://10.0.0.5:5558"}},
        {"name": "b", "url": "http://10.0.0.6:8000/metrics", "kv_events": {"bind": "tcp://0.0.0.0:5600"}},
        {"name": "c", "url": "http://10.0.0.7:8000/metrics"}],
        "kv_events": {"tokenizer": "/models/llama/tokenizer.json", "top_groups": 5}})
    a, b, c = cfg.targets
    assert a.kv_events == KVEndpoint("tcp://10.0.0.5:5557", False, "kv", "tcp://10.0.0.5:5558")
    assert b.kv_events == KVEndpoint("tcp://0.0.0.0:5600", True) and c.kv_events is None
    assert cfg.kv_events == KVEventsConfig(tokenizer="/models/llama/tokenizer.json", top_groups=5)


@pytest.mark.parametrize("kv, message", [
    ({"endpoint": "tcp://*:5557"}, "is vLLM's side"),
    ({"endpoint": "tcp://a:1", "bind": "tcp://*:2"}, "give one of endpoint"),
    ({}, "give one of endpoint"),
    ({"endpoint": "http://a:1"}, "is not tcp://host:port"),
    ({"endpoint": "tcp://a:1", "hwm": 5}, "unknown key"),
])
def test_a_kv_events_endpoint_that_cannot_work_is_refused_with_why(kv, message):
    with pytest.raises(ConfigError) as exc:
        load({"targets": [{"name": "a", "url": "http://a:8000/metrics", "kv_events": kv}]})
    assert message in str(exc.value)


def test_analysis_scope_labels_name_what_owns_a_replica():
    assert load({}).analysis.scope_labels == ("namespace", "owner")
    assert load({"analysis": {"scope_labels": ["namespace", "deployment"]}}).analysis.scope_labels == ("namespace", "deployment")
    assert load({"analysis": {"scope_labels": []}}).analysis.scope_labels == ()  # every replica of a model as one scope
    for bad, says in ((["namespace", "namespace"], "twice"), ("namespace", "a list"), (["a-b"], "not a valid label name"),
                      (["model"], "exporter or /api/v1/analysis uses"), (["model_name"], "exporter or /api/v1/analysis uses"),
                      (["version"], "exporter or /api/v1/analysis uses")):
        with pytest.raises(ConfigError, match=says):
            load({"analysis": {"scope_labels": bad}})
    with pytest.raises(ConfigError, match="analysis.scope_labels: release is analysis.version_label"):
        load({"analysis": {"version_label": "release", "scope_labels": ["namespace", "release"]}})
