"""The alert state machine, transition by transition, with an injected clock."""
import pytest

from exporter.alerting.rules import RuleSettings
from exporter.alerting.rules_state import FIRING, INACTIVE, INCONCLUSIVE, NO_TRAFFIC, PENDING, RESOLVED, Alert, Condition, step

TRUE, FALSE, INCON = Condition("true", 0.1, "s", "d"), Condition("false"), Condition(INCONCLUSIVE, None, "s", "d")


def settings(for_=10.0, keep=0.0):
    return RuleSettings(enabled=True, severity="warning", for_=for_, keep_firing_for=keep)


def describe(alert, cond):
    from dataclasses import replace
    return replace(alert, labels=alert.labels or (("alertname", alert.alertname),), annotations=(("summary", cond.summary),))


def run(conds, for_=10.0, keep=0.0, step_s=5.0, bound=600.0):
    """Feed conditions at t=0, 5, 10, ...; returns [(t, state, transition or None)]."""
    alert = Alert("A", "t", "m")
    out = []
    for i, cond in enumerate(conds):
        t = i * step_s
        alert, tr = step(alert, cond, t, settings(for_, keep), describe, inconclusive_bound=bound)
        out.append((t, alert.state, tr.state if tr else None))
    return out


@pytest.mark.parametrize("conds, for_, keep, expected", [
    pytest.param([FALSE, FALSE], 10, 0, [INACTIVE, INACTIVE], id="stays-inactive"),
    pytest.param([TRUE, TRUE, TRUE], 10, 0, [PENDING, PENDING, FIRING], id="pending-then-firing-after-for"),
    pytest.param([TRUE], 0, 0, [FIRING], id="for-zero-fires-at-once"),
    pytest.param([TRUE, FALSE], 10, 0, [PENDING, INACTIVE], id="pending-drops-silently"),
    pytest.param([TRUE, TRUE, TRUE, FALSE], 10, 0, [PENDING, PENDING, FIRING, INACTIVE], id="firing-resolves"),
    pytest.param([TRUE, TRUE, TRUE, FALSE, FALSE, FALSE], 10, 10, [PENDING, PENDING, FIRING, FIRING, FIRING, INACTIVE],
                 id="keep-firing-for-counts-from-the-first-false-evaluation"),
    pytest.param([TRUE, INCON, TRUE, TRUE], 10, 0, [PENDING, INACTIVE, PENDING, PENDING], id="inconclusive-ends-pending"),
    pytest.param([TRUE, TRUE, TRUE, FALSE, TRUE], 10, 10, [PENDING, PENDING, FIRING, FIRING, FIRING], id="keep-firing-bridges-a-gap"),
    pytest.param([INCON, INCON], 10, 0, [INCONCLUSIVE, INCONCLUSIVE], id="inconclusive-never-fires"),
    pytest.param([INCON, TRUE, TRUE, TRUE], 10, 0, [INCONCLUSIVE, PENDING, PENDING, FIRING], id="inconclusive-then-data"),
    pytest.param([TRUE, TRUE, TRUE, INCON, INCON], 10, 0, [PENDING, PENDING, FIRING, FIRING, FIRING], id="firing-holds-when-inconclusive"),
    pytest.param([INCON, FALSE], 10, 0, [INCONCLUSIVE, INACTIVE], id="inconclusive-to-inactive"),
])
def test_state_machine(conds, for_, keep, expected):
    assert [s for _, s, _ in run(conds, for_, keep)] == expected


def test_transitions_are_pending_firing_resolved_only():
    out = run([TRUE, TRUE, TRUE, FALSE])
    assert [tr for _, _, tr in out] == [PENDING, None, FIRING, RESOLVED]


def test_labels_stay_while_annotations_follow():
    alert = Alert("A", "t", "m")
    alert, _ = step(alert, Condition("true", 1.0, "first"), 0.0, settings(0), describe, inconclusive_bound=600.0)
    alert, _ = step(alert, Condition("true", 2.0, "second"), 5.0, settings(0), describe, inconclusive_bound=600.0)
    assert alert.labels == (("alertname", "A"),) and dict(alert.annotations)["summary"] == "second"
    assert alert.value == 2.0 and alert.fired_at == 0.0


