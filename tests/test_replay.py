"""The issue's scenarios: simulator recordings through `backtest`."""
import functools
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from exporter.config.sections import Config
from exporter.monitor.engine import Engine
from exporter.monitor.recording import read_lines, RecordingError
from exporter.monitor.replay import backtest
from exporter.sim.simulator import Event, Scenario
from exporter.sim import simulator

from scenarios import START, at, lines


def run(recording, config=None):
    config = config or Config()
    engine = Engine(config)
    warnings = []
    transitions = [t.to_json() for t in backtest(recording, config, warnings.append, engine=engine)]
    return transitions, engine, warnings


def paging(transitions):
    return [t for t in transitions if t["labels"].get("severity") in ("warning", "critical") and t["state"] in ("pending", "firing")]


def test_a_the_incident_fires_with_its_cause_within_30s_of_the_deploy():
    deploy = 300.0
    rec = lines(simulator.incident(at(deploy), request_rate=5.0), duration=600, deploys=[(deploy, None, "v42")])
    transitions, engine, warnings = run(rec)
    assert warnings == []
    firing = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy" and t["state"] == "firing"]
    assert {t["labels"]["target"] for t in firing} == {"vllm-0", "vllm-1"}
    for t in firing:
        assert t["labels"]["cause"] == "prompt_prefix_change"
        assert t["t"] - (START + deploy) <= 30
        assert t["labels"]["severity"] == "critical" and t["labels"]["model_name"] == "demo/llama-3-8b"
        assert set(t["annotations"]) >= {"summary", "description", "runbook_url"}
        assert "v42" in t["annotations"]["summary"]


@pytest.mark.slow
def test_b_a_restart_and_its_warm_up_page_nobody():
    rec = lines(Scenario(request_rate=5.0), duration=1200, per_replica_events={0: [Event(at(300), "restart")]})
    transitions, engine, _ = run(rec)
    assert paging(transitions) == []
    restarts = [e for e in engine.events if e.source == "restart"]
    assert [(e.target, e.t) for e in restarts] == [("vllm-0", START + 300)]


def test_c_traffic_under_the_token_minimum_is_inconclusive_and_fires_nothing():
    deploy = 300.0
    rec = lines(simulator.incident(at(deploy), request_rate=0.01), duration=600, deploys=[(deploy, None, "v42")])
    transitions, engine, _ = run(rec)
    assert transitions == []
    states = {(a.alertname, a.state) for a in engine.active_alerts()}
    assert ("PrefixCacheHitRateDropAfterDeploy", "inconclusive") in states


@pytest.mark.slow
def test_d_a_harmless_deploy_fires_nothing():
    deploy = 300.0
    scenario = Scenario(request_rate=5.0, events=(Event(at(deploy), "prompt", "tail_edit"),))
    rec = lines(scenario, duration=900, deploys=[(deploy, None, "v42")])
    transitions, _, _ = run(rec)
    assert transitions == []


@pytest.mark.slow
def test_e_kv_pressure_slide_is_low_hit_rate_from_eviction():
    rec = lines(simulator.kv_pressure(at(120), 600, request_rate=5.0), duration=1500)
    transitions, _, _ = run(rec)
    low = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateLow" and t["state"] == "firing"]
    assert low and all(t["labels"]["cause"] == "eviction_pressure" for t in low)
    assert not [t for t in transitions if t["labels"]["cause"] == "prompt_prefix_change"]


@pytest.mark.slow
def test_f_the_incident_without_a_deploy_event_is_caught_by_the_change_point():
    rec = lines(simulator.incident(at(300), request_rate=5.0), duration=600)
    transitions, engine, _ = run(rec)
    firing = [t for t in transitions if t["state"] == "firing" and t["labels"]["cause"] == "prompt_prefix_change"]
    assert firing
    assert {e.source for e in engine.events} == {"change_point"}


