"""Every reason the hit rate moves besides a deploy (issue 34), played by the simulator's
stories (exporter/sim/stories.py) through `backtest` as an on-call engineer would replay
a recording: a scale-out under round-robin routing, a lost cache tier, sleep mode; and
the timestamp incident still caught in each of those setups."""
import functools
import json

import pytest

from exporter.sim import stories
from helpers import backtest_with_engine

START = 1_764_480_000.0
MODEL = "demo/llama-3-8b"


@functools.lru_cache(maxsize=None)
def replayed(story: str, **kwargs):
    lines = [json.dumps(line) for line in getattr(stories, story)(START, **kwargs)]
    return backtest_with_engine(lines)


def replay(story, **kwargs):
    return replayed(story, **kwargs)


def firing(transitions, before=float("inf")):
    return [t for t in transitions if t["state"] == "firing" and t["t"] < before]


def at_least_warning(transitions):
    return [t for t in transitions if t["state"] in ("pending", "firing") and t["labels"]["severity"] in ("warning", "critical")]


# --- a scale-out under round-robin routing ---------------------------------------------------
SCALE_AT, INCIDENT_AFTER_SCALE = 300.0, 1200.0


@functools.lru_cache(maxsize=1)
def scale_out_then_incident():
    """2 -> 6 replicas at 300 s; the timestamp incident at 1200 s, once the new pods are
    warm and their warnings have fired."""
    return replay("scale_out", duration=1500.0, at=SCALE_AT, incident_at=INCIDENT_AFTER_SCALE)


@pytest.mark.slow
@pytest.mark.xdist_group("scale_out")
def test_a_scale_out_under_round_robin_is_a_warning_naming_the_replicas_never_a_prompt_change():
    """Used to page PrefixCacheHitRateDropAfterDeploy critical with cause=prompt_prefix_change
    25 s after the new pods appeared (a change point), then warn HitRateLow with the same
    cause, and the new pods `unknown`."""
    transitions, engine, warnings = scale_out_then_incident()
    assert warnings == []
    before = [t for t in transitions if t["t"] < START + INCIDENT_AFTER_SCALE]
    assert not [t for t in before if t["labels"]["severity"] == "critical"]
    assert not [t for t in before if t["labels"]["cause"] == "prompt_prefix_change"]
    fired = firing(before)
    assert {t["labels"]["target"] for t in fired} == {f"vllm-{i}" for i in range(6)}  # old pods and new ones
    assert {(t["alertname"], t["labels"]["cause"], t["labels"]["severity"]) for t in fired} == \
        {("PrefixCacheHitRateLow", "replicas_changed", "warning")}
    old = [t for t in fired if t["labels"]["target"] in ("vllm-0", "vllm-1")]
    assert all(START + SCALE_AT < t["t"] <= START + SCALE_AT + 420 for t in old)
    description = fired[0]["annotations"]["description"]
    assert "6 replicas since" in description and "(was 2)" in description and "session affinity" in description
    (event,) = [e for e in engine.events if e.source == "replicas"]
    assert (event.t, event.target, event.model, event.replicas) == (START + SCALE_AT, None, MODEL, (2, 6))
    assert 0.5 < event.ratio_before < 0.7  # the old pods' ratio before, which bounds what 6 replicas can explain
    assert not [e for e in engine.events if e.source == "change_point"]


