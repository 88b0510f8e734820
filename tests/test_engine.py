"""The engine end to end on simulated scrapes: each rule fires where it should."""


import re

import pytest

from exporter.sim import simulator
from exporter.config.sections import load
from exporter.alerting.deploys import DeployEvent
from exporter.monitor.engine import Engine
from exporter.sim.simulator import Event, Replica, Scenario
from exporter.parse.vllm_metrics import parse

START = 10_000.0


def engine_for(n, **rules):
    cfg = load({"targets": [{"name": f"vllm-{i}", "url": f"http://127.0.0.1:1/{i}"} for i in range(n)], "rules": rules})
    return Engine(cfg)


def drive(engine, replicas, until, step=5.0, down=()):
    transitions = []
    t = START
    while t <= START + until:
        for r in replicas:
            r.advance(t)
            if (r.name, t) in down or r.name in down:
                engine.ingest_failure(r.name, t)
            else:
                engine.ingest(r.name, t, parse(r.render()))
        transitions += engine.evaluate(t)
        t += step
    return transitions


def firing(transitions, name):
    return [t for t in transitions if t.alert.alertname == name and t.state == "firing"]


def replica(i, scenario, warm=900.0):
    r = Replica(f"vllm-{i}", scenario, start=START - warm, seed=i)
    r.advance(START)
    return r


def test_caching_disabled_fires_with_its_cause():
    e = engine_for(1)
    tr = drive(e, [replica(0, Scenario(prefix_caching=False))], 120)
    (f,) = firing(tr, "PrefixCachingDisabled")
    assert dict(f.alert.labels)["cause"] == "caching_disabled"


def test_hits_stuck_at_zero_fires():
    e = engine_for(1)
    tr = drive(e, [replica(0, Scenario(events=(Event(900 + 10, "hits_broken", True),)))], 600)
    assert firing(tr, "PrefixCacheHitsStuckAtZero")


@pytest.mark.slow
def test_ttft_regression_fires_with_the_drop():
    e = engine_for(1, hit_rate_drop_after_deploy={"enabled": False}, change_point={"enabled": False})
    tr = drive(e, [replica(0, simulator.incident(900 + 600))], 1200)
    (f,) = firing(tr, "PrefixCacheTTFTRegression")
    assert "x its usual level" in dict(f.alert.annotations)["summary"]
    # the reference is said as far as the history reaches back: 1,200 s of it, not the 3,300 s configured
    before = int(re.search(r"ms in the (\d+)s before", dict(f.alert.annotations)["description"]).group(1))
    assert before <= 1200 - e.config.rules.rules["PrefixCacheTTFTRegression"].window, dict(f.alert.annotations)["description"]


def test_target_down_fires_after_its_for_and_resolves():
    e = engine_for(1)
    r = replica(0, Scenario())
    drive(e, [r], 30)
    tr = drive(e, [r], 90, down={"vllm-0"})
    assert [t.state for t in tr if t.alert.alertname == "PrefixCacheTargetDown"][:2] == ["pending", "firing"]


@pytest.mark.slow
def test_load_balancer_scatter_when_every_replica_sits_moderate_together():
    # prompts share only part of their prefix across a spread-out fleet: all replicas sit near 40%
    scenario = Scenario(request_rate=5.0, tenants=100, kv_blocks=4600)
    e = engine_for(3)
    tr = drive(e, [replica(i, scenario) for i in range(3)], 600)
    low = firing(tr, "PrefixCacheHitRateLow")
    assert low and {dict(t.alert.labels)["cause"] for t in low} == {"load_balancer_scatter"}


def test_old_events_are_forgotten_but_the_last_deploy_time_stays():
    from exporter.alerting.deploys import DeployEvent
    e = engine_for(1)
    e.add_event(DeployEvent(START, None, "v1", "api"))
    e.evaluate(START + 60)
    assert len(e.events) == 1
    e.evaluate(START + 3 * 3600)
    assert len(e.events) == 0
    assert e.last_deploy() == {"": START} and e.event_counts == {("", "api"): 1}


def firing_engine():
    """Two replicas after the timestamp incident: the drop alerts fire on both."""
    e = engine_for(2, change_point={"enabled": False})
    replicas = [replica(i, simulator.incident(900 + 120)) for i in range(2)]
    e.add_event(DeployEvent(START + 120, None, "v42", "api"))
    tr = drive(e, replicas, 240)
    assert len(firing(tr, "PrefixCacheHitRateDropAfterDeploy")) == 2
    return e, replicas


def resolved(transitions, name):
    return [t for t in transitions if t.alert.alertname == name and t.state == "resolved"]


