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


# --- the stories that are not deploys (exporter/sim/stories.py) ----------------------------------
def counters(replica, t):
    replica.advance(t)
    s = parse(replica.render()).series[0]
    return s.prefix_cache.queries, s.prefix_cache.hits, s.external_prefix_cache.hits, s.sleep_level


def test_a_kv_connectors_store_serves_what_the_gpu_cache_has_no_room_for_until_it_goes():
    from exporter.sim import stories
    r = Replica("r", stories.with_connector(5.0, lost_at=600.0), start=0.0, seed=1)
    q0, h0, e0, _ = counters(r, 300.0)
    q1, h1, e1, _ = counters(r, 600.0)
    assert 0.2 < (h1 - h0) / (q1 - q0) < 0.4 and 0.5 < (e1 - e0) / (q1 - q0) < 0.7  # GPU ~30%, connector ~60%
    q2, h2, e2, _ = counters(r, 900.0)
    assert e2 == e1 and 0.2 < (h2 - h1) / (q2 - q1) < 0.4  # the store is gone; the GPU's share holds
    ext = parse(r.render()).series[0].external_prefix_cache
    assert ext.queries == q2 - h2  # the connector is asked for what the GPU cache missed (vLLM PR 30522)


def test_sleep_serves_nothing_and_the_wake_finds_the_kv_cache_empty():
    from exporter.sim import stories
    r = Replica("r", stories.sleeping(5.0, 300.0, asleep=120.0), start=0.0, seed=1)
    assert counters(r, 299.0)[3] == 0
    q0, h0, _, level0 = counters(r, 301.0)
    q1, h1, _, level = counters(r, 419.0)
    assert level0 == level == 1 and (q1, h1) == (q0, h0)  # asleep: nothing served, /metrics answers
    q2, h2, _, awake = counters(r, 430.0)
    assert awake == 0 and q2 > q1 and (h2 - h1) / (q2 - q1) < 0.5  # the first requests after the wake miss
    q3, h3, _, _ = counters(r, 1000.0)
    assert (h3 - h2) / (q3 - q2) > 0.8 and r.created == 0.0  # refilled, by the same process


@pytest.mark.slow
def test_conversation_turns_hit_their_context_on_one_replica_in_n():
    from exporter.sim import stories
    for n, low, high in ((2, 0.55, 0.68), (6, 0.25, 0.40)):
        conv = simulator.Conversations(40, 2000)
        reps = [Replica(f"r{i}", stories.conversations(4.0 / n), start=0.0, seed=i, conversations=conv) for i in range(n)]
        for t in range(5, 300, 5):  # the replicas serve side by side, as a recording scrapes them
            for r in reps:
                r.advance(float(t))
        start = [counters(r, 300.0) for r in reps]
        for t in range(305, 600, 5):
            for r in reps:
                r.advance(float(t))
        end = [counters(r, 600.0) for r in reps]
        q = sum(b[0] - a[0] for a, b in zip(start, end))
        h = sum(b[1] - a[1] for a, b in zip(start, end))
        assert low < h / q < high, (n, h / q)


def test_the_scale_out_story_adds_cold_pods_and_keeps_the_total_traffic():
    from exporter.sim import stories
    lines = stories.scale_out(0.0, 60.0, at=30.0, before=2, after=4)
    assert {l["target"] for l in lines if l["t"] < 30.0} == {"vllm-0", "vllm-1"}
    assert {l["target"] for l in lines if l["t"] >= 30.0} == {"vllm-0", "vllm-1", "vllm-2", "vllm-3"}
    first = next(l for l in lines if l["target"] == "vllm-2")
    assert "process_start_time_seconds 30.0" in first["body"]


def test_kv_pressure_evicts_a_prompts_tail_first_as_vllm_and_whatif_do():
    """One cache model (exporter/tools/cachemodel.py): a request's blocks are freed tail first,
    so when memory runs short a prompt loses its last blocks, never its first. With room for
    14 of two 8-block prompts' 16 blocks, the first prompt hits 6 of its 8 blocks again; the
    simulator's own LRU, which evicted the head of a chain first, hit 0 of 8."""
    from exporter.tools.cachemodel import BlockPool
    # demand = 1 req/s x (0.06 s + 1 token x 0.01 s) x (129 + 1) / 16 blocks = 0.56875: 14 blocks left to cache
    replica = simulator.Replica("r", simulator.Scenario(request_rate=1.0, output_tokens=1, kv_blocks=14.56875 + 1e-9), start=0.0)
    first, second = list(range(1000, 1129)), list(range(2000, 2129))  # 8 full blocks and a token each
    assert replica._serve(1.0, first, output=1) == 0
    assert replica._serve(2.0, second, output=1) == 0
    assert replica._serve(3.0, first, output=1) == 6 * 16
    whatif_pool = BlockPool(14, chained=True)
    hashes = {tuple(p): simulator._chain(p, (), 16) for p in (first, second)}
    assert [whatif_pool.serve(hashes[tuple(p)], len(p), 16) for p in (first, second, first)] == [0, 0, 6 * 16]


def test_routes_with_affinity_move_the_sessions_their_kind_moves():
    """A prefix hash modulo the replica count moves most sessions when a replica leaves;
    consistent (rendezvous) hashing only the departed replica's; each session has one owner."""
    from exporter.sim.simulator import Route
    four, three = ("a", "b", "c", "d"), ("a", "b", "c")
    for kind, kept_at_least, kept_at_most in (("hash_mod", 0.15, 0.4), ("consistent", 0.7, 0.8)):
        owners4 = [Route(kind, "a", four).owner(s) for s in range(2000)]
        owners3 = [Route(kind, "a", three).owner(s) for s in range(2000)]
        kept = sum(o4 == o3 for o4, o3 in zip(owners4, owners3)) / 2000
        assert kept_at_least <= kept <= kept_at_most, (kind, kept)
        assert sorted(s for m in four for s in Route(kind, m, four).sessions(2000)) == list(range(2000))
        if kind == "consistent":  # only the departed replica's sessions move
            assert all(o4 == o3 for o4, o3 in zip(owners4, owners3) if o4 != "d")
