import json

import pytest
import requests

from exporter.sim import simulator
from exporter.sim.server import Fleet
from exporter.sim.simulator import Event, Replica, Scenario
from exporter.parse.vllm_metrics import parse


def ratio_between(replica, t0, t1):
    replica.advance(t0)
    a = parse(replica.render()).series[0].prefix_cache
    replica.advance(t1)
    b = parse(replica.render()).series[0].prefix_cache
    return (b.hits - a.hits) / (b.queries - a.queries)


def test_same_seed_same_output():
    a = Replica("r", simulator.incident(60), start=0, seed=5)
    b = Replica("r", simulator.incident(60), start=0, seed=5)
    a.advance(120)
    b.advance(120)
    assert a.render() == b.render()


def test_the_incident_story_healthy_then_a_timestamp_atop_the_prompt():
    r = Replica("r", simulator.incident(900), start=0, seed=1)
    healthy = ratio_between(r, 300, 900)
    broken = ratio_between(r, 960, 1500)
    assert 0.85 < healthy < 0.92
    assert broken < 0.08


def test_hits_are_whole_blocks_and_never_the_whole_prompt():
    r = Replica("r", Scenario(tenants=1, user_tokens=(0, 0), system_tokens=64), start=0, seed=1)
    r.advance(60)
    e = r.engines[0]
    assert e.hits % 16 == 0
    assert e.hits < e.queries
    # a 64-token prompt seen before hits 48 tokens: the last block is recomputed (cap n-1)
    assert e.hits == 48 * (e.requests - 1)


def test_prompts_shorter_than_a_block_never_hit():
    r = Replica("r", Scenario(tenants=1, user_tokens=(0, 0), system_tokens=12), start=0, seed=1)
    r.advance(60)
    assert r.engines[0].queries > 0 and r.engines[0].hits == 0


def test_restart_resets_counters_and_created():
    r = Replica("r", Scenario(events=(Event(30, "restart"),)), start=0, seed=1)
    r.advance(29)
    before = parse(r.render()).series[0]
    r.advance(31)
    after = parse(r.render()).series[0]
    assert after.prefix_cache.queries < before.prefix_cache.queries
    assert after.created == 30 and before.created == 0


def test_kv_pressure_slides_the_hit_rate_with_usage_near_full():
    r = Replica("r", simulator.kv_pressure(600, 600), start=0, seed=1)
    healthy = ratio_between(r, 300, 600)
    slid = ratio_between(r, 1200, 1500)
    assert healthy > 0.85 and slid < 0.3
    assert parse(r.render()).series[0].kv_cache_usage > 0.9


@pytest.mark.parametrize("what, value, check", [
    pytest.param("hits_broken", True, lambda e: e.hits == 0 and e.queries > 0, id="hits-stuck-at-zero"),
    pytest.param("prefix_caching", False, lambda e: e.hits == 0 and e.queries == 0, id="caching-disabled"),
])
def test_switches(what, value, check):
    r = Replica("r", Scenario(events=(Event(0, what, value),)), start=0, seed=1)
    r.advance(60)
    assert check(r.engines[0])


def test_fleet_serves_metrics_per_replica_and_404s_the_rest():
    replicas = [Replica(n, Scenario(), start=0, seed=i) for i, n in enumerate(("a", "b"))]
    fleet = Fleet(replicas, clock=lambda: 30.0).start()
    try:
        body = requests.get(fleet.metrics_url("a"), timeout=5).text
        assert parse(body).series[0].prefix_cache.queries > 0
        assert requests.get(fleet.url("zzz") + "/metrics", timeout=5).status_code == 404
        fleet.down.add("b")
        assert requests.get(fleet.metrics_url("b"), timeout=5).status_code == 503
    finally:
        fleet.stop()


def test_recording_lines_follow_the_recording_format():
    r = Replica("vllm-0", Scenario(), start=1000.0, seed=1)
    lines = list(simulator.recording_lines([r], start=1000.0, duration=20, interval=5, deploys=[(7.0, None, "v42")]))
    assert [l.get("event") for l in lines].count("deploy") == 1
    assert [l["t"] for l in lines] == sorted(l["t"] for l in lines)
    scrape = lines[0]
    assert set(scrape) == {"t", "target", "body"} and scrape["target"] == "vllm-0"
    json.dumps(lines)