@pytest.mark.slow
def test_g_an_hour_of_steady_85_percent_fires_nothing():
    rec = lines(Scenario(request_rate=5.0, user_tokens=(120, 330)), duration=3600)
    transitions, engine, _ = run(rec)
    assert transitions == []
    ratios = [w["5m"].hit_ratio for track in engine.tracks.values() for w in track.stats.values()]
    assert all(0.82 <= r <= 0.88 for r in ratios)


@pytest.mark.slow
def test_backtest_is_deterministic_and_the_cli_prints_transitions(tmp_path):
    deploy = 120.0
    rec = lines(simulator.incident(at(deploy), request_rate=5.0), duration=300, deploys=[(deploy, "vllm-0", "v42")])
    path = tmp_path / "incident.jsonl"
    path.write_text("\n".join(rec) + "\n")
    outs = [subprocess.run([sys.executable, "-m", "exporter", "backtest", str(path)], capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert outs[0].returncode == 0 and outs[0].stdout == outs[1].stdout
    printed = [json.loads(l) for l in outs[0].stdout.splitlines()]
    assert printed and all(set(p) == {"t", "alertname", "state", "labels", "annotations"} for p in printed)
    assert any(p["alertname"] == "PrefixCacheHitRateDropAfterDeploy" and p["labels"]["target"] == "vllm-0" for p in printed)


@pytest.mark.parametrize("line, fragment", [
    pytest.param("{not json", "not JSON", id="bad-json"),
    pytest.param('{"target": "x", "body": ""}', "numeric `t`", id="no-t"),
    pytest.param('{"t": 1, "body": "x"}', "needs a `target`", id="no-target"),
    pytest.param('{"t": 1, "target": "x"}', "`body` or `error`", id="no-body-or-error"),
    pytest.param('{"t": 1, "event": "deploy", "target": 3, "version": "v"}', "deploy event", id="bad-deploy"),
])
def test_bad_recording_lines_are_reported_and_skipped(line, fragment):
    ((n, record),) = list(read_lines([line]))
    assert isinstance(record, RecordingError) and fragment in str(record)


def test_bad_lines_do_not_stop_the_replay():
    rec = lines(Scenario(request_rate=5.0), duration=60, replicas=1)
    rec.insert(3, "garbage")
    rec.insert(5, json.dumps({"t": START - 1000, "target": "vllm-0", "body": ""}))
    rec.append(json.dumps({"t": START + 65, "target": "vllm-0", "error": "timeout"}))
    transitions, engine, warnings = run(rec)
    assert len(warnings) == 2 and "goes back in time" in warnings[1]
    assert engine.tracks["vllm-0"].up is False and len(engine.tracks["vllm-0"].history) == 13


# --- a pod's whole life -----------------------------------------------------------------
def transitions_of(transitions):
    return [(t["alertname"], t["labels"]["target"], t["state"]) for t in transitions]


def test_a_brand_new_pod_filling_a_cold_cache_is_quiet():
    """A pod whose vLLM starts with the recording: the first scrape sees a process started
    seconds ago, so the cold-start grace covers the 7 minutes its cache takes to fill."""
    rec = [json.dumps(line) for line in simulator.scenario_recording(Scenario(request_rate=5.0), 900, START, warm=0.0, replicas=2)]
    transitions, engine, warnings = run(rec)
    assert warnings == [] and transitions == []
    assert {e.source for e in engine.events} == {"restart"}


def loading_then_serving(loading: float, duration: float, replicas: int = 2, interval: float = 5.0):
    """vLLM unreachable while it loads its model, then a fresh process with a cold cache."""
    out = []
    reps = [simulator.Replica(f"vllm-{i}", Scenario(request_rate=5.0), start=START + loading, seed=200 + i) for i in range(replicas)]
    for step in range(int(duration // interval) + 1):
        t = START + step * interval
        for r in reps:
            if t < START + loading:
                out.append(json.dumps({"t": t, "target": r.name, "error": "connection refused"}))
            else:
                r.advance(t)
                out.append(json.dumps({"t": t, "target": r.name, "body": r.render()}))
    return out


def test_vllm_loading_its_model_for_4_minutes_pages_nobody():
    transitions, engine, _ = run(loading_then_serving(240, 1200))
    assert transitions == []  # the startup grace (10m) covers loading, the cold-start grace the cold cache


@pytest.mark.slow
def test_target_down_during_loading_resolves_once_vllm_answers():
    """With a short startup grace TargetDown fires while vLLM loads (one alert per
    target, not per model) and resolves at the first answer."""
    from exporter.config.sections import load
    cfg = load({"rules": {"target_down": {"startup_grace": "1m", "for": "1m"}}})
    transitions, engine, _ = run(loading_then_serving(240, 1200), cfg)
    assert transitions_of(transitions) == [
        ("PrefixCacheTargetDown", "vllm-0", "pending"), ("PrefixCacheTargetDown", "vllm-1", "pending"),
        ("PrefixCacheTargetDown", "vllm-0", "firing"), ("PrefixCacheTargetDown", "vllm-1", "firing"),
        ("PrefixCacheTargetDown", "vllm-0", "resolved"), ("PrefixCacheTargetDown", "vllm-1", "resolved")]
    assert all(t["labels"]["model_name"] == "" for t in transitions)
    fired = [t["t"] - START for t in transitions if t["state"] == "firing"]
    resolved = [t["t"] - START for t in transitions if t["state"] == "resolved"]
    assert all(60 <= f <= 130 for f in fired) and all(r == 240 for r in resolved)
    assert engine.alerts == {}


def test_a_vllm_upgrade_from_0_10_to_current_names_with_a_restart_is_quiet():
    old = simulator.Replica("vllm-0", Scenario(request_rate=5.0), start=START - 900, seed=300, generation="v0.10")
    old.advance(START)
    upgrade = 300.0
    new = simulator.Replica("vllm-0", Scenario(request_rate=5.0), start=START + upgrade, seed=301, generation="current")
    rec = []
    for step in range(int(1200 // 5) + 1):
        t = START + step * 5.0
        r = old if t < START + upgrade else new
        r.advance(t)
        rec.append(json.dumps({"t": t, "target": "vllm-0", "body": r.render()}))
    transitions, engine, warnings = run(rec)
    assert transitions == []
    assert [e.source for e in engine.events] == ["restart"]


@pytest.mark.slow
def test_a_restart_that_also_breaks_the_prompt_layout_fires_once_the_refill_stalls_not_after_the_whole_grace():
    """The cache refills to a plateau far under its level before the restart: the grace
    ends when the ratio stops climbing (two spans of a minute), and the low ratio warns
    with the restart as the change behind it, minutes before the 10 minutes ran out."""
    from exporter.alerting.warmth import WARM_SPAN
    restart = 300.0
    broken = Scenario(request_rate=5.0, events=(Event(at(restart), "restart"), Event(at(restart), "prompt", "timestamp")))
    rec = lines(broken, duration=1500, replicas=1)
    transitions, _, _ = run(rec)
    low = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateLow"]
    assert [t["state"] for t in low] == ["pending", "firing"]
    grace = 600.0
    assert low[0]["t"] - START >= restart + 2 * WARM_SPAN  # the refill is given its minutes...
    assert low[1]["t"] - START < restart + grace  # ...and the stall is reported before the old grace ended
    assert low[1]["labels"]["cause"] == "prompt_prefix_change" and low[1]["labels"]["severity"] == "warning"


def test_hits_stuck_at_zero_pages_within_3_minutes():
    stuck = 300.0
    rec = lines(Scenario(request_rate=5.0, events=(Event(at(stuck), "hits_broken", True),)), duration=900, replicas=1)
    transitions, _, _ = run(rec)
    stuck_alerts = [t for t in transitions if t["alertname"] == "PrefixCacheHitsStuckAtZero"]
    assert [t["state"] for t in stuck_alerts] == ["pending", "firing"]
    assert stuck_alerts[1]["t"] - START <= stuck + 180


# --- when the engine's counters lie (docs/engines.md: "When the engine's counters lie") ----------------------------
@pytest.mark.slow
def test_retry_overcount_under_kv_pressure_pages_eviction_and_says_the_counters_lie():
    """vLLM <= 0.26 records a waiting request's lookup again on every retry: under KV
    pressure the lookup ratio holds up while the admitted ratio falls. The rules judge
    the admitted ratio (eviction pressure pages) and the disagreement alert names the
    counters."""
    from dataclasses import replace as dc_replace
    scenario = dc_replace(simulator.kv_pressure(at(120), 600, request_rate=5.0), counter_bug=simulator.RETRY_OVERCOUNT)
    transitions, engine, _ = run(lines(scenario, duration=1500, replicas=1))
    firing_ = {t["alertname"]: t["labels"]["cause"] for t in transitions if t["state"] == "firing"}
    assert firing_["PrefixCacheCountersDisagree"] == "instrumentation"
    assert firing_["PrefixCacheHitRateLow"] == "eviction_pressure"
    stats = engine.tracks["vllm-0"].view.stats["demo/llama-3-8b"]["5m"]
    assert stats.hit_ratio - stats.admitted_hit_ratio > 0.15  # the lookups say more than was served


@pytest.mark.parametrize("bug, pending_by", [
    pytest.param(simulator.HITS_NOT_WIRED, 300 + 60, id="hits-not-wired"),
    pytest.param(simulator.COUNTERS_ZERO, 300 + 300, id="lookup-counters-stand-still"),
])
def test_counters_that_are_not_wired_raise_the_instrumentation_alert_not_a_cache_page(bug, pending_by):
    scenario = Scenario(request_rate=5.0, events=(Event(at(300), "counter_bug", bug),))
    transitions, _, _ = run(lines(scenario, duration=900, replicas=1))
    assert transitions_of(transitions) == [("PrefixCacheCountersDisagree", "vllm-0", "pending"),
                                           ("PrefixCacheCountersDisagree", "vllm-0", "firing")]
    assert transitions[0]["t"] - START <= pending_by
    assert transitions[1]["labels"]["cause"] == "instrumentation" and transitions[1]["labels"]["severity"] == "warning"


@pytest.mark.slow
def test_an_sglang_fleet_with_the_timestamp_incident_fires_as_vllm_does():
    deploy = 300.0
    rec = lines(simulator.incident(at(deploy), request_rate=5.0), duration=600, deploys=[(deploy, None, "v42")], generation="sglang")
    transitions, _, warnings = run(rec)
    assert warnings == []
    firing_ = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy" and t["state"] == "firing"]
    assert {t["labels"]["target"] for t in firing_} == {"vllm-0", "vllm-1"}
    assert all(t["labels"]["cause"] == "prompt_prefix_change" and t["t"] - (START + deploy) <= 30 for t in firing_)


@pytest.mark.slow
def test_without_admitted_counters_a_ttft_that_stays_low_shows_hits_are_just_not_counted():
    """vLLM 0.10 has no admitted-prefill counters: when its hit counter stops while TTFT
    stays where it was, the cache works and the counter lies; a real cache failure
    (hits_broken: TTFT rises) still pages as HitsStuckAtZero."""
    quiet = Scenario(request_rate=5.0, events=(Event(at(300), "counter_bug", simulator.HITS_NOT_WIRED),))
    transitions, _, _ = run(lines(quiet, duration=900, replicas=1, generation="v0.10"))
    assert {t["alertname"] for t in transitions} == {"PrefixCacheCountersDisagree"}
    broken = Scenario(request_rate=5.0, events=(Event(at(300), "hits_broken", True),))
    transitions, _, _ = run(lines(broken, duration=900, replicas=1, generation="v0.10"))
    assert "PrefixCacheHitsStuckAtZero" in {t["alertname"] for t in transitions if t["state"] == "firing"}
    assert "PrefixCacheCountersDisagree" not in {t["alertname"] for t in transitions}


def rollout_recording(new_scenario, every=120.0, replicas=4, after=300.0, interval=5.0):
    """A rolling update as `record --config.file` writes it for discovered pods: lines
    carry each pod's labels; old pods' lines stop, new pods' lines begin."""
    pods = {f"old-{i}": ("v1", simulator.Replica(f"old-{i}", Scenario(), start=START - 1500, seed=i)) for i in range(replicas)}
    t, replaced, out = START - 600, 0, []
    while t <= START + replicas * every + after:
        if replaced < replicas and t >= START + replaced * every:
            pods.pop(f"old-{replaced}")
            pods[f"new-{replaced}"] = ("v2", simulator.Replica(f"new-{replaced}", new_scenario, start=t, seed=100 + replaced))
            replaced += 1
        for name, (version, r) in pods.items():
            r.advance(t)
            out.append(json.dumps({"t": t, "target": name, "labels": {"version": version, "namespace": "llm"}, "body": r.render()}))
        t += interval
    return out


@pytest.mark.slow
def test_a_recorded_rollout_replays_with_its_verdict_and_its_pods_come_and_go():
    transitions, engine, warnings = run(rollout_recording(simulator.incident(0.0)))
    assert warnings == []
    fired = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy" and t["state"] == "firing"]
    assert len(fired) == 1 and fired[0]["t"] < START + 240
    assert {k: fired[0]["labels"][k] for k in ("version", "baseline_version", "namespace", "cause")} == \
        {"version": "v2", "baseline_version": "v1", "namespace": "llm", "cause": "prompt_prefix_change"}
    assert sorted(engine.tracks) == [f"new-{i}" for i in range(4)]  # the old pods were forgotten
    assert not [t for t in transitions if t["alertname"] == "PrefixCacheTargetDown"]


@pytest.mark.slow
def test_a_harmless_recorded_rollout_stays_quiet():
    transitions, engine, warnings = run(rollout_recording(Scenario()))
    assert not paging(transitions)


@pytest.mark.parametrize("line, message", [
    pytest.param('{"t": 1, "target": "a", "body": "", "labels": ["x"]}', "`labels` must map", id="labels-not-a-mapping"),
    pytest.param('{"t": 1, "target": "a", "body": "", "labels": {"a": 1}}', "`labels` must map", id="label-value-not-a-string"),
])
def test_bad_labels_in_a_recording_are_reported(line, message):
    ((_, record),) = list(read_lines([line]))
    assert isinstance(record, RecordingError) and message in str(record)


# --- alerts an on-call trusts: a traffic mix is no broken prompt, evidence keeps holding -------------
_VOCAB = [f" w{i}" for i in range(4096)]


def tenant_recording(deploy=300.0, join=310.0, leave=660.0, duration=1080.0, rate=3.0, words=1300, interval=5.0):
    """A harmless deploy, then a tenant whose prompts share no prefix with anyone's joins:
    query tokens/s rise ~60%, hit tokens/s hold (the cache is big enough for both), the
    ratio falls from ~90% to ~56%; the tenant leaves again later."""
    import random
    replica = simulator.Replica("vllm-0", Scenario(request_rate=5.0, kv_blocks=64000), start=START - 900.0, seed=100)
    rng = random.Random(7)
    out, t, arrival = [], START, START + join
    while t <= START + duration:
        if t - interval < START + deploy <= t:
            out.append(json.dumps({"t": START + deploy, "event": "deploy", "target": None, "version": "v42"}))
        while arrival <= min(t, START + leave):
            replica.advance(arrival)
            prompt = "".join(rng.choices(_VOCAB, k=words))
            replica.serve_chat({"messages": [{"role": "user", "content": prompt}], "max_tokens": 200}, arrival)
            arrival += rng.expovariate(rate)
        replica.advance(t)
        out.append(json.dumps({"t": t, "target": "vllm-0", "body": replica.render()}))
        t += interval
    return out


@pytest.mark.slow
def test_a_tenant_joining_after_a_harmless_deploy_is_a_traffic_mix_warning_never_a_prompt_page():
    transitions, engine, warnings = run(tenant_recording())
    assert warnings == []
    assert not [t for t in transitions if t["labels"]["severity"] == "critical"]
    assert not [t for t in transitions if t["labels"]["cause"] == "prompt_prefix_change"]
    # the drop rule's alert, under the name its cause gives it: one name, one severity
    drop = [t for t in transitions if t["alertname"] in ("PrefixCacheHitRateDropAfterDeploy", "PrefixCacheTrafficMixChanged")]
    assert [t["state"] for t in drop] == ["pending", "firing", "resolved"]
    assert drop[1]["alertname"] == drop[2]["alertname"] == drop[1]["labels"]["alertname"] == "PrefixCacheTrafficMixChanged"
    assert drop[1]["labels"]["cause"] == "traffic_mix" and drop[1]["labels"]["severity"] == "warning"
    assert "hit tokens/s held" in drop[1]["annotations"]["description"]
    assert drop[2]["t"] > START + 660  # only once the tenant has left
    assert engine.firing() == []  # everything that fired resolved


@functools.lru_cache(maxsize=1)
def _stuck_counter_then_cold(cold: float = 300.0 + 3700.0):
    """vLLM 0.10 (no admitted-prefill counters): the hit counter stops at 300 s while the
    cache works, TTFT unchanged, for over an hour; then the cache really goes cold."""
    scenario = Scenario(request_rate=5.0, events=(Event(at(300), "counter_bug", simulator.HITS_NOT_WIRED),
                                                  Event(at(cold), "hits_broken", True)))
    transitions, _, _ = run(lines(scenario, duration=cold + 300, replicas=1, generation="v0.10"))
    return cold, transitions


@pytest.mark.slow
def test_a_hit_counter_stuck_for_an_hour_with_ttft_unchanged_stays_an_instrumentation_warning():
    cold, transitions = _stuck_counter_then_cold()
    before = [t for t in transitions if t["t"] < START + cold]
    assert transitions_of(before) == [("PrefixCacheCountersDisagree", "vllm-0", "pending"),
                                      ("PrefixCacheCountersDisagree", "vllm-0", "firing")]
    assert before[1]["labels"]["cause"] == "instrumentation" and before[1]["labels"]["severity"] == "warning"
    # it resolves once the cache really goes cold: then the counters no longer lie
    resolved = [t for t in transitions if t["alertname"] == "PrefixCacheCountersDisagree" and t["state"] == "resolved"]
    assert resolved and resolved[0]["t"] > START + cold


@pytest.mark.slow
def test_a_cache_that_really_goes_cold_after_its_counter_stuck_pages_within_3_minutes():
    cold, transitions = _stuck_counter_then_cold()
    stuck = [t for t in transitions if t["alertname"] == "PrefixCacheHitsStuckAtZero" and t["state"] == "firing"]
    assert stuck and START + cold < stuck[0]["t"] <= START + cold + 180
    assert stuck[0]["labels"]["severity"] == "critical"


@pytest.mark.slow
def test_a_drop_after_deploy_holds_past_its_look_back_while_the_ratio_stays_down_and_resolves_when_fixed():
    deploy, fixed = 300.0, 2400.0  # the look-back (30 min) ends at 2100 s
    scenario = replace(simulator.incident(at(deploy), request_rate=5.0),
                       events=(Event(at(deploy), "prompt", "timestamp"), Event(at(fixed), "prompt", "static")))
    transitions, _, _ = run(lines(scenario, duration=fixed + 600, replicas=1, deploys=[(deploy, None, "v42")]))
    drop = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy"]
    assert [t["state"] for t in drop] == ["pending", "firing", "resolved"]
    assert drop[1]["labels"]["cause"] == "prompt_prefix_change"
    assert START + fixed < drop[2]["t"] <= START + fixed + 360


# --- a recording made at another cadence (issue 30) -------------------------------------------
@functools.lru_cache(maxsize=None)
def incident_and_fix_at(interval: float):
    """The timestamp incident, deployed at 300 s and fixed at 700 s, recorded every `interval` s."""
    scenario = replace(simulator.incident(at(300.0), request_rate=5.0),
                       events=(Event(at(300.0), "prompt", "timestamp"), Event(at(700.0), "prompt", "static")))
    return run(lines(scenario, duration=1100, interval=interval, deploys=[(300.0, None, "v42"), (700.0, None, "v43")]))


@pytest.mark.slow
def test_a_recording_made_every_20s_fires_and_resolves_as_the_one_made_every_5s():
    """Targets were forgotten after 3 x poll_interval (15 s): every line of a 20 s recording
    found its target gone, and the incident gave 0 transitions (8 at 5 s)."""
    def story(transitions):
        return sorted((t["alertname"], t["labels"]["target"], t["state"], t["labels"]["cause"]) for t in transitions)
    fine, _, quiet = incident_and_fix_at(5.0)
    coarse, engine, warnings = incident_and_fix_at(20.0)
    assert quiet == [] and story(coarse) == story(fine)
    drop = [t for t in coarse if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy"]
    assert {t["state"] for t in drop} == {"pending", "firing", "resolved"}
    firing_ = [t for t in drop if t["state"] == "firing"]
    assert all(t["t"] - (START + 300) <= 60 for t in firing_)
    assert warnings == ["target vllm-0 was recorded every 20s, global.poll_interval is 5s: replayed at the recording's "
                        "cadence (a target is gone after 60s without a line, change points need two intervals)"]
    assert engine.config.global_.poll_interval == 20.0 and sorted(engine.tracks) == ["vllm-0", "vllm-1"]


def test_a_targets_cadence_is_read_from_its_own_lines_and_it_goes_after_three_of_them():
    from exporter.monitor.replay import Cadences
    c = Cadences(5.0)
    c.step(0.0)
    c.seen("a", 0.0)
    c.step(20.0)
    assert c.of("a") == 20.0 and c.gone_after("a") == 60.0  # the recording's step stands in before a second line
    for t in (20.0, 40.0, 61.0, 80.0):
        c.seen("a", t)
    assert c.of("a") == 20.0
    assert Cadences(5.0).gone_after("b") == 15.0


def test_targets_that_appear_at_once_reconfigure_the_engine_once_not_once_each():
    """Each reconfiguration walks every target: once per new target, 5,000 targets appearing
    at once took over two minutes (2,000: 19 s). The lines of a time step are replayed
    together, after one reconfiguration, with the same result as line by line."""
    body = 'vllm:prefix_cache_queries_total{model_name="m"} %d\nvllm:prefix_cache_hits_total{model_name="m"} %d\n'
    recording = [json.dumps({"t": START + step * 5, "target": f"pod-{i}", "body": body % (1000 * step, 800 * step)})
                 for step in range(3) for i in range(1500)]
    engine = Engine(replace(Config(), targets=()))
    reconfigurations = []
    original = engine.reconfigure
    engine.reconfigure = lambda config: (reconfigurations.append(len(config.targets)), original(config))[1]
    warnings = []
    assert list(backtest(recording, Config(), warnings.append, engine=engine)) == []
    assert reconfigurations == [1500] and warnings == []
    assert len(engine.tracks) == 1500 and engine.tracks["pod-7"].view.up and engine.tracks["pod-7"].view.last_t == START + 10


def test_a_time_step_of_more_lines_than_a_batch_is_replayed_in_parts(monkeypatch):
    """Memory holds one part of a step at most: a recording whose lines all share one `t`
    is not read whole first."""
    from exporter.monitor import replay
    monkeypatch.setattr(replay, "MAX_BATCH", 100)
    body = 'vllm:prefix_cache_queries_total{model_name="m"} 10\nvllm:prefix_cache_hits_total{model_name="m"} 8\n'
    recording = [json.dumps({"t": START, "target": f"pod-{i}", "body": body}) for i in range(250)]
    engine = Engine(replace(Config(), targets=()))
    reconfigurations = []
    original = engine.reconfigure
    engine.reconfigure = lambda config: (reconfigurations.append(len(config.targets)), original(config))[1]
    list(backtest(recording, Config(), engine=engine))
    assert reconfigurations == [100, 200, 250] and all(engine.tracks[f"pod-{i}"].view.up for i in range(250))
