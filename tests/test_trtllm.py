"""TensorRT-LLM (`trtllm-serve`, /prometheus/metrics): parse on bodies rendered from
upstream's collector, and the same rules, causes and alerts as vLLM through `backtest`."""
import json
import math
from pathlib import Path

import pytest

from exporter.sim import simulator
from exporter.monitor.replay import backtest
from exporter.sim.simulator import Event, Scenario
from exporter.parse.vllm_metrics import parse
from exporter.series.window import summarize

from helpers import backtest_with_engine

from scenarios import START, at, lines

FIXTURES = Path(__file__).parent / "fixtures" / "engine-metrics"
LABELS = 'engine_type="pytorch",model_name="TinyLlama-1.1B-Chat-v1.0"'


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_block_counters_become_tokens_with_the_engines_block_size():
    snap = parse(fixture("trtllm_collector-050f80de_two-identical-requests.txt"))
    assert snap.warnings == () and snap.engine_kind == "trtllm" and snap.block_size == 32
    (s,) = snap.series
    assert (s.model_name, s.engine) == ("TinyLlama-1.1B-Chat-v1.0", None)
    # upstream's test: the second identical request reuses 1 block and misses 1
    assert (s.prefix_cache.queries, s.prefix_cache.hits, s.prefix_cache.unit) == (64.0, 32.0, "tokens")
    assert s.engine_hit_rate == 0.5  # the cumulative gauge, kept apart from the counters
    assert s.ttft.count == 2 and s.ttft.sum == pytest.approx(0.0539) and math.isinf(s.ttft.buckets[-1][0])
    assert s.ttft.bounds[:3] == (0.001, 0.005, 0.01) and len(s.ttft.buckets) == 23
    assert s.kv_cache_usage == 0.0 and s.prompt_tokens == 12.0 and s.generation_tokens == 50.0


def test_a_declared_reused_counter_without_a_sample_counts_zero():
    """prometheus_client creates a labelled child at its first increment: before any
    block was reused, the family is declared and has no sample. That is 0 hits."""
    snap = parse(fixture("trtllm_collector-050f80de_first-request-no-reuse-yet.txt"))
    assert snap.warnings == ()
    (s,) = snap.series
    assert (s.prefix_cache.queries, s.prefix_cache.hits, s.prefix_cache.unit) == (32.0, 0.0, "tokens")


def test_a_missing_reused_family_is_half_a_pair_not_zero():
    text = "\n".join(l for l in fixture("trtllm_collector-050f80de_first-request-no-reuse-yet.txt").splitlines()
                     if "reused_blocks" not in l)
    snap = parse(text)
    (s,) = snap.series
    assert s.prefix_cache.queries is None and s.prefix_cache.hits is None
    assert any("only one of trtllm_kv_cache_reused_blocks_total" in w for w in snap.warnings)


@pytest.mark.parametrize("size", [None, "0", "NaN", "2.5", "+Inf"])
def test_without_a_usable_block_size_the_ratio_is_counted_in_blocks_and_says_so(size):
    text = "\n".join(l for l in fixture("trtllm_collector-050f80de_two-identical-requests.txt").splitlines()
                     if not l.startswith("trtllm_kv_cache_tokens_per_block{"))
    if size is not None:
        text += f"\ntrtllm_kv_cache_tokens_per_block{{{LABELS}}} {size}\n"
    snap = parse(text)
    (s,) = snap.series
    assert (s.prefix_cache.queries, s.prefix_cache.hits, s.prefix_cache.unit) == (2.0, 1.0, "blocks")
    assert snap.block_size is None
    assert any("trtllm_kv_cache_tokens_per_block" in w for w in snap.warnings)


def test_old_prometheus_client_type_names_without_total_are_read_too():
    text = fixture("trtllm_collector-050f80de_first-request-no-reuse-yet.txt").replace(
        "# TYPE trtllm_kv_cache_reused_blocks_total counter", "# TYPE trtllm_kv_cache_reused_blocks counter")
    (s,) = parse(text).series
    assert s.prefix_cache.hits == 0.0


# --- the same rules through backtest: the simulator's replicas, rendered as trtllm-serve would
TOKENS_PER_BLOCK = 32