def test_an_alert_of_a_rule_disabled_by_a_reload_resolves():
    e, _ = firing_engine()
    e.reconfigure(load({"targets": [{"name": f"vllm-{i}", "url": f"http://127.0.0.1:1/{i}"} for i in range(2)],
                        "rules": {"hit_rate_drop_after_deploy": {"enabled": False}, "change_point": {"enabled": False}}}))
    tr = e.evaluate(START + 245)
    assert {t.alert.target for t in resolved(tr, "PrefixCacheHitRateDropAfterDeploy")} == {"vllm-0", "vllm-1"}
    assert all(t.alert.resolved_at == START + 245 for t in tr if t.state == "resolved")
    assert not [a for a in e.alerts.values() if a.alertname == "PrefixCacheHitRateDropAfterDeploy"]


def test_an_alert_of_a_target_removed_by_a_reload_resolves():
    e, _ = firing_engine()
    e.reconfigure(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/0"}], "rules": {"change_point": {"enabled": False}}}))
    tr = e.evaluate(START + 245)
    assert [t.alert.target for t in resolved(tr, "PrefixCacheHitRateDropAfterDeploy")] == ["vllm-1"]
    assert {a.target for a in e.alerts.values()} == {"vllm-0"}


def test_a_reload_that_changes_the_windows_keeps_history_and_firing_alerts():
    e, replicas = firing_engine()
    before = len(e.tracks["vllm-0"].history)
    cfg = load({"targets": [{"name": f"vllm-{i}", "url": f"http://127.0.0.1:1/{i}"} for i in range(2)],
                "global": {"windows": ["1m", "5m", "15m", "1h", "2h"]}, "rules": {"change_point": {"enabled": False}}})
    e.reconfigure(cfg)
    assert len(e.tracks["vllm-0"].history) == before
    tr = []
    for t in (START + 245, START + 250, START + 255):
        for r in replicas:
            r.advance(t)
            e.ingest(r.name, t, parse(r.render()))
        tr += e.evaluate(t)
    assert not resolved(tr, "PrefixCacheHitRateDropAfterDeploy")
    assert len([a for a in e.firing() if a.alertname == "PrefixCacheHitRateDropAfterDeploy"]) == 2


def test_target_down_is_one_alert_per_target_whatever_its_models():
    e = engine_for(1, target_down={"for": "0s", "startup_grace": "0s"})
    r = Replica("vllm-0", Scenario(), start=START - 900, seed=1, model_names=("a", "b", "c"))
    drive(e, [r], 30)
    tr = drive(e, [r], 30, down=("vllm-0",))
    down = [t for t in tr if t.alert.alertname == "PrefixCacheTargetDown"]
    assert [(t.alert.model, t.state) for t in down] == [("", "firing")]


@pytest.mark.slow
def test_a_rollback_announced_during_an_incident_does_not_become_its_baseline():
    """The drop alert measures against the deploy that raised it: announcing the rollback
    (v43) while the hit ratio is still low keeps it firing until the ratio is back."""
    e = engine_for(1, change_point={"enabled": False}, hit_rate_low={"enabled": False}, ttft_regression={"enabled": False})
    deploy, rollback = 300.0, 600.0
    r = replica(0, Scenario(events=(Event(900 + deploy, "prompt", "timestamp"), Event(900 + rollback, "prompt", "static"))))
    e.add_event(DeployEvent(START + deploy, None, "v42", "api"))
    e.add_event(DeployEvent(START + rollback + 1, None, "v43", "api"))
    tr = drive(e, [r], 1500)
    drop = [(t.state, t.t - START) for t in tr if t.alert.alertname == "PrefixCacheHitRateDropAfterDeploy"]
    assert [s for s, _ in drop] == ["pending", "firing", "resolved"]
    resolved_at = drop[-1][1]
    assert resolved_at - rollback > 60  # not seconds after v43 was announced...
    ws = e.tracks["vllm-0"].view.stats["demo/llama-3-8b"]["5m"]
    assert ws.admitted_hit_ratio > 0.6  # ...but once the ratio is back


# --- versions side by side: a rolling update --------------------------------------------------
def rolling_update(new_scenario, new_version="v2", replicas=4, every=120.0, after=300.0, step=5.0, rollback_at=None):
    """`replicas` warm replicas of v1; from START one is replaced by a `new_version`
    replica every `every` seconds, as a Deployment's rolling update does (new pods,
    new names, cold caches). At `rollback_at` every replica is replaced by v1 again.
    -> (transitions, engine, {time: verdict of the new version})"""
    cfg = load({"targets": []})
    engine = Engine(cfg)
    pods = {f"old-{i}": ("v1", Replica(f"old-{i}", Scenario(), start=START - 900, seed=i)) for i in range(replicas)}
    transitions, verdicts, t, replaced = [], {}, START, 0
    while t <= START + replicas * every + after:
        if replaced < replicas and t >= START + replaced * every:
            pods.pop(f"old-{replaced}")
            pods[f"new-{replaced}"] = (new_version, Replica(f"new-{replaced}", new_scenario, start=t, seed=100 + replaced))
            replaced += 1
        if rollback_at is not None and t >= START + rollback_at and any(v == new_version for v, _ in pods.values()):
            pods = {f"back-{i}": ("v1", Replica(f"back-{i}", Scenario(), start=t, seed=200 + i)) for i in range(replicas)}
        targets = [{"name": n, "url": f"http://127.0.0.1:1/{n}", "labels": {"version": v, "namespace": "llm"}} for n, (v, _) in pods.items()]
        if [t_.name for t_ in engine.config.targets] != list(pods):
            engine.reconfigure(load({"targets": targets}))
        for name, (_, r) in pods.items():
            r.advance(t)
            engine.ingest(name, t, parse(r.render()))
        transitions += engine.evaluate(t)
        verdicts[t] = engine.analyze(t, simulator.Replica("x", Scenario(), 0).model_names[0], new_version)
        t += step
    return transitions, engine, verdicts


def fleet_alerts(transitions, state):
    return [tr for tr in transitions if tr.alert.alertname == "PrefixCacheHitRateDropAfterDeploy" and tr.alert.version
            and tr.state == state]


@pytest.mark.slow
def test_a_rolling_update_that_breaks_the_prompt_fires_before_half_the_fleet_has_rolled():
    tr, engine, verdicts = rolling_update(simulator.incident(0.0))  # the new image's prompt carries a timestamp
    (fired,) = fleet_alerts(tr, "firing")
    assert fired.t < START + 2 * 120, "must fire before the third replica is replaced"
    labels = dict(fired.alert.labels)
    assert labels["version"] == "v2" and labels["baseline_version"] == "v1"
    assert labels["cause"] == "prompt_prefix_change" and labels["namespace"] == "llm" and "target" not in labels
    assert verdicts[fired.t].verdict == "fail"
    # every replica rolled: the comparison is now with the model before the rollout, and it keeps firing
    assert not fleet_alerts(tr, "resolved")
    assert engine.rollouts and next(iter(engine.rollouts.values())).completed is not None
    late = verdicts[START + 4 * 120 + 240]  # no v1 replica left: against the model before the rollout
    assert late.verdict == "fail" and late.baseline_version == "v1" and late.baseline_hit_ratio > 0.8
    assert any(a.version == "v2" and a.state == "firing" for a in engine.active_alerts())


@pytest.mark.slow
def test_a_rollback_resolves_the_version_alert():
    tr, engine, _ = rolling_update(simulator.incident(0.0), rollback_at=4 * 120 + 60)
    (fired,) = fleet_alerts(tr, "firing")
    (resolved,) = fleet_alerts(tr, "resolved")
    assert fired.t < resolved.t and resolved.t >= START + 4 * 120 + 60
    assert not [a for a in engine.active_alerts() if a.version]


@pytest.mark.slow
def test_a_harmless_rolling_update_never_fires_and_passes_the_gate():
    tr, engine, verdicts = rolling_update(Scenario())
    assert not fleet_alerts(tr, "firing") and not fleet_alerts(tr, "pending")
    judged = [v for t, v in verdicts.items() if t >= START + 150]  # partial, then against the model before the rollout
    assert judged and all(v.verdict == "pass" for v in judged)


@pytest.mark.slow
def test_new_replicas_are_left_out_during_their_warmup():
    tr, engine, verdicts = rolling_update(simulator.incident(0.0))
    early = verdicts[START + 60]
    assert early.verdict == "inconclusive" and "cold start" in early.reason


def body(queries, hits, start=None, model="m"):
    text = "" if start is None else f"process_start_time_seconds {start}\n"
    return text + (f'vllm:prefix_cache_queries_total{{model_name="{model}",engine="0"}} {queries}\n'
                   f'vllm:prefix_cache_hits_total{{model_name="{model}",engine="0"}} {hits}\n')


def test_a_hits_counter_stepping_back_one_token_is_no_reset_no_event_and_no_page():
    """It used to add its whole value to every window (a ratio of 41.59), invent a change
    point, and page PrefixCacheHitRateDropAfterDeploy with cause=prompt_prefix_change
    while the real ratio was a steady 50%."""
    e = engine_for(1)
    queries = hits = 5e9  # a server that has counted for a while: its value dwarfs a window's increase
    e.add_event(DeployEvent(START + 600, None, "v2", "api"))
    transitions, ratios, found = [], [], []
    for i in range(300):
        t = START + 5.0 * i
        queries += 20000
        hits += 10000
        shown = hits - 10001 if i == 100 else hits  # one read a token short of the one before, then on
        found += e.ingest("vllm-0", t, parse(body(queries, shown, start=START - 3600)))
        transitions += e.evaluate(t)
        ratios += [ws.hit_ratio for ws in e.tracks["vllm-0"].view.stats["m"].values() if ws.hit_ratio is not None]
        if i == 100:
            snap = e.tracks["vllm-0"].view.snapshot
            assert dict(snap.rejected) == {"counter_step_back": 1}
            assert any("hits counter stepped back" in w for w in snap.warnings)
    assert found == [] and [t for t in transitions if t.state == "firing"] == []
    # the step is held a poll: a window ending on it misses one interval's hits, the next gets them
    assert all(0.0 <= r <= 1.0 for r in ratios) and min(ratios) > 0.45 and max(ratios) < 0.55


def test_one_url_round_robin_over_two_replicas_still_alerts():
    """Start times taking turns were a restart each poll: the target sat in its cold-start
    grace for ever and never alerted. Now it is reported, and the low ratio pages."""
    e = engine_for(1, hit_rate_low={"window": "1m", "for": "1m"})
    transitions, refused = [], 0
    for i in range(120):
        t = START + 5.0 * i
        a, b = (1e6 + 20000 * i, START - 3600), (3e6 + 20000 * i, START - 1800)
        queries, start = a if i % 2 == 0 else b
        e.ingest("vllm-0", t, parse(body(queries, queries * 0.05, start=start)))
        refused += dict(e.tracks["vllm-0"].view.snapshot.rejected).get("flapping_start_time", 0)
        transitions += e.evaluate(t)
    assert firing(transitions, "PrefixCacheHitRateLow") and refused >= 100
    assert "several processes answer at this URL" in " ".join(e.tracks["vllm-0"].view.snapshot.warnings)


def test_what_is_kept_per_target_goes_when_the_pod_goes():
    """40 pods, each replaced after one deploy event: nothing of a gone pod stays."""
    e = engine_for(0)
    for i in range(40):
        pod = f"pod-{i}"
        e.reconfigure(load({"targets": [{"name": pod, "url": f"http://127.0.0.1:1/{i}"}]}))
        t = START + 60.0 * i
        e.ingest(pod, t, parse(body(1e6 + i, 5e5)))
        e.add_event(DeployEvent(t, pod, f"v{i}", "api"))
        e.add_event(DeployEvent(t + 1, pod, f"restart@{i}", "restart"))
        e.evaluate(t + 2)
    e.add_event(DeployEvent(START, None, "fleet", "api"))
    assert set(e.last_deploy_t) == {"", "pod-39"} and set(e.last_event_t) == {"", "pod-39"}
    assert set(e.last_restart_t) == {"pod-39"} and {k[0] for k in e.event_counts} == {"", "pod-39"}
    assert set(e.last_deploy()) == {"", "pod-39"}


def _window(hits, queries, seconds=300.0):
    from exporter.series.window import WindowStats, _WindowValues
    values = dict.fromkeys(f for f in _WindowValues._fields if f != "lazy_ttft")
    values.update(window="5m", seconds=seconds, query_increase=queries, hit_increase=hits, unit="tokens",
                  hit_ratio=hits / queries, query_rate=queries / seconds, hit_rate=hits / seconds, samples=61)
    return WindowStats(**values)


def test_a_rollout_judged_against_before_is_no_fail_when_only_the_traffic_mix_changed():
    """Once every replica runs the new version it is judged against the model before the
    rollout: the same hit tokens/s over 60% more query tokens/s is a tenant joining."""
    from exporter.alerting import analysis
    before = (0.9 * 6500.0, 6500.0)  # (hit, query) tokens/s of the fleet before the rollout
    diluted = [analysis.Member(f"new-{i}", "v2", _window(0.9 * 6500 * 300 / 2, 10400.0 * 300 / 2)) for i in range(2)]
    v = analysis.judge(diluted, "m", "v2", "v1", 0.9, 6500.0 * 300, 2, "", 20000.0, 0.25, before)
    assert v.verdict == analysis.INCONCLUSIVE and "traffic_mix" in v.reason
    broken = [analysis.Member(f"new-{i}", "v2", _window(0.05 * 6500 * 300 / 2, 6500.0 * 300 / 2)) for i in range(2)]
    assert analysis.judge(broken, "m", "v2", "v1", 0.9, 6500.0 * 300, 2, "", 20000.0, 0.25, before).verdict == analysis.FAIL
    assert analysis.judge(diluted, "m", "v2", "v1", 0.9, 6500.0 * 300, 2, "", 20000.0, 0.25).verdict == analysis.FAIL


@pytest.mark.parametrize("lookback, reach, step, reload, most", [
    (None, 35 * 60, 15.0, False, 60.0), ("45m", 50 * 60, 15.0, False, 60.0), ("45m", 50 * 60, 15.0, True, 60.0),
    (None, 35 * 60, 30.0, False, 60.0),
    ("45m", 50 * 60, 20.0, True, 80.0),  # 20 s polls: the 30 s tier keeps every other (40 s), the minute one every third
])
def test_the_history_keeps_a_sample_a_minute_as_far_as_an_events_baseline_reaches_and_thins_the_hour_beyond(lookback, reach, step,
                                                                                                            reload, most):
    """A deploy the look-back still watches is judged against the 5 minutes before it: those
    keep a sample a minute (two in 5 minutes left a quiet pod's deploy inconclusive); older
    samples serve only the hour's left edge, one per thirtieth of it. A reload that lengthens
    the look-back moves the edge, as a fresh start with it would have it."""
    replica = Replica("vllm-0", Scenario(), start=START - 900, seed=0, generation="v0.10")
    rules = {"event_lookback": lookback} if lookback else {}
    e = engine_for(1, **({} if reload else rules))
    t = START
    while t <= START + 3900:
        if reload and t == START + 600:
            e.reconfigure(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/0"}], "rules": rules}))
        replica.advance(t)
        e.ingest("vllm-0", t, parse(replica.render()))
        e.evaluate(t)
        t += step
    now = t - step
    times = list(e.tracks["vllm-0"].history.samples().times)
    gaps = [(now - b, b - a) for a, b in zip(times, times[1:])]
    assert max(gap for age, gap in gaps if age <= reach) <= most
    assert min(gap for age, gap in gaps if age > reach + 120.0) >= 120.0
    assert now - times[0] >= 3600.0  # the hour's left edge is there


def test_the_ttft_from_before_the_hits_stopped_is_kept_while_they_stand_still_and_goes_with_its_target():
    stuck = Scenario(events=(Event(900 + 60, "counter_bug", simulator.HITS_NOT_WIRED),))
    replicas = [Replica(f"vllm-{i}", stuck, start=START - 900, seed=i, generation="v0.10") for i in range(2)]
    e = engine_for(2)
    drive(e, replicas, 240)
    kept = e.hits_references
    assert set(kept) == {("vllm-0", "demo/llama-3-8b"), ("vllm-1", "demo/llama-3-8b")}
    assert all(START < last <= START + 70 and 0 < p50 < 1 for last, p50 in kept.values())
    e.reconfigure(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/0"}]}))
    e.evaluate(START + 245)
    assert set(e.hits_references) == {("vllm-0", "demo/llama-3-8b")}


def test_the_ttft_from_before_the_hits_stopped_stays_the_one_found_first_as_its_samples_age_thin_and_miss_polls():
    stuck = Scenario(events=(Event(900 + 60, "counter_bug", simulator.HITS_NOT_WIRED),))
    replica = Replica("vllm-0", stuck, start=START - 900, seed=0, generation="v0.10")
    e = engine_for(1)
    drive(e, [replica], 600, step=15.0)
    first = dict(e.hits_references)
    assert list(first) == [("vllm-0", "demo/llama-3-8b")]
    t = START + 615.0
    while t <= START + 3000:  # the last hit 49 minutes old: past an event's baseline, its samples thinned
        replica.advance(t)
        if START + 2700 <= t < START + 2820:
            e.ingest_failure("vllm-0", t)  # 2 minutes without a poll: the shortest window knows no hits
        else:
            e.ingest("vllm-0", t, parse(replica.render()))
        e.evaluate(t)
        t += 15.0
    assert e.hits_references == first


def test_a_hits_counter_falling_40_percent_without_a_restart_is_no_prompt_change():
    """Part of a summed counter reset (a worker of several restarted): held at its old
    value, the hits stood still until the counter passed it again, which the change point
    took for a sharp drop, paging critical prompt_prefix_change while the true ratio
    stayed 0.8. Held for one poll, it counts on from its new value."""
    e = engine_for(1)
    queries, hits, lost = 5e9, 4e9, 0.0
    transitions, ratios, found = [], [], []
    for i in range(300):
        t = START + 5.0 * i
        queries += 20000
        hits += 16000
        if i == 100:
            lost = 0.4 * hits  # from here on the counter reads 40% low, as a sum missing one worker's part
        found += e.ingest("vllm-0", t, parse(body(queries, hits - lost, start=START - 3600)))
        transitions += e.evaluate(t)
        if i > 110:
            ratios += [ws.hit_ratio for ws in e.tracks["vllm-0"].view.stats["m"].values() if ws.hit_ratio is not None]
        if i in (100, 101):
            assert any("hits counter" in w for w in e.tracks["vllm-0"].view.snapshot.warnings)
    assert found == [] and transitions == []
    assert min(ratios) > 0.7 and max(ratios) <= 0.8 + 1e-9  # one poll's hits held, then 0.8 again


def replicas_of(engine, names, t):
    """Every named target serving model "m" at t (its first scrape)."""
    for name in names:
        if name not in engine.tracks:
            engine.reconfigure(engine.config.__class__(**{**engine.config.__dict__, "targets": engine.config.targets + (
                engine.config.targets[0].__class__(name, f"http://127.0.0.1:1/{name}"),)}))
        engine.ingest(name, t, parse(body(1000.0 * t, 800.0 * t, start=1.0)))


def test_a_change_of_the_replica_count_is_an_event_of_every_replica_of_the_model_once_it_held():
    e = engine_for(2)
    for t in (100.0, 105.0, 110.0):
        replicas_of(e, ["vllm-0", "vllm-1"], t)
        e.evaluate(t)
    assert not [ev for ev in e.events if ev.source == "replicas"]  # the first count is no change
    replicas_of(e, ["vllm-0", "vllm-1", "vllm-2"], 115.0)
    e.evaluate(115.0)
    assert not [ev for ev in e.events if ev.source == "replicas"]  # seen once: a wobble so far
    replicas_of(e, ["vllm-0", "vllm-1", "vllm-2"], 120.0)
    e.evaluate(120.0)
    (ev,) = [ev for ev in e.events if ev.source == "replicas"]
    assert (ev.t, ev.target, ev.model, ev.replicas, ev.is_deploy, ev.is_restart) == (115.0, None, "m", (2, 3), False, False)
    assert ev.ratio_before == pytest.approx(0.8)
    assert "3 replicas of m (was 2)" in ev.description and "session affinity" in ev.description
    # every replica of the model knows it: its change point stays quiet, its alerts see it
    assert all(e.last_event_t[name] == 115.0 for name in ("vllm-0", "vllm-1", "vllm-2")) and "" not in e.last_event_t
    assert e.event_counts[("", "replicas")] == 1 and e.last_deploy() == {}


def test_a_target_of_the_model_gone_for_one_evaluation_is_a_wobble_not_an_event():
    e = engine_for(2)
    for t in (100.0, 105.0):
        replicas_of(e, ["vllm-0", "vllm-1"], t)
        e.evaluate(t)
    cfg = e.config
    e.reconfigure(cfg.__class__(**{**cfg.__dict__, "targets": cfg.targets[:1]}))
    e.evaluate(110.0)
    e.reconfigure(cfg)
    replicas_of(e, ["vllm-0", "vllm-1"], 115.0)
    e.evaluate(115.0)
    replicas_of(e, ["vllm-0", "vllm-1"], 120.0)
    e.evaluate(120.0)
    assert not [ev for ev in e.events if ev.source == "replicas"]


def test_a_replica_count_event_reaches_the_rules_of_its_model_only(monkeypatch):
    import exporter.monitor.engine as engine_module
    from exporter.alerting.deploys import REPLICAS
    from exporter.alerting.rules import FALSE, HIT_RATE_LOW, registered
    e = engine_for(1)
    e.ingest("vllm-0", 100.0, parse(body(1000, 800, start=1.0) + body(1000, 800, model="other")))
    e.add_event(DeployEvent(99.0, None, "replicas:1->3", REPLICAS, model="m", replicas=(1, 3)))
    seen = {}

    def record(facts, settings, rc):
        seen[facts.model] = sorted(x.source for x in facts.events)
        return FALSE
    rule = registered(HIT_RATE_LOW)
    monkeypatch.setattr(engine_module, "rules_to_run", lambda rc: ([], [(rule.__class__(**{**rule.__dict__, "condition": record}),
                                                                     rc.rules[HIT_RATE_LOW])]))
    e.evaluate(100.0)
    assert seen == {"m": ["replicas", "restart"], "other": ["restart"]}  # its first start is both models'


def test_a_poll_interval_of_20s_still_finds_a_change_point():
    """rules.change_point.recent (15s) holds one 20 s interval: the step needs two. Its
    spans follow the poll interval, so a sidecar polling every 20 s still sees one."""
    cfg = load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/0"}], "global": {"poll_interval": "20s"}})
    e = Engine(cfg)
    cp = e._change_point_spans
    assert (cp.recent, cp.reference) == (40.0, 80.0)
    transitions = drive(e, [replica(0, simulator.incident(900 + 300))], 600, step=20.0)
    assert [ev.source for ev in e.events] == ["change_point"]
    assert firing(transitions, "PrefixCacheHitRateDropAfterDeploy")


# --- a firing alert whose traffic went away -------------------------------------------------
def _drop_then(tokens_at, until: float):
    """A pod at 85% that falls to 3% 150 s after its start (a prompt change: the drop rule
    pages), its traffic `tokens_at(seconds)` query tokens a 5 s poll. -> transitions of the
    drop alert as (seconds after the start, state, annotations)."""
    from exporter.alerting.rules import DROP_AFTER_DEPLOY
    engine = engine_for(1)
    from helpers import CounterPod
    pod, seen, t = CounterPod(START - 1.0), [], START
    while t <= START + until:
        engine.ingest("vllm-0", t, parse(pod.body(0.85 if t - START < 150 else 0.03, tokens_at(t - START))))
        seen += [(tr.t - START, tr.state, dict(tr.alert.annotations)) for tr in engine.evaluate(t)
                 if tr.alert.alertname == DROP_AFTER_DEPLOY]
        t += 5.0
    return seen


def test_a_firing_drop_alert_resolves_once_its_traffic_has_been_gone_for_the_rules_look_back():
    """Traffic moves away at 500 s: the rule turns inconclusive once its 5 minute window
    holds too few tokens, and the alert, held meanwhile, resolves within the rule's
    look-back (baseline + after: 10 minutes) of its last true evaluation, saying why."""
    from exporter.alerting.rules_state import NO_TRAFFIC
    stop = 500.0
    seen = _drop_then(lambda s: 10000.0 if s < stop else 0.0, stop + 1000)
    states = [(t, state) for t, state, _ in seen]
    fired = next(t for t, state in states if state == "firing")
    assert fired < stop
    (resolved,) = [(t, a) for t, state, a in seen if state == "resolved"]
    assert stop + 600 <= resolved[0] <= stop + 300 + 600 + 5  # last true at most its window after the stop
    assert "no traffic to judge" in resolved[1][NO_TRAFFIC]


def test_a_lull_shorter_than_the_look_back_keeps_the_drop_alert_firing():
    """Six minutes without a request (a short night), then the same low ratio: held throughout."""
    seen = _drop_then(lambda s: 0.0 if 500 <= s < 860 else 10000.0, 1300)
    assert [state for _, state, _ in seen if state in ("firing", "resolved")] == ["firing"]


def test_a_four_second_spike_of_a_counter_to_1e20_leaves_the_ratios_after_it_true():
    """A pod at 80%, 2,000 query tokens a second, polled every second; for 4 s its
    counters read 1e20, then normal again. Taken, the fall back was a reset adding 1e20
    to every later sample as an offset, where a float's step is 16,384: the ratios read
    0.67 or 1.0 for 0.8 for good. Refused as counter_too_large, they stay true."""
    from exporter.alerting.rules import judged_ratio
    engine = engine_for(1)
    queries = hits = 0.0
    t = START
    while t <= START + 600:
        queries, hits = queries + 2000.0, hits + 1600.0
        spike = START + 200 <= t < START + 204
        q, h = (1e20, 1e20) if spike else (queries, hits)
        engine.ingest("vllm-0", t, parse(f"process_start_time_seconds {START - 3600}\n"
                                         f'vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {q}\n'
                                         f'vllm:prefix_cache_hits_total{{model_name="m",engine="0"}} {h}\n'))
        engine.evaluate(t)
        if t >= START + 300:  # past the 1 minute window that held the spike
            ratio = judged_ratio(engine.tracks["vllm-0"].view.stats["m"]["1m"])
            assert ratio is not None and abs(ratio - 0.8) < 0.001, (t - START, ratio)
        t += 1.0


# --- versions are compared within what owns the replicas, never across namespaces -------------------
PROD = {"namespace": "prod", "owner": "vllm"}
STAGING = {"namespace": "staging", "owner": "vllm"}


def serve_in_scopes(pods, until, step=5.0):
    """pods: name -> (labels, hit ratio, process start); each serves 2,000 query tokens a
    poll of model "m" from its start. -> (engine, transitions)"""
    engine = Engine(load({"targets": [{"name": n, "url": f"http://127.0.0.1:1/{n}", "labels": labels}
                                      for n, (labels, _, _) in pods.items()]}))
    transitions, t = [], START
    while t <= START + until:
        for name, (_, ratio, started) in pods.items():
            if t >= started:
                queries = 2000.0 * ((t - started) // step + 1)
                engine.ingest(name, t, parse(body(queries, round(ratio * queries), start=started)))
        transitions += engine.evaluate(t)
        t += step
    return engine, transitions


TWO_NAMESPACES = {"vllm-ngq2cd9wf-abcde": ({"version": "ngq2cd9wf", **PROD}, 0.89, START - 900),
                  "vllm-ngq2cd9wf-fghij": ({"version": "ngq2cd9wf", **PROD}, 0.89, START - 900),
                  # staging's pods came later, with their own template (its prompt, its args): 29 points lower
                  "vllm-q4pbsphzf-klmno": ({"version": "q4pbsphzf", **STAGING}, 0.60, START + 60)}


def test_staging_and_prod_serving_one_model_with_their_own_versions_is_no_rollout_and_pages_nothing():
    """Issue 54: keyed by model alone, staging's template hash started last and was judged as
    prod's rollout, "49% on q4pbsphzf against 89% on ngq2cd9wf", critical, for as long as
    both ran."""
    engine, transitions = serve_in_scopes(TWO_NAMESPACES, until=900.0)
    assert transitions == [] and not engine.active_alerts()
    assert not engine.rollouts and not engine.verdicts
    v = engine.analyze(START + 900, "m", "q4pbsphzf")
    assert v.verdict == "inconclusive" and "no baseline" in v.reason and v.hit_ratio == pytest.approx(0.60)
    assert dict(v.scope) == STAGING and v.to_json()["scope"] == STAGING


def test_a_rollout_within_prod_is_still_caught_beside_staging():
    pods = {**TWO_NAMESPACES, "vllm-x7k2m9pqr-pqrst": ({"version": "x7k2m9pqr", **PROD}, 0.55, START + 120)}
    engine, transitions = serve_in_scopes(pods, until=600.0)
    fired = [tr for tr in transitions if tr.state == "firing"]
    assert len(fired) == 1 and fired[0].alert.alertname == "PrefixCacheHitRateDropAfterDeploy" and fired[0].alert.version
    labels = dict(fired[0].alert.labels)
    assert (labels["version"], labels["baseline_version"], labels["namespace"], labels["owner"]) == \
        ("x7k2m9pqr", "ngq2cd9wf", "prod", "vllm")
    assert fired[0].alert.scope == (("namespace", "prod"), ("owner", "vllm"))
    assert set(engine.rollouts) == {("m", (("namespace", "prod"), ("owner", "vllm")))}
    assert engine.analyze(START + 600, "m", "x7k2m9pqr").verdict == "fail"
    assert engine.analyze(START + 600, "m", "q4pbsphzf").verdict == "inconclusive"  # staging: still no baseline


def test_one_version_rolled_in_two_namespaces_makes_two_alerts_not_one():
    """One pod template applied to staging and prod has one hash in both: each namespace's
    rollout of it is its own alert (by scope), not one that flips between them."""
    pods = {"p-old": ({"version": "v1", **PROD}, 0.89, START - 900), "p-new": ({"version": "v2", **PROD}, 0.55, START + 60),
            "s-old": ({"version": "v1", **STAGING}, 0.89, START - 900), "s-new": ({"version": "v2", **STAGING}, 0.55, START + 90)}
    engine, _ = serve_in_scopes(pods, until=600.0)
    firing_ = [a for a in engine.active_alerts() if a.state == "firing" and a.version]
    assert sorted(dict(a.labels)["namespace"] for a in firing_) == ["prod", "staging"]
    assert {a.version for a in firing_} == {"v2"} and len({a.key for a in firing_}) == 2


def test_staging_scaling_up_is_no_event_of_prod_s_replicas():
    """Counted by model alone, staging's second replica was a `replicas` event of every
    replica of the model, prod's too: the cause of prod's next drop, and its change point
    kept quiet for the event's span."""
    pods = {**TWO_NAMESPACES, "vllm-q4pbsphzf-uvwxy": ({"version": "q4pbsphzf", **STAGING}, 0.60, START + 300)}
    engine, _ = serve_in_scopes(pods, until=400.0)
    (grew,) = [e for e in engine.events if e.source == "replicas"]
    assert grew.replicas == (1, 2) and dict(grew.scope) == STAGING
    assert {n for n in engine.last_event_t if n} == {"vllm-q4pbsphzf-klmno", "vllm-q4pbsphzf-uvwxy"}


def test_two_deployments_of_one_model_in_one_namespace_are_two_owners_not_a_rollout():
    """"Any Deployment whose normal ratio sits 25 points below another serving the same model
    gets a permanent critical": a second Deployment with args of its own, beside the first."""
    pods = {"vllm-ngq2cd9wf-abcde": ({"version": "ngq2cd9wf", "namespace": "prod", "owner": "vllm"}, 0.89, START - 900),
            "vllm-long-7c5d9b8f4-fghij": ({"version": "7c5d9b8f4", "namespace": "prod", "owner": "vllm-long"}, 0.60, START + 60)}
    engine, transitions = serve_in_scopes(pods, until=600.0)
    assert transitions == [] and not engine.rollouts
    assert "no baseline" in engine.analyze(START + 600, "m", "7c5d9b8f4", None, {"namespace": "prod"}).reason
