"""Cache tiers (which tier served the cached tokens) and vLLM's KV residency histograms."""
from pathlib import Path

import pytest

from exporter.parse import tiers
from exporter.parse.vllm_metrics import parse

FIXTURES = Path(__file__).parent / "fixtures" / "engine-metrics"
# vLLM 0.33's residency buckets (kv_cache_residency)
BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800)


def residency(name: str, counts: dict[float, int]) -> str:
    labels = 'engine="0",model_name="m"'
    out, running = [f"# TYPE vllm:{name} histogram"], 0
    for le in BUCKETS + (float("inf"),):
        running += counts.get(le, 0)
        out.append(f'vllm:{name}_bucket{{{labels},le="{"+Inf" if le == float("inf") else float(le)}"}} {running}')
    out += [f"vllm:{name}_count{{{labels}}} {running}", f"vllm:{name}_sum{{{labels}}} {sum(le * n for le, n in counts.items())}"]
    return "\n".join(out) + "\n"


def test_sglang_tiers_keep_the_disjoint_total_and_merge_storage_backends():
    text = ('sglang:prompt_tokens_total{model_name="m"} 1000\n'
            'sglang:cached_tokens_total{model_name="m",cache_source="device"} 300\n'
            'sglang:cached_tokens_total{model_name="m",cache_source="host"} 100\n'
            'sglang:cached_tokens_total{model_name="m",cache_source="storage_HiCacheFile"} 50\n'
            'sglang:cached_tokens_total{model_name="m",cache_source="total"} 20\n')
    (s,) = parse(text).series
    assert dict(s.cached_tokens_by_tier) == {"device": 300.0, "host": 100.0, "storage": 50.0, "unattributed": 20.0}
    assert s.prefix_cache.hits == 470.0  # every tier, the fallback included


def test_trtllm_tiers_by_cache_tier_summed_over_levels():
    text = ('trtllm_prompt_cache_hit_tokens_total{model_name="m",engine_type="pytorch",cache_level="0",cache_tier="gpu"} 640\n'
            'trtllm_prompt_cache_hit_tokens_total{model_name="m",engine_type="pytorch",cache_level="1",cache_tier="gpu"} 64\n'
            'trtllm_prompt_cache_hit_tokens_total{model_name="m",engine_type="pytorch",cache_level="2",cache_tier="host"} 32\n')
    (s,) = parse(text).series
    assert dict(s.cached_tokens_by_tier) == {"device": 704.0, "host": 32.0}


def test_vllm_0_33_tiers_come_from_cached_by_source_p2p_included():
    text = ('vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 70\n'
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="p2p"} 30\n')
    (s,) = parse(text).series
    assert dict(s.cached_tokens_by_tier) == {"device": 70.0, "p2p": 30.0}


def test_blocks_evicted_sooner_than_they_are_reused_is_eviction_pressure():
    idle = residency("kv_block_idle_before_evict_seconds", {2: 80, 10: 20})  # evicted after ~2 s idle
    gap = residency("kv_block_reuse_gap_seconds", {30: 60, 120: 40})  # reused every ~30 s
    (s,) = parse(idle + gap).series
    assert s.kv_idle_before_evict.count == 100 and s.kv_reuse_gap.sum == 60 * 30 + 40 * 120
    assert tiers.median(s.kv_idle_before_evict) == 2 and tiers.median(s.kv_reuse_gap) == 30
    assert tiers.evicted_before_reuse(s.kv_idle_before_evict, s.kv_reuse_gap) is True
    roomy = residency("kv_block_idle_before_evict_seconds", {600: 100})
    (s,) = parse(roomy + gap).series
    assert tiers.evicted_before_reuse(s.kv_idle_before_evict, s.kv_reuse_gap) is False


def test_a_cut_or_missing_residency_histogram_is_no_evidence():
    cut = "\n".join(l for l in residency("kv_block_idle_before_evict_seconds", {2: 5}).splitlines() if "+Inf" not in l)
    (s,) = parse(cut + "\n" + residency("kv_block_reuse_gap_seconds", {30: 5})).series
    assert s.kv_idle_before_evict is None
    assert tiers.evicted_before_reuse(s.kv_idle_before_evict, s.kv_reuse_gap) is None