def test_a_firing_alert_inconclusive_past_its_bound_resolves_saying_there_was_no_traffic_to_judge():
    """Prometheus resolves an alert whose expression has no result: a pod whose traffic
    went away must not page for ever. Last true at 10, inconclusive from 15: held while
    under the bound of 20 s, resolved at 30 with the reason; inconclusive after, never firing."""
    out = run([TRUE, TRUE, TRUE, INCON, INCON, INCON, INCON, INCON], bound=20.0)
    assert [s for _, s, _ in out] == [PENDING, PENDING, FIRING, FIRING, FIRING, FIRING, INACTIVE, INCONCLUSIVE]
    assert [tr for _, _, tr in out][6] == RESOLVED
    alert = Alert("A", "t", "m")
    for i, cond in enumerate([TRUE, TRUE, TRUE, INCON, INCON, INCON, INCON]):
        alert, tr = step(alert, cond, i * 5.0, settings(), describe, inconclusive_bound=20.0)
    assert tr is not None and "no traffic to judge" in dict(tr.alert.annotations)[NO_TRAFFIC]


def test_a_lull_under_the_bound_keeps_it_firing_and_data_again_restarts_the_count():
    out = run([TRUE, TRUE, TRUE, INCON, INCON, INCON, TRUE, INCON, INCON, INCON], bound=20.0)
    assert [s for _, s, _ in out] == [PENDING, PENDING, FIRING, FIRING, FIRING, FIRING, FIRING, FIRING, FIRING, FIRING]


def test_keep_firing_for_longer_than_the_bound_holds_an_inconclusive_alert_as_long():
    out = run([TRUE, TRUE, TRUE] + [INCON] * 6, keep=25.0, bound=10.0)
    assert [s for _, s, _ in out][3:] == [FIRING] * 4 + [INACTIVE, INCONCLUSIVE]  # last true at 10: resolved at 35


def test_a_pending_alert_that_ends_says_so():
    out = run([TRUE, FALSE])
    assert [tr for _, _, tr in out] == [PENDING, INACTIVE]


def test_labels_follow_the_evidence_while_pending_and_freeze_when_firing():
    from dataclasses import replace

    def by_cause(alert, cond):
        return replace(alert, labels=(("cause", cond.summary),), annotations=(("summary", cond.summary),))

    s = settings(for_=10.0)
    alert = Alert("A", "t", "m")
    for t, cause in ((0.0, "prompt_prefix_change"), (5.0, "eviction_pressure"), (10.0, "eviction_pressure"), (15.0, "unknown")):
        alert, _ = step(alert, Condition("true", 1.0, cause), t, s, by_cause, inconclusive_bound=600.0)
        if t == 5.0:
            assert dict(alert.labels)["cause"] == "eviction_pressure" and alert.state == PENDING
    assert alert.state == FIRING and dict(alert.labels)["cause"] == "eviction_pressure"
    assert dict(alert.annotations)["summary"] == "unknown"


# --- rules as units: declared once in the registry, discovered by everything else -----------
import dataclasses  # noqa: E402

import yaml  # noqa: E402

from exporter.config import sections as config
from exporter.alerting import rules  # noqa: E402
from exporter.config.sections import ConfigError, load  # noqa: E402
from exporter.alerting.warmth import WARM_SPAN  # noqa: E402
from exporter.monitor.engine import Engine  # noqa: E402
from exporter.series.hitratio import judged_ratio  # noqa: E402
from exporter.parse.vllm_metrics import parse  # noqa: E402


def test_every_registered_rule_has_exactly_its_settings_in_the_packaged_defaults_and_nothing_else_there():
    packaged = config.default_rules_yaml()
    for rule in rules.REGISTRY:
        assert set(packaged[rule.key]) == set(rules.COMMON_SETTINGS) | set(rule.settings), rule.key
        assert set(rule.look_back) <= set(rule.settings), rule.key
    sections = {k for k, v in packaged.items() if isinstance(v, dict)} - {"change_point"}
    assert sections == {rule.key for rule in rules.REGISTRY}
    assert len({r.alertname for r in rules.REGISTRY}) == len(rules.REGISTRY) == len({r.key for r in rules.REGISTRY})


def test_rule_settings_default_no_value_of_their_own():
    """The YAML is the one home of the defaults: a number here would be a second one."""
    for f in dataclasses.fields(rules.RuleSettings):
        assert f.default in (dataclasses.MISSING, None), f.name
    loaded = load({}).rules.rules
    for rule in rules.REGISTRY:
        s = loaded[rule.alertname]
        for f in dataclasses.fields(s):
            key = "for" if f.name == "for_" else f.name
            # a setting the rule takes comes from the YAML; one it does not take is None, never a stray default
            assert (getattr(s, f.name) is not None) == (key in rules.COMMON_SETTINGS or key in rule.settings), (rule.key, key)