def as_trtllm(body: str) -> str:
    """One simulated vLLM scrape as trtllm-serve renders the same traffic: the block
    counters in blocks of 32 tokens, the cumulative hit-rate gauge, the TTFT histogram."""
    snap = parse(body)
    queries = sum(s.prefix_cache.queries for s in snap.series)
    hits = sum(s.prefix_cache.hits for s in snap.series)
    buckets: dict[float, float] = {}
    for s in snap.series:
        for le, count in s.ttft.buckets:
            buckets[le] = buckets.get(le, 0.0) + count
    out = [f"process_start_time_seconds {snap.process_start_time}",
           "# TYPE trtllm_kv_cache_hit_rate gauge",
           f"trtllm_kv_cache_hit_rate{{{LABELS}}} {hits / queries if queries else 0.0}",
           "# TYPE trtllm_kv_cache_reused_blocks_total counter",
           f"trtllm_kv_cache_reused_blocks_total{{{LABELS}}} {hits / TOKENS_PER_BLOCK}",
           "# TYPE trtllm_kv_cache_missed_blocks_total counter",
           f"trtllm_kv_cache_missed_blocks_total{{{LABELS}}} {(queries - hits) / TOKENS_PER_BLOCK}",
           "# TYPE trtllm_kv_cache_tokens_per_block gauge",
           f"trtllm_kv_cache_tokens_per_block{{{LABELS}}} {TOKENS_PER_BLOCK}",
           "# TYPE trtllm_time_to_first_token_seconds histogram"]
    for le, count in sorted(buckets.items()):
        out.append(f'trtllm_time_to_first_token_seconds_bucket{{{LABELS},le="{"+Inf" if math.isinf(le) else le}"}} {count}')
    out.append(f"trtllm_time_to_first_token_seconds_count{{{LABELS}}} {sum(s.ttft.count for s in snap.series)}")
    out.append(f"trtllm_time_to_first_token_seconds_sum{{{LABELS}}} {sum(s.ttft.sum for s in snap.series)}")
    return "\n".join(out) + "\n"


def trtllm_lines(rec):
    out = []
    for line in rec:
        obj = json.loads(line)
        if obj.get("body"):
            obj["body"] = as_trtllm(obj["body"])
        out.append(json.dumps(obj))
    return out



@pytest.mark.slow
def test_a_trtllm_fleet_pages_a_prefix_change_with_its_cause_and_resolves_after_the_rollback():
    deploy, rollback = 300.0, 600.0
    scenario = Scenario(request_rate=5.0, events=(Event(at(deploy), "prompt", "timestamp"), Event(at(rollback), "prompt", "static")))
    rec = trtllm_lines(lines(scenario, duration=1500, deploys=[(deploy, None, "v42"), (rollback, None, "v41")]))
    transitions, engine, warnings = backtest_with_engine(rec)
    assert warnings == []
    drop = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy"]
    firing = [t for t in drop if t["state"] == "firing"]
    assert {t["labels"]["target"] for t in firing} == {"vllm-0", "vllm-1"}
    assert all(t["labels"]["cause"] == "prompt_prefix_change" and t["t"] - (START + deploy) <= 30 for t in firing)
    assert all(t["labels"]["model_name"] == "TinyLlama-1.1B-Chat-v1.0" for t in firing)
    fired = {(t["alertname"], t["labels"]["target"]) for t in transitions if t["state"] == "firing"}
    resolved = {(t["alertname"], t["labels"]["target"]) for t in transitions if t["state"] == "resolved" and t["t"] > START + rollback}
    assert ("PrefixCacheHitRateDropAfterDeploy", "vllm-0") in fired and resolved == fired
    assert not [a for a in engine.active_alerts() if a.state == "firing"]


@pytest.mark.slow
def test_the_cumulative_hit_rate_gauge_is_never_alerted_on():
    """A steady fleet whose since-start gauge reads 0 (a stuck gauge, warm-up counted in)
    pages nobody: only the windowed counters are judged."""
    rec = trtllm_lines(lines(Scenario(request_rate=5.0), duration=900))
    zeroed = []
    for line in rec:
        obj = json.loads(line)
        if obj.get("body"):
            obj["body"] = "\n".join(f"trtllm_kv_cache_hit_rate{{{LABELS}}} 0.0" if l.startswith("trtllm_kv_cache_hit_rate{") else l
                                    for l in obj["body"].splitlines()) + "\n"
        zeroed.append(json.dumps(obj))
    for recording in (rec, zeroed):
        transitions, _, warnings = backtest_with_engine(recording)
        assert transitions == [] and warnings == []


def test_the_windowed_ratio_of_a_trtllm_target_is_its_token_ratio():
    rec = trtllm_lines(lines(Scenario(request_rate=5.0), duration=300, replicas=1))
    from exporter.series.history import History
    history = History(3600.0)
    for line in rec:
        obj = json.loads(line)
        history.append(obj["t"], parse(obj["body"]))
    now = json.loads(rec[-1])["t"]
    stats = summarize(history.samples(), now, [("5m", 300.0)], 1000.0)["TinyLlama-1.1B-Chat-v1.0"]["5m"]
    assert stats.unit == "tokens" and 0.5 < stats.hit_ratio < 1.0
