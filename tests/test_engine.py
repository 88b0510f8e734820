"""The engine end to end on simulated scrapes: each rule fires where it should."""


from exporter import simulator
from exporter.config import load
from exporter.engine import Engine
from exporter.simulator import Event, Replica, Scenario
from exporter.vllm_metrics import parse

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


def test_ttft_regression_fires_with_the_drop():
    e = engine_for(1, hit_rate_drop_after_deploy={"enabled": False}, change_point={"enabled": False})
    tr = drive(e, [replica(0, simulator.incident(900 + 600))], 1200)
    (f,) = firing(tr, "PrefixCacheTTFTRegression")
    assert "x its usual level" in dict(f.alert.annotations)["summary"]


def test_target_down_fires_after_its_for_and_resolves():
    e = engine_for(1)
    r = replica(0, Scenario())
    drive(e, [r], 30)
    tr = drive(e, [r], 90, down={"vllm-0"})
    assert [t.state for t in tr if t.alert.alertname == "PrefixCacheTargetDown"][:2] == ["pending", "firing"]


def test_load_balancer_scatter_when_every_replica_sits_moderate_together():
    # prompts share only part of their prefix across a spread-out fleet: all replicas sit near 40%
    scenario = Scenario(request_rate=5.0, tenants=100, kv_blocks=4600)
    e = engine_for(3)
    tr = drive(e, [replica(i, scenario) for i in range(3)], 600)
    low = firing(tr, "PrefixCacheHitRateLow")
    assert low and {dict(t.alert.labels)["cause"] for t in low} == {"load_balancer_scatter"}


def test_old_events_are_forgotten_but_the_last_deploy_time_stays():
    from exporter.deploys import DeployEvent
    e = engine_for(1)
    e.add_event(DeployEvent(START, None, "v1", "api"))
    e.evaluate(START + 60)
    assert len(e.events) == 1
    e.evaluate(START + 3 * 3600)
    assert len(e.events) == 0
    assert e.last_deploy() == {"": START} and e.event_counts == {("", "api"): 1}
