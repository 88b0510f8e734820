import math

import pytest

from exporter.alerting import deploys
from exporter.sim import simulator
from exporter.alerting.deploys import SnapshotChangeDetector, detect_change_point, parse_annotations
from exporter.config.sections import load
from exporter.monitor.engine import Engine
from exporter.parse.vllm_metrics import parse
from exporter.series.window import Interval

from conftest import FIXTURES

DEFAULTS = load({}).rules  # the packaged defaults: exporter/config/default_rules.yml
GRACE = DEFAULTS.cold_start_grace


def snapshots(scenario, times, generation="current", start=-700.0):
    """A replica started `start` seconds before t=0: by default longer ago than the cold-start grace."""
    r = simulator.Replica("r", scenario, start=start, seed=1, generation=generation)
    for t in times:
        r.advance(t)
        yield t, parse(r.render())


@pytest.mark.parametrize("generation", ["current", "v0.10", "v0.8"])
def test_restart_is_detected_from_created_process_start_or_a_decrease(generation):
    det = SnapshotChangeDetector("r", GRACE)
    found = []
    for t, snap in snapshots(simulator.Scenario(events=(simulator.Event(722, "restart"),)), [5, 10, 15, 20, 25, 30], generation):
        found += det.observe(t, snap)
    assert [(e.source, e.t) for e in found] == [(deploys.RESTART, 25)]


@pytest.mark.parametrize("generation", ["current", "v0.10", "v0.8"])
@pytest.mark.parametrize("started, cold", [
    pytest.param(-60.0, True, id="process-started-a-minute-ago"),
    pytest.param(-700.0, False, id="process-started-before-the-grace"),
])
def test_a_first_scrape_of_a_fresh_process_is_a_cold_start(generation, started, cold):
    det = SnapshotChangeDetector("r", GRACE)
    found = []
    for t, snap in snapshots(simulator.Scenario(), [5, 10], generation, start=started):
        found += det.observe(t, snap)
    # the grace counts from the process start, as from a restart
    assert [(e.source, e.t) for e in found] == ([(deploys.RESTART, started)] if cold else [])


def test_a_first_scrape_of_counters_near_zero_is_a_cold_start():
    text = ('vllm:prefix_cache_queries_total{model_name="m",engine="0"} 320\n'
            'vllm:prefix_cache_hits_total{model_name="m",engine="0"} 0\n')
    (e,) = SnapshotChangeDetector("r", GRACE).observe(1.0, parse(text))
    assert e.source == deploys.RESTART and "near zero" in e.description


def test_restart_detection_survives_series_with_and_without_engine():
    text = ('vllm:prefix_cache_queries_total{model_name="m"} 1e6\nvllm:prefix_cache_queries_created{model_name="m"} 5\n'
            'vllm:prefix_cache_queries_total{model_name="m",engine="0"} 1e6\n'
            'vllm:prefix_cache_queries_created{model_name="m",engine="0"} 5\n')
    det = SnapshotChangeDetector("r", GRACE)
    det.observe(1000.0, parse(text))
    (e,) = det.observe(1005.0, parse(text.replace("} 5", "} 900")))
    assert e.source == deploys.RESTART


def test_a_counter_decrease_alone_is_a_restart(fixtures):
    det = SnapshotChangeDetector("r", GRACE)
    text = (FIXTURES / "edge" / "multiprocess_pid.txt").read_text()
    det.observe(1.0, parse(text))
    (e,) = det.observe(2.0, parse(text.replace("2000.0", "20.0")))
    assert e.source == deploys.RESTART and "decreased" in e.description


def test_cache_config_change_is_a_config_event():
    det = SnapshotChangeDetector("r", GRACE)
    found = []
    for t, snap in snapshots(simulator.Scenario(events=(simulator.Event(707, "kv_blocks", 12000),)), [5, 10, 15]):
        found += det.observe(t, snap)
    assert [e.source for e in found] == [deploys.CONFIG_CHANGE]
    assert "cache_config_info" in found[0].description


def test_annotations_file_format():
    text = 'app.kubernetes.io/version="v42"\nkubernetes.io/config.seen="2026-11-30T05:00:00Z"\ndeploy/note="a \\"quoted\\" note"\ngarbage line\n'
    assert parse_annotations(text) == {"app.kubernetes.io/version": "v42", "kubernetes.io/config.seen": "2026-11-30T05:00:00Z",
                                       "deploy/note": 'a "quoted" note'}


def iv(end, ratio, tokens=10000.0, kv=0.1):
    return Interval(end - 5, end, tokens, tokens * ratio, 1.0, 10.0, kv)