TEST_RULE_KEY, TEST_ALERT = "hit_rate_very_low", "PrefixCacheTestOnlyVeryLow"


def very_low(f: rules.Facts, s: rules.RuleSettings, rc: rules.RulesConfig) -> Condition:
    ws = f.window(s.window)
    r = judged_ratio(ws)
    if r is None or f.query_tokens(ws) < s.min_query_tokens or r >= s.below:
        return FALSE
    return Condition("true", r, f"{f.model} on {f.target} hits {r:.0%}", "a test-only rule")


@pytest.fixture
def test_rule(monkeypatch):
    """A rule registered and given its defaults (in the YAML, their one home) and nothing else."""
    rule = rules.Rule(TEST_RULE_KEY, TEST_ALERT, ("window", "below", "min_query_tokens"), very_low, look_back=("window",))
    monkeypatch.setattr(rules, "REGISTRY", rules.REGISTRY + (rule,))
    packaged = config.default_rules_yaml()
    section = yaml.safe_load("{enabled: true, severity: warning, for: 0s, keep_firing_for: 0s, window: 1m, below: 0.2, "
                             "min_query_tokens: 1000}")
    monkeypatch.setattr(config, "default_rules_yaml", lambda: {**packaged, TEST_RULE_KEY: section})
    return rule


def scrape(queries: float, hits: float) -> str:
    return ("process_start_time_seconds 0\n"
            f'vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {queries}\n'
            f'vllm:prefix_cache_hits_total{{model_name="m",engine="0"}} {hits}\n')