@pytest.mark.slow
@pytest.mark.xdist_group("scale_out")
def test_the_timestamp_incident_after_a_scale_out_is_still_a_prompt_change_on_every_replica():
    transitions, _, _ = scale_out_then_incident()
    after = [t for t in transitions if t["t"] >= START + INCIDENT_AFTER_SCALE]
    drop = firing([t for t in after if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy"])
    assert {t["labels"]["target"] for t in drop} == {f"vllm-{i}" for i in range(6)}
    assert all(t["labels"]["cause"] == "prompt_prefix_change" and t["labels"]["severity"] == "critical" for t in drop)
    assert all(t["t"] - (START + INCIDENT_AFTER_SCALE) <= 45 for t in drop)


# --- a cache tier lost ------------------------------------------------------------------------
LOST_AT = 300.0


@pytest.mark.slow
def test_a_lost_connector_tier_fires_within_5_minutes_naming_the_tier():
    """vLLM with a KV connector: the GPU hits ~30%, the connector ~60%. Its store goes
    away: today nothing fired for it (only the GPU-local ratio was judged, and it held)."""
    transitions, engine, warnings = replay("tiered", duration=660.0, lost_at=LOST_AT)
    assert warnings == []
    fired = firing(transitions)
    assert fired and min(t["t"] for t in fired) - (START + LOST_AT) <= 300
    assert {t["labels"]["target"] for t in fired} == {"vllm-0", "vllm-1"}
    assert {t["labels"]["cause"] for t in fired} == {"cache_tier_lost"}
    first = min(fired, key=lambda t: t["t"])
    assert "the external cache tier served" in first["annotations"]["description"]
    # the connector carried two thirds of what was cached: the ratio fell 60 points, the drop pages
    drop = [t for t in fired if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy"]
    assert drop and all(t["labels"]["severity"] == "critical" for t in drop)
    assert all(t["labels"]["severity"] == "warning" for t in fired if t["alertname"] != "PrefixCacheHitRateDropAfterDeploy")
    ws = engine.tracks["vllm-0"].view.stats[MODEL]["5m"]
    assert ws.effective_hit_ratio < 0.4 and ws.admitted_hit_ratio > 0.25  # the GPU-local ratio held


@pytest.mark.slow
def test_a_healthy_two_tier_fleet_stays_quiet_for_an_hour():
    """Judged on the GPU-local ratio alone (~30%), it raised PrefixCacheHitRateLow with
    cause=load_balancer_scatter at steady state."""
    transitions, engine, warnings = replay("tiered", duration=3600.0)
    assert warnings == [] and transitions == []
    for track in engine.tracks.values():
        ws = track.view.stats[MODEL]["1h"]
        assert 0.25 < ws.admitted_hit_ratio < 0.35 and 0.85 < ws.effective_hit_ratio < 0.93


@pytest.mark.slow
def test_the_timestamp_incident_with_two_tiers_is_still_a_prompt_change():
    """A broken prefix loses every tier at once: not a tier lost."""
    transitions, _, _ = replay("tiered", duration=600.0, incident_at=300.0)
    drop = firing([t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy"])
    assert {t["labels"]["target"] for t in drop} == {"vllm-0", "vllm-1"}
    assert all(t["labels"]["cause"] == "prompt_prefix_change" and t["t"] - (START + 300) <= 30 for t in drop)


# --- sleep mode ------------------------------------------------------------------------------
SLEEP_AT, WAKE_AT = 300.0, 420.0


@pytest.mark.slow
def test_sleeping_two_minutes_and_refilling_after_the_wake_warns_nobody():
    """A woken engine's refill paged PrefixCacheTTFTRegression with cause=unknown."""
    transitions, engine, warnings = replay("sleep_and_wake", duration=1200.0, sleep_at=SLEEP_AT)
    assert warnings == []
    assert at_least_warning(transitions) == []
    events = [(e.source, e.target, e.t - START) for e in engine.events]
    assert events == [("sleep", "vllm-0", SLEEP_AT), ("sleep", "vllm-1", SLEEP_AT),
                      ("wake", "vllm-0", WAKE_AT), ("wake", "vllm-1", WAKE_AT)]
    wake = next(e for e in engine.events if e.source == "wake")
    assert wake.is_restart and not wake.is_deploy and "120s asleep" in wake.description
    ratio = engine.tracks["vllm-0"].view.stats[MODEL]["1m"].effective_hit_ratio
    assert ratio > 0.8  # refilled


@pytest.mark.slow
def test_the_timestamp_incident_after_a_wake_is_still_caught():
    transitions, _, _ = replay("sleep_and_wake", duration=1500.0, sleep_at=SLEEP_AT, incident_at=1200.0)
    assert not [t for t in transitions if t["t"] < START + 1200]
    drop = firing([t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy"])
    assert {t["labels"]["target"] for t in drop} == {"vllm-0", "vllm-1"}
    assert all(t["labels"]["cause"] == "prompt_prefix_change" and t["t"] - (START + 1200) <= 30 for t in drop)


# --- the replica count changed under routers with affinity (issue 56 item 1) --------------------
RESCALE_AT, INCIDENT_IN_REFILL = 600.0, 660.0


@pytest.mark.slow
@pytest.mark.parametrize("routing, before, after", [("hash_mod", 4, 3), ("hash_mod", 3, 4), ("consistent", 4, 3), ("consistent", 3, 4)])
def test_a_change_of_the_replica_count_under_routing_with_affinity_is_replicas_changed_never_a_page(routing, before, after):
    """A scale-in of a fleet routed by a prefix hash modulo the replica count (4 -> 3: most
    sessions move to a replica that never saw them) paged PrefixCacheHitRateDropAfterDeploy
    critical with cause=prompt_prefix_change: the change point of the fall came before the
    new count was seen, and a shrinking fleet explained no fall. In either direction and
    under consistent hashing too, the ratio refills: nothing pages, what warns says
    replicas_changed."""
    transitions, engine, warnings = replay("rescale", duration=1500.0, at=RESCALE_AT, routing=routing, before=before, after=after)
    assert warnings == []
    fired = firing(transitions)
    assert not [t for t in fired if t["labels"]["severity"] == "critical"], fired
    assert {t["labels"]["cause"] for t in fired} <= {"replicas_changed"}, fired
    # a drop alert the change point raised ends as the new count is seen, before its `for`
    pending = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy" and t["state"] == "pending"]
    assert all(t["t"] - (START + RESCALE_AT) <= 60 for t in pending)
    (event,) = [e for e in engine.events if e.source == "replicas"]
    assert event.replicas == (before, after) and 0.85 < event.ratio_before < 1.0


@pytest.mark.slow
def test_the_timestamp_incident_while_a_scale_in_refills_is_still_a_prompt_change_that_pages():
    transitions, _, _ = replay("rescale", duration=1000.0, at=RESCALE_AT, routing="hash_mod", before=4, after=3,
                               incident_at=INCIDENT_IN_REFILL)
    drop = firing([t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy"])
    assert {t["labels"]["target"] for t in drop} == {f"vllm-{i}" for i in range(3)}
    assert all(t["labels"]["cause"] == "prompt_prefix_change" and t["labels"]["severity"] == "critical" for t in drop)
    assert all(t["t"] - (START + INCIDENT_IN_REFILL) <= 45 for t in drop)