@pytest.mark.parametrize("ratios, kv, expect", [
    pytest.param([0.88] * 12 + [0.04] * 3, 0.1, 60.0, id="a-step"),
    pytest.param([0.88 - 0.03 * i for i in range(15)], 0.1, None, id="a-slide"),
    pytest.param([0.88] * 12 + [0.04, 0.8, 0.04], 0.1, None, id="not-sustained"),
    pytest.param([0.88] * 12 + [0.04] * 3, 0.9, None, id="kv-near-full"),
    pytest.param([0.88] * 15, 0.1, None, id="steady"),
])
def test_change_point(ratios, kv, expect):
    ivs = [iv(5.0 * (i + 1), r, kv=kv) for i, r in enumerate(ratios)]
    assert detect_change_point(ivs, ivs[-1].end, DEFAULTS.change_point) == expect


def test_change_point_needs_tokens():
    ivs = [iv(5.0 * (i + 1), r, tokens=100) for i, r in enumerate([0.88] * 12 + [0.04] * 3)]
    assert detect_change_point(ivs, ivs[-1].end, DEFAULTS.change_point) is None


def test_a_counter_that_steps_back_a_little_is_no_restart():
    det = SnapshotChangeDetector("r", GRACE)
    text = (FIXTURES / "edge" / "multiprocess_pid.txt").read_text()
    det.observe(1.0, parse(text))
    assert det.observe(2.0, parse(text.replace("2000.0", "1999.0"))) == []


def metrics_of(start: float, queries: float) -> str:
    return (f"process_start_time_seconds {start}\n"
            f'vllm:prefix_cache_queries_total{{model_name="m"}} {queries}\nvllm:prefix_cache_hits_total{{model_name="m"}} {queries / 2}\n')


def test_a_nan_start_time_is_never_a_restart():
    det = SnapshotChangeDetector("r", GRACE)
    found = [e for t in range(1, 30) for e in det.observe(float(t), parse(metrics_of(math.nan, 1e6 + t * 1000)))]
    assert found == [] and not det.flapping


def test_one_url_round_robin_over_two_replicas_is_no_string_of_restarts():
    """28 start-time changes in 30 s used to be 28 restarts, each granting the cold-start
    grace: the alerts of that target never fired. Now at most one, then reported."""
    det = SnapshotChangeDetector("r", GRACE)
    found, refused, notes = [], 0, []
    for i in range(30):
        start = 1000.0 if i % 2 == 0 else 2000.0
        found += det.observe(5000.0 + i, parse(metrics_of(start, 1e6 + i * 1000)))
        refused += det.refused
        notes += det.notes
    assert len(found) <= 1 and det.flapping and refused >= 28
    assert "several processes answer at this URL" in notes[-1]
    # quiet for long enough, a later change of the start time is a restart again
    det.observe(5400.0, parse(metrics_of(2000.0, 2e6)))
    (e,) = det.observe(5405.0, parse(metrics_of(5390.0, 10.0)))
    assert e.source == deploys.RESTART and not det.flapping


def test_real_restarts_minutes_apart_are_each_a_restart():
    det = SnapshotChangeDetector("r", GRACE)
    found = []
    for k in range(4):
        for i in range(10):
            t = 10000.0 + k * 400 + i * 5
            found += det.observe(t, parse(metrics_of(10000.0 + k * 400 - 30, 1000.0 * (i + 1))))
    assert [e.source for e in found] == [deploys.RESTART] * 4 and not det.flapping  # the first: a cold first start


# --- a target that counts blocks: its floors are in tokens of its own block size -----------
def blocks_metrics(queries: float, hits: float, block_size: int = 32, start: float | None = -10000.0) -> str:
    """A vLLM 0.8.x text (the `gpu_` pair counts blocks, as its HELP says) with a block
    size of its own in cache_config_info."""
    return ("" if start is None else f"process_start_time_seconds {start}\n") + (
        "# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, in terms of number of queried blocks.\n"
        "# TYPE vllm:gpu_prefix_cache_queries_total counter\n"
        f'vllm:gpu_prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}\n'
        "# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits, in terms of number of cached blocks.\n"
        "# TYPE vllm:gpu_prefix_cache_hits_total counter\n"
        f'vllm:gpu_prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}\n'
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{block_size="{block_size}",enable_prefix_caching="True",engine="0"}} 1.0\n')


def test_a_change_point_on_a_target_counting_blocks_is_judged_in_tokens_of_its_block_size():
    """300 blocks of 32 tokens every 5 s: 28,800 query tokens in the 15 s after the step,
    over the 20,000 floor. Taken as 900 tokens (the count as it is), or as 14,400 (16
    tokens a block), the floor was never met and the unannounced change never seen."""
    engine = Engine(load({"targets": [{"name": "vllm-0", "url": "http://127.0.0.1:1/metrics"}]}))
    assert engine.config.rules.change_point.min_query_tokens == 20000
    queries = hits = 0.0
    found = []
    for t in range(0, 125, 5):
        queries += 300
        hits += 300 * (0.9 if t <= 100 else 0.2)
        found += engine.ingest("vllm-0", float(t), parse(blocks_metrics(queries, hits)))
    assert [(e.source, e.t) for e in found] == [(deploys.CHANGE_POINT, 100.0)]