def test_a_rule_registered_once_is_loaded_validated_evaluated_and_linked_to_its_runbook_section(test_rule):
    # loaded from the config over its packaged defaults
    assert load({}).rules.rules[TEST_ALERT].below == 0.2
    assert load({"rules": {TEST_RULE_KEY: {"below": 0.3}}}).rules.rules[TEST_ALERT].below == 0.3
    # validated: unknown keys, bad values and a look-back past the history kept, each with its key path
    with pytest.raises(ConfigError) as exc:
        load({"rules": {TEST_RULE_KEY: {"bogus": 1, "below": "half"}}})
    assert any(e.startswith(f"rules.{TEST_RULE_KEY}.bogus: unknown key") for e in exc.value.errors)
    assert any(e.startswith(f"rules.{TEST_RULE_KEY}.below:") for e in exc.value.errors)
    with pytest.raises(ConfigError) as exc:
        load({"global": {"windows": ["1m"]}, "rules": {TEST_RULE_KEY: {"window": "5m"}}})
    assert any(e.startswith(f"rules.{TEST_RULE_KEY}: window looks back 300s") for e in exc.value.errors)
    # evaluated by the engine, with the link to its runbook section; and resolving
    engine = Engine(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/metrics"}]}))
    queries = hits = 0.0
    seen = []
    for i in range(60):
        t = 10_000.0 + 5 * i
        queries += 2000
        hits += 2000 * (0.9 if i < 20 or i >= 40 else 0.05)
        engine.ingest("vllm-0", t, parse(scrape(queries, hits)))
        seen += [(tr.t, tr.state, tr.alert) for tr in engine.evaluate(t) if tr.alert.alertname == TEST_ALERT]
    assert [state for _, state, _ in seen] == ["firing", "resolved"]
    fired = seen[0][2]
    assert dict(fired.labels)["target"] == "vllm-0" and dict(fired.labels)["model_name"] == "m"
    assert dict(fired.annotations)["runbook_url"].endswith("/alerts/runbook.md#" + test_rule.runbook_anchor)
    assert test_rule.runbook_anchor == TEST_ALERT.lower()


@pytest.mark.parametrize("key, settings, error", [
    pytest.param("no_defaults", ("window",), "default_rules.yml:no_defaults: must give exactly the settings the rule takes "
                 "(enabled, for, keep_firing_for, severity, window)", id="without-its-defaults-in-the-yaml"),
    pytest.param("bad_setting", ("windoww",), "exporter/alerting/rules.py REGISTRY: bad_setting takes windoww, which no rule setting reads (a new "
                 "setting is a field of RuleSettings in exporter/alerting/rules.py and a parser in _RULE_FIELDS of exporter/config/sections.py)",
                 id="taking-a-setting-nothing-reads"),
])
def test_a_registered_rule_the_config_cannot_read_is_refused(monkeypatch, key, settings, error):
    rule = rules.Rule(key, "PrefixCacheTestOnly" + key.title().replace("_", ""), settings, very_low)
    monkeypatch.setattr(rules, "REGISTRY", rules.REGISTRY + (rule,))
    with pytest.raises(ConfigError) as exc:
        load({})
    assert exc.value.errors == [error]


def test_every_setting_config_reads_is_a_field_of_rule_settings():
    """A setting with a parser but no RuleSettings field would be a TypeError at load, not a listed error."""
    import dataclasses

    from exporter.config.sections import _RULE_FIELDS
    assert {field for field, _ in _RULE_FIELDS.values()} == {f.name for f in dataclasses.fields(rules.RuleSettings)}


# --- thresholds compare tokens with tokens, also on a target counting blocks (issue 30) --------
def block_counting_run(scenario, until=600.0):
    """A vLLM 0.8 target (its lookup counters count 16-token blocks) at half a request a
    second: ~40,000 prompt tokens a minute, ~2,500 blocks."""
    from exporter.sim.simulator import Replica
    e = Engine(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/0"}]}))
    r = Replica("vllm-0", scenario, start=9100.0, seed=3, generation="v0.8")
    transitions, t = [], 10_000.0
    while t <= 10_000.0 + until:
        r.advance(t)
        e.ingest("vllm-0", t, parse(r.render()))
        transitions += e.evaluate(t)
        t += 5.0
    return e, transitions


def test_hits_stuck_at_zero_on_a_block_counting_target_pages_within_3_minutes():
    """It compared 20,000 (tokens) with ~2,500 blocks a minute: it never fired."""
    from exporter.sim.simulator import Event, Scenario
    e, transitions = block_counting_run(Scenario(request_rate=0.5, events=(Event(900 + 300, "hits_broken", True),)))
    ws = e.tracks["vllm-0"].view.stats["demo/llama-3-8b"]["1m"]
    assert ws.unit == "blocks" and ws.query_increase < 20000 <= ws.query_increase * 16
    fired = [t for t in transitions if t.alert.alertname == rules.HITS_STUCK_AT_ZERO and t.state == "firing"]
    assert fired and fired[0].t - 10_300.0 <= 180


def test_counters_disagreeing_on_a_block_counting_target_are_said():
    """Hits not counted while TTFT held: its 5m floor compared 20,000 with ~12,000 blocks."""
    from exporter.sim.simulator import HITS_NOT_WIRED, Event, Scenario
    e, transitions = block_counting_run(Scenario(request_rate=0.5, events=(Event(900 + 300, "counter_bug", HITS_NOT_WIRED),)),
                                        until=900.0)
    assert e.tracks["vllm-0"].view.stats["demo/llama-3-8b"]["5m"].query_increase < 20000
    fired = [t for t in transitions if t.state == "firing"]
    assert [t.alert.alertname for t in fired] == [rules.COUNTERS_DISAGREE]
    assert dict(fired[0].alert.labels)["cause"] == "instrumentation"


def test_the_token_floors_of_every_rule_read_a_block_counting_target_in_tokens():
    from exporter.series.hitratio import query_tokens
    from exporter.sim.simulator import Scenario
    e, _ = block_counting_run(Scenario(request_rate=0.5), until=120.0)
    view = e.tracks["vllm-0"].view
    ws = view.stats["demo/llama-3-8b"]["1m"]
    facts = rules.Facts(now=10_120.0, target="vllm-0", model="demo/llama-3-8b", up=True, down_since=None,
                        snapshot=view.snapshot, samples=view.samples, stats=view.stats["demo/llama-3-8b"],
                        windows={60.0: "1m", 300.0: "5m"}, events=(), block_size=view.snapshot.block_size)
    assert facts.query_tokens(ws) == query_tokens(ws) == ws.query_increase * 16 > 20000 > ws.query_increase


def test_an_alert_name_has_one_severity_whatever_its_cause():
    """kube-prometheus-stack inhibits `severity=warning` by `severity=critical` with equal
    namespace and alertname: a name that carried two severities (critical, and warning for
    a traffic mix) let one pod's critical silence another pod's warning."""
    from exporter.alerting import causes
    configured = load({}).rules.rules
    severities: dict[str, set[str]] = {}
    for rule in rules.REGISTRY:
        for cause in causes.CAUSES:
            name, severity = rule.delivered_as(cause, configured[rule.alertname].severity)
            severities.setdefault(name, set()).add(severity)
    assert set(severities) == set(rules.ALERT_NAMES)
    assert {name: s for name, s in severities.items() if len(s) != 1} == {}
    drop = rules.registered(rules.DROP_AFTER_DEPLOY)
    assert drop.delivered_as(causes.TRAFFIC_MIX, "critical") == (rules.TRAFFIC_MIX_CHANGED, "warning")
    assert drop.delivered_as(causes.PROMPT_PREFIX_CHANGE, "critical") == (rules.DROP_AFTER_DEPLOY, "critical")
    assert drop.delivered_as(causes.TRAFFIC_MIX, "info") == (rules.TRAFFIC_MIX_CHANGED, "info")  # never above the rule's own
    assert rules.registered(rules.TRAFFIC_MIX_CHANGED) is drop


def test_hits_stuck_at_zero_waits_until_the_cold_cache_shows_it_will_not_refill_and_then_pages_at_its_own_severity():
    """It fired during the grace as `info` with cause cold_start, and, its labels fixed once
    firing, never paged for a cache that stayed cold past it. Now the grace ends once the
    ratio sits flat (at zero) for two minutes of traffic, and it pages then, as critical."""
    engine = Engine(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/metrics"}]}))
    start = 10_000.0
    queries = 0.0
    seen = []
    for i in range(300):
        t = start + 5 * i
        queries += 2000
        hits = 0.0 if i < 200 else 1000.0 * (i - 199)
        body = (f"process_start_time_seconds {start - 5}\n"
                f'vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {queries}\n'
                f'vllm:prefix_cache_hits_total{{model_name="m",engine="0"}} {hits}\n')
        engine.ingest("vllm-0", t, parse(body))
        seen += [(tr.t - start, tr.state, dict(tr.alert.labels)) for tr in engine.evaluate(t)
                 if tr.alert.alertname == rules.HITS_STUCK_AT_ZERO and tr.state in ("firing", "resolved")]
    grace = load({}).rules.cold_start_grace
    assert [state for _, state, _ in seen] == ["firing", "resolved"]
    assert 2 * WARM_SPAN <= seen[0][0] < grace and seen[0][2]["cause"] != "cold_start" and seen[0][2]["severity"] == "critical"


def test_the_drop_after_a_deploy_is_not_judged_across_a_later_growth_of_the_fleet():
    """A harmless deploy, then a scale-out under round robin: the ratio after the deploy
    fell, but the fleet grew since (replicas_changed, a warning of the low ratio), which a
    critical drop 'after deploy v42' would blame on the deploy."""
    from exporter.alerting.deploys import API, REPLICAS, DeployEvent
    e = Engine(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/0"}]}))
    queries = hits = 0.0
    for i in range(120):
        t = 10_000.0 + 5.0 * i
        queries += 20_000
        hits += 16_000 if t < 10_300.0 else 6_000
        e.ingest("vllm-0", t, parse("process_start_time_seconds 1\n"
                                    f'vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {queries}\n'
                                    f'vllm:prefix_cache_hits_total{{model_name="m",engine="0"}} {hits}\n'))
        if t == 10_200.0:
            e.add_event(DeployEvent(t, None, "v42", API))
        if t == 10_295.0:
            e.add_event(DeployEvent(t, None, "replicas:2->6", REPLICAS, model="m", replicas=(2, 6), ratio_before=0.8))
        fired = [tr for tr in e.evaluate(t) if tr.alert.alertname == rules.DROP_AFTER_DEPLOY]
        assert fired == [], t


def test_target_down_says_why_the_target_could_not_be_polled():
    """An adopter's read pod went down with 'no sample in Prometheus since ...': the alert
    said only that it could not be polled. Its description now carries the last error."""
    settings = load({}).rules
    rc, s = settings, settings.rules[rules.TARGET_DOWN]
    base = rules.Facts(now=1_000.0, target="vllm-0", model="", up=False, down_since=100.0, snapshot=None, samples=(),
                       stats={}, windows={}, events=(), ever_up=True)
    cond = rules.rule_target_down(dataclasses.replace(base, last_error="no sample in Prometheus since 2026-12-04T05:43:12Z "
                                                                       "(stale after 45s)"), s, rc)
    assert cond.state == "true"
    assert cond.description.startswith("The sidecar gets no vLLM metrics from the target (no sample in Prometheus since "
                                       "2026-12-04T05:43:12Z (stale after 45s)): it is down")
    long = rules.rule_target_down(dataclasses.replace(base, last_error="x" * 5000), s, rc)
    assert len(long.description) < 400  # a body quoted in an error does not become the alert's text
    assert "()" not in rules.rule_target_down(base, s, rc).description


def test_an_event_we_found_is_named_by_its_time_not_an_epoch():
    from exporter.alerting.rules import utc_time

    assert utc_time(1796680560.0) == "2026-12-07 21:56:00 UTC"