def test_tiers_and_residency_are_exported():
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from exporter.serve.collector import PrefixCacheCollector
    from exporter.config.sections import Target
    from exporter.serve.state import State
    from exporter.monitor.targetview import TargetView

    text = ('vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="host"} 30\n'
            + residency("kv_block_idle_before_evict_seconds", {2: 80}) + residency("kv_block_reuse_gap_seconds", {30: 60}))
    state = State()
    state.set_targets([TargetView(target=Target("vllm-0", "http://v:8000/metrics"), snapshot=parse(text), up=True)])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(state, ["5m"]))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert [(s.labels["tier"], s.value) for s in fams["prefixcache_cached_tokens_by_tier"].samples if s.name.endswith("_total")] == [("host", 30.0)]
    assert [s.value for s in fams["prefixcache_kv_evicted_before_reuse"].samples] == [1.0]
    counts = {s.name: s.value for s in fams["prefixcache_vllm_kv_block_reuse_gap_seconds"].samples if not s.name.endswith("_bucket")}
    assert counts["prefixcache_vllm_kv_block_reuse_gap_seconds_count"] == 60


# --- vLLM with a KV connector, its sleep mode (fixtures rendered from upstream's stat logger) -----
def vllm_fixture(state: str) -> str:
    return (FIXTURES / f"vllm_loggers_connector-sleep_{state}.txt").read_text()


@pytest.mark.parametrize("state, level", [("awake", 0), ("asleep-level-1", 1), ("asleep-level-2", 2)])
def test_the_engine_sleep_state_is_read_as_its_level(state, level):
    snap = parse(vllm_fixture(state))
    (s,) = snap.series
    assert s.sleep_level == level and snap.warnings == ()
    assert snap.to_json()["series"][0]["sleep_level"] == level


@pytest.mark.parametrize("lines, level", [
    pytest.param(['sleep_state="awake"} 0'], 1, id="asleep-without-a-level-is-level-1"),
    pytest.param([], None, id="not-said"),
    pytest.param(['sleep_state="awake"} 1', 'sleep_state="discard_all"} 0'], 0, id="awake"),
])
def test_a_sleep_state_without_a_level_still_says_asleep(lines, level):
    text = 'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 10\n' + "".join(
        f'vllm:engine_sleep_state{{engine="0",model_name="m",{line}\n' for line in lines)
    (s,) = parse(text).series
    assert s.sleep_level == level


def test_an_unknown_sleep_state_is_a_warning_not_a_level():
    snap = parse('vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="dozing"} 1\n'
                 'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 10\n')
    assert snap.series[0].sleep_level is None and "unknown sleep_state 'dozing'" in snap.warnings[0]


def test_a_connector_is_a_second_tier_of_the_judged_ratio():
    """The GPU cache 31%, the connector 56%: the rules judge 88% (hitratio.py), each tier
    beside it; from the admitted counters and from the lookup pairs alike."""
    from exporter.series import hitratio
    from exporter.series.history import History
    from exporter.series.window import summarize

    awake = vllm_fixture("awake")
    zero = "\n".join(line if line.startswith("#") or "_created" in line or "sleep_state" in line or "_bucket" in line
                     or "_count" in line or "_sum" in line else line.rsplit(" ", 1)[0] + " 0.0" for line in awake.splitlines())
    h = History(3600.0)
    h.append(10.0, parse(zero + "\n"))
    h.append(60.0, parse(awake))
    ws = summarize(h.samples(), 60.0, [("1m", 60.0)], 1000.0)["Qwen/Qwen3-0.6B"]["1m"]
    assert ws.admitted_hit_ratio == pytest.approx(12800 / 40960)  # the GPU's own, as before
    assert ws.effective_hit_ratio == pytest.approx((12800 + 23040) / 40960)
    assert hitratio.tier_shares(ws) == pytest.approx({"device": 12800 / 40960, "external": 23040 / 40960})
    lookup_only = ws._replace(admitted_hit_increase=None, admitted_prompt_increase=None, external_transfer_increase=None)
    assert hitratio.judged_ratio(lookup_only) == pytest.approx((12800 + 23040) / 40960)
    s = parse(awake).series[0]
    assert tiers.evicted_before_reuse(s.kv_idle_before_evict, s.kv_reuse_gap) is True  # idle 2 s, reused every 30 s