def test_a_change_point_floor_counts_blocks_in_the_targets_block_size():
    cp = DEFAULTS.change_point
    blocks = cp.min_query_tokens / 32
    assert deploys.change_point_has_traffic(blocks, blocks, cp, "blocks", 32)
    assert not deploys.change_point_has_traffic(blocks, blocks, cp, "blocks", 16)
    assert not deploys.change_point_has_traffic(blocks, blocks, cp, "tokens", 32)
    # a target that never said its block size: 16 tokens a block, vLLM's default
    assert deploys.change_point_has_traffic(cp.min_query_tokens / 16, cp.min_query_tokens / 16, cp, "blocks", None)


def test_a_first_scrape_of_a_block_counting_target_is_weighed_in_its_own_block_size():
    """800 blocks of 32 tokens are 25,600 tokens: a cache that has served, no cold start
    (800 blocks of 16 tokens would be 12,800, under the 20,000 of a cold cache)."""
    assert SnapshotChangeDetector("r", GRACE).observe(1.0, parse(blocks_metrics(800, 400, start=None))) == []
    (e,) = SnapshotChangeDetector("r", GRACE).observe(1.0, parse(blocks_metrics(500, 250, start=None)))
    assert e.source == deploys.RESTART and "16000 query tokens" in e.description


# --- vLLM's sleep mode: a sleep is an event, a wake a cold start without a restart ----------------
def _sleep_fixture(state: str) -> str:
    from pathlib import Path
    return (Path(__file__).parent / "fixtures" / "engine-metrics" / f"vllm_loggers_connector-sleep_{state}.txt").read_text()


def test_falling_asleep_is_an_event_and_waking_is_a_cold_start_without_a_restart():
    awake, asleep = parse(_sleep_fixture("awake")), parse(_sleep_fixture("asleep-level-1"))
    d = SnapshotChangeDetector("vllm-0", 600.0)
    assert d.observe(100.0, awake) == [] and d.asleep_since is None
    (sleep,) = d.observe(105.0, asleep)
    assert (sleep.source, sleep.t, sleep.is_restart, sleep.is_deploy) == ("sleep", 105.0, False, False)
    assert "level 1: weights offloaded to CPU, KV cache discarded" in sleep.description
    assert d.observe(110.0, asleep) == [] and d.asleep_since == 105.0
    (wake,) = d.observe(225.0, awake)
    assert (wake.source, wake.t, wake.is_restart, wake.is_deploy) == ("wake", 225.0, True, False)
    assert "woke after 120s asleep (level 1" in wake.description and "starts empty" in wake.description
    assert d.asleep_since is None and d.observe(230.0, awake) == []


def test_an_engine_asleep_at_the_first_look_wakes_as_a_cold_start_too():
    d = SnapshotChangeDetector("vllm-0", 600.0)
    assert d.observe(100.0, parse(_sleep_fixture("asleep-level-2"))) == [] and d.asleep_since == 100.0
    (wake,) = d.observe(130.0, parse(_sleep_fixture("awake")))
    assert wake.source == "wake" and "30s asleep (level 2: weights and KV cache discarded)" in wake.description


def test_a_restart_while_asleep_is_one_restart_not_a_wake_too():
    from dataclasses import replace
    asleep = replace(parse(_sleep_fixture("asleep-level-1")), process_start_time=1.0)
    d = SnapshotChangeDetector("vllm-0", 600.0)
    d.observe(1000.0, asleep)
    events = d.observe(1005.0, replace(parse(_sleep_fixture("awake")), process_start_time=1004.0))
    assert [e.source for e in events] == ["restart"]


def test_events_say_whether_they_are_deploys():
    from exporter.alerting.deploys import DeployEvent
    assert [DeployEvent(0, None, "v", s).is_deploy for s in deploys.SOURCES] == [True, False, True, True, True, False, False, False]
    assert DeployEvent(0, None, "v", deploys.RECORDING).is_deploy  # a recording's announced deploys
    fleet = DeployEvent(0, None, "replicas:2->6", deploys.REPLICAS, model="m", replicas=(2, 6))
    assert fleet.to_json()["model"] == "m" and fleet.to_json()["replicas"] == {"before": 2, "after": 6}
    assert "model" not in DeployEvent(0, None, "v42", deploys.API).to_json()  # the API's events as they were
