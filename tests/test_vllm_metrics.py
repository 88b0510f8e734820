import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sim import simulator
from exporter.parse.vllm_metrics import MAX_LABEL_VALUE, MEMO_FLOOR, MEMO_SLACK, parse

FIXTURES = Path(__file__).parent / "fixtures"
UPSTREAM = FIXTURES / "vllm-metrics"
EDGE = FIXTURES / "edge"


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_upstream_v0_ttft_excerpt_keeps_buckets_and_warns_about_the_cut():
    snap = parse(read(UPSTREAM / "v0-le-0.6.2_vllm-issue-8819_ttft.txt"))
    (s,) = snap.series
    assert (s.model_name, s.engine) == ("facebook/opt-125m", None)
    assert s.ttft.bounds[:3] == (0.001, 0.005, 0.01)
    assert s.ttft.buckets[4] == (0.04, 1.0)
    assert len(s.ttft.buckets) == 15
    assert s.ttft.count is None and s.ttft.sum is None
    assert any("+Inf" in w for w in snap.warnings)
    assert s.prefix_cache is None


def test_upstream_0_10_prefers_new_pair_and_never_adds_the_deprecated_one():
    snap = parse(read(UPSTREAM / "v1-0.10.0_production-stack-issue-617.txt"))
    (s,) = snap.series
    assert (s.model_name, s.engine) == ("zai-org/GLM-4.5", "0")
    # queries from the new pair; the excerpt lacks its hits, which 0.10 also counts
    # (in the same tokens) in the deprecated pair: taken, not added
    assert s.prefix_cache.queries == 32.0
    assert s.prefix_cache.hits == 0.0
    assert s.prefix_cache.unit == "tokens"
    assert s.kv_cache_usage == pytest.approx(9.75010481363281e-06)
    assert s.created == pytest.approx(1.7537953269352946e09)
    assert any("deprecated" in w for w in snap.warnings)


def test_upstream_main_2026_reads_hits_and_external_hits():
    snap = parse(read(UPSTREAM / "v1-main-2026-08_vllm-pr-51670.txt"))
    (s,) = snap.series
    assert s.prefix_cache.hits == 4.879232e06
    assert s.prefix_cache.queries is None
    assert s.external_prefix_cache.hits == 0.0
    assert s.generation_tokens == 14588.0


REAL_ENGINE = UPSTREAM / "v1-0.32.0-cpu_tiny-llama_after-incident.txt"


def test_a_whole_scrape_of_the_real_cpu_engine_reads_its_counters_block_size_and_tiers():
    snap = parse(read(REAL_ENGINE))
    (s,) = snap.series
    assert (s.model_name, s.engine) == ("tiny-llama", "0")
    assert (s.prefix_cache.queries, s.prefix_cache.hits, s.prefix_cache.unit) == (2.1791613e07, 1.3828352e07, "tokens")
    assert snap.block_size == 128 and snap.prefix_caching_enabled is True
    assert s.external_prefix_cache.queries == 0.0
    assert s.ttft.count is not None and s.ttft.count > 0
    assert not snap.warnings


def test_every_family_of_the_real_engine_scrape_is_read_or_knowingly_left_out():
    """The recorded twin of tests/test_real_vllm.py's check on a live engine."""
    from exporter.parse.names import IGNORED_FAMILIES, READ_FAMILIES, family_of

    families = {family_of(line.split()[2]) for line in read(REAL_ENGINE).splitlines() if line.startswith("# TYPE vllm:")}
    assert families - READ_FAMILIES - set(IGNORED_FAMILIES) == set()
    assert not set(IGNORED_FAMILIES) & READ_FAMILIES  # one verdict a family
    assert family_of("vllm:iteration_tokens_total_created") == "vllm:iteration_tokens"
    assert family_of("vllm:prefix_cache_hits_total") == family_of("vllm:prefix_cache_hits_created") == "vllm:prefix_cache_hits"


def test_parse_output_contract_keys():
    out = parse(read(UPSTREAM / "v1-0.10.0_production-stack-issue-617.txt")).to_json()
    assert {"prefix_caching_enabled", "block_size", "series", "warnings"} <= set(out)
    series = out["series"][0]
    assert {"model_name", "engine", "prefix_cache", "external_prefix_cache", "ttft", "kv_cache_usage", "preemptions", "prompt_tokens"} <= set(series)
    assert series["prefix_cache"] == {"queries": 32.0, "hits": 0.0, "unit": "tokens"}
    json.dumps(out, allow_nan=False)


@pytest.mark.parametrize("generation", simulator.GENERATIONS)
def test_every_simulated_generation_parses_to_what_the_simulator_counted(generation):
    replica = simulator.Replica("r", simulator.Scenario(), start=0.0, seed=3, generation=generation, engines=2)
    replica.advance(120.0)
    snap = parse(replica.render())
    assert snap.warnings == ()
    assert [s.engine for s in snap.series] == ([None] if generation in ("v0", "sglang") else ["0", "1"])
    assert snap.engine_kind == ("sglang" if generation == "sglang" else "vllm")
    if generation == "sglang":
        (s,) = snap.series
        engine = replica.engines[0]
        assert (s.prefix_cache.queries, s.prefix_cache.hits) == (engine.queries, engine.hits)  # splits summed
        assert s.ttft.count == engine.hist["ttft"].count and s.engine_hit_rate == engine.last_hit_rate
        return
    if generation == "v0":
        (s,) = snap.series
        # V0 has one series for the model; our simulator renders engine 0's view
        assert 0 < s.hit_rate_since_start < 1
        assert snap.prefix_caching_enabled is True
        return
    for s, engine in zip(snap.series, replica.engines):
        expected_unit = "blocks" if generation == "v0.8" else "tokens"
        assert s.prefix_cache.unit == expected_unit
        if expected_unit == "blocks":
            assert (s.prefix_cache.queries, s.prefix_cache.hits) == (engine.query_blocks, engine.hit_blocks)
        else:
            assert (s.prefix_cache.queries, s.prefix_cache.hits) == (engine.queries, engine.hits)
        assert s.ttft.count == engine.hist["ttft"].count
        assert s.ttft.bounds == simulator.TTFT_BUCKETS + (math.inf,)
        assert s.preemptions == engine.preemptions
        assert s.prompt_tokens == engine.prompt_tokens
        assert s.created == 0.0
    if generation in ("v0.10", "current"):
        assert snap.block_size == 16 and snap.prefix_caching_enabled is True
    assert snap.process_start_time == 0.0


def test_escapes_nan_inf_and_exponents():
    snap = parse(read(EDGE / "escapes_nan_inf.txt"))
    (s,) = snap.series
    assert s.model_name == 'team "a"\\b\nc'
    assert s.prefix_cache.queries == 1.7537953269352946e09
    assert math.isnan(s.kv_cache_usage)  # a gauge may be NaN
    assert s.ttft.sum is None  # a counter may not: +Inf is refused, counted and warned about
    assert snap.rejected == (("non_finite_counter", 1),)
    assert any("+Inf" in w and "dropped" in w for w in snap.warnings)
    assert s.ttft.buckets == ((0.1, 3.0), (math.inf, 4.0))


@pytest.mark.parametrize("value, reason", [
    pytest.param("+Inf", "non_finite_counter", id="plus-inf"),
    pytest.param("NaN", "non_finite_counter", id="nan"),
    pytest.param("-Inf", "negative_counter", id="minus-inf"),
    pytest.param("-5", "negative_counter", id="negative"),
    # past 2**53 a float loses whole increments; a reset after it made it every later sample's offset
    pytest.param("1e20", "counter_too_large", id="past-2-to-the-53"),
    pytest.param("1e308", "counter_too_large", id="1e308"),
])
def test_counters_must_be_finite_and_not_negative(value, reason):
    text = (f'vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {value}\n'
            'vllm:prefix_cache_hits_total{model_name="m",engine="0"} 5\n')
    snap = parse(text)
    assert snap.series[0].prefix_cache.queries is None and snap.series[0].prefix_cache.hits == 5.0
    assert snap.rejected == ((reason, 1),)


def test_a_counter_of_2_to_the_53_is_kept_and_one_past_it_refused_also_by_the_central_modes_plan():
    """The bound is the same on both paths: the body's loop and the plan that files a pod's
    samples read from Prometheus (whose fast path falls back to the loop when a value is unfit)."""
    from exporter.parse.vllm_metrics import parse_samples
    for value, kept in ((repr(2.0 ** 53), True), ("1e20", False)):
        samples = [("vllm:prefix_cache_queries_total", {"model_name": "m", "engine": "0"}, value, False),
                   ("vllm:prefix_cache_hits_total", {"model_name": "m", "engine": "0"}, "5", False)]
        for snap in (parse_samples(samples, 0, _plan_of(samples)), parse_samples(samples)):
            assert (snap.series[0].prefix_cache.queries is not None) is kept
            assert dict(snap.rejected).get("counter_too_large", 0) == (0 if kept else 1)


@pytest.mark.parametrize("name, expect", [
    pytest.param("garbage.txt", {"series": 1, "warnings": 4}, id="garbage-lines-skipped-rest-used"),
    pytest.param("truncated.txt", {"series": 1, "warnings": 2}, id="truncated-mid-line"),
])
def test_bad_text_is_used_as_far_as_it_reads(name, expect):
    snap = parse(read(EDGE / name))
    assert len(snap.series) == expect["series"]
    assert len(snap.warnings) >= expect["warnings"]
    if name == "garbage.txt":
        (s,) = snap.series
        assert (s.engine, s.prefix_cache.queries, s.prefix_cache.hits) == ("1", 100.0, 40.0)
    else:
        (s,) = snap.series
        assert (s.prefix_cache.queries, s.prefix_cache.hits) == (500.0, 250.0)


@pytest.mark.parametrize("text", [
    pytest.param("", id="empty"),
    pytest.param("\x00\xff{{{", id="binary"),
    pytest.param("vllm:prefix_cache_hits_total{" * 1000, id="unclosed-braces"),
    pytest.param('vllm:prefix_cache_hits_total{model_name="' + "\\" * 5000, id="backslashes"),
    pytest.param("vllm:time_to_first_token_seconds_bucket{le=\"x\",model_name=\"m\"} 1", id="bad-le"),
])
def test_parser_never_raises(text):
    snap = parse(text)
    json.dumps(snap.to_json())


def test_multiprocess_gauges_with_pid_take_the_highest():
    (s,) = parse(read(EDGE / "multiprocess_pid.txt")).series
    assert s.kv_cache_usage == 0.5
    assert s.prefix_cache.hits == 1500.0


@pytest.mark.parametrize("name, enabled, block_size", [
    pytest.param("v0_disabled.txt", False, None, id="v0-gauge-minus-one"),
    pytest.param("v1_disabled_cache_config.txt", False, 32, id="cache-config-info-false"),
])
def test_prefix_caching_disabled(name, enabled, block_size):
    snap = parse(read(EDGE / name))
    assert snap.prefix_caching_enabled is enabled
    assert snap.block_size == block_size
    assert all(s.hit_rate_since_start is None for s in snap.series)


def test_gpu_pair_without_help_is_assumed_tokens_and_says_so():
    snap = parse(read(EDGE / "gpu_pair_no_help.txt"))
    assert snap.series[0].prefix_cache.unit == "tokens"
    assert any("no HELP" in w for w in snap.warnings)


def test_cache_config_change_is_visible():
    replica = simulator.Replica("r", simulator.Scenario(), start=0.0, generation="current")
    snap = parse(replica.render())
    assert dict(snap.cache_config)["num_gpu_blocks"] == "16000"
    assert dict(snap.cache_config)["enable_prefix_caching"] == "True"


def test_a_wanted_sample_misplaced_inside_a_skipped_family_is_still_read():
    text = (EDGE / "misplaced_sample.txt").read_text()
    (s,) = parse(text).series
    assert (s.prefix_cache.queries, s.prefix_cache.hits) == (100.0, 60.0)


def engine_fixture(name):
    import pathlib
    return (pathlib.Path(__file__).resolve().parent / "fixtures" / "engine-metrics" / name).read_text()


@pytest.mark.parametrize("name, expect", [
    pytest.param("sglang_docs-production-metrics_pre-0.4.4.txt",
                 {"kind": "sglang", "model": "meta-llama/Llama-3.1-8B-Instruct", "queries": 8128902.0, "hits": None,
                  "kv": 0.28, "engine_hit_rate": 0.007507552643049313, "ttft_count": 11008.0}, id="sglang-pre-0.4.4-no-cached-counter"),
    pytest.param("sglang_0.5.1_issue-13485_scheduler-labels.txt",
                 {"kind": "sglang", "model": "Qwen-32B", "queries": None, "kv": 0.0}, id="sglang-0.5.1-scheduler-labels"),
    pytest.param("sglang_pr-1853_prerelease_name-label.txt",
                 {"kind": "sglang", "model": "/shared/public/elr-models/meta-llama/Llama-3.2-3B/5cc0ffe09ee49f7be6ca7c794ee6bd7245e84e60/",
                  "queries": 230794.0}, id="sglang-prerelease-name-label"),
    pytest.param("sglang_pr-1461_wip-never-released_percent-hit-rate.txt",
                 {"kind": "sglang", "engine_hit_rate": None, "warning": "not a 0-1 ratio"}, id="sglang-percent-hit-rate-refused"),
    pytest.param("lmcache-in-vllm_lmcache-pr-1300_tp4-worker-ids.txt",
                 {"model": "meta-llama/Llama-3.1-70B-Instruct", "lookups": 2.0}, id="lmcache-tp4-workers-not-summed"),
    pytest.param("lmcache-in-vllm_lmcache-pr-687.txt", {"series": 0}, id="lmcache-retrieve-and-store-only"),
])
def test_every_engine_fixture_parses_right(name, expect):
    snap = parse(engine_fixture(name))
    if "series" in expect:
        assert len(snap.series) == expect["series"]
        return
    (s,) = snap.series
    if "kind" in expect:
        assert snap.engine_kind == expect["kind"]
    if "model" in expect:
        assert s.model_name == expect["model"]
    if "queries" in expect:
        assert (s.prefix_cache.queries if s.prefix_cache else None) == expect["queries"]
    if "hits" in expect:
        assert s.prefix_cache.hits == expect["hits"]
    if "kv" in expect:
        assert s.kv_cache_usage == expect["kv"]
    if "engine_hit_rate" in expect:
        assert s.engine_hit_rate == expect["engine_hit_rate"]
    if "ttft_count" in expect:
        assert s.ttft.count == expect["ttft_count"]
    if "lookups" in expect:
        assert s.lmcache_lookups[0] == expect["lookups"]  # max over 4 workers, not 8
    if "warning" in expect:
        assert any(expect["warning"] in w for w in snap.warnings)


def test_sglang_splits_are_summed_and_lmcache_workers_are_not():
    text = "\n".join([
        'sglang:prompt_tokens_total{model_name="m",is_streaming="true"} 600',
        'sglang:prompt_tokens_total{model_name="m",is_streaming="false"} 400',
        'sglang:cached_tokens_total{model_name="m",cache_source="device"} 500',
        'sglang:cached_tokens_total{model_name="m",cache_source="host"} 100',
        'sglang:time_to_first_token_seconds_bucket{model_name="m",is_streaming="true",le="1.0"} 3',
        'sglang:time_to_first_token_seconds_bucket{model_name="m",is_streaming="false",le="1.0"} 2',
        'sglang:time_to_first_token_seconds_bucket{model_name="m",is_streaming="true",le="+Inf"} 4',
        'sglang:time_to_first_token_seconds_bucket{model_name="m",is_streaming="false",le="+Inf"} 2',
    ]) + "\n"
    s = parse(text).series[0]
    assert (s.prefix_cache.queries, s.prefix_cache.hits) == (1000.0, 600.0)
    assert s.ttft.buckets == ((1.0, 5.0), (math.inf, 6.0))
    lm = "\n".join(f'lmcache:num_requested_tokens_total{{model_name="m",worker_id="{w}"}} 800\n'
                   f'lmcache:num_hit_tokens_total{{model_name="m",worker_id="{w}"}} 200' for w in range(4))
    vllm = 'vllm:prefix_cache_queries_total{model_name="m",engine="0"} 1000\nvllm:prefix_cache_hits_total{model_name="m",engine="0"} 300\n'
    snap = parse(vllm + lm + "\n")
    ext = [s.external_prefix_cache for s in snap.series if s.external_prefix_cache]
    assert [(e.queries, e.hits) for e in ext] == [(800.0, 200.0)]  # LMCache stands in for vLLM's missing external pair
    with_vllm_external = vllm + 'vllm:external_prefix_cache_queries_total{model_name="m",engine="0"} 700\n' \
        'vllm:external_prefix_cache_hits_total{model_name="m",engine="0"} 100\n' + lm + "\n"
    ext = [s.external_prefix_cache for s in parse(with_vllm_external).series if s.external_prefix_cache]
    assert [(e.queries, e.hits) for e in ext] == [(700.0, 100.0)]  # vLLM's own wins; never both


def test_admitted_prefill_counters_are_parsed():
    text = ('vllm:prompt_tokens_by_source_total{model_name="m",engine="0",source="local_compute"} 3423\n'
            'vllm:prompt_tokens_by_source_total{model_name="m",engine="0",source="local_cache_hit"} 7840\n'
            'vllm:prompt_tokens_by_source_total{model_name="m",engine="0",source="external_kv_transfer"} 0\n'
            'vllm:prompt_tokens_by_source_total{model_name="m",engine="0",source="bogus"} 1\n'
            'vllm:prompt_tokens_total{model_name="m",engine="0"} 11263\n'
            'vllm:prompt_tokens_cached_total{model_name="m",engine="0"} 7840\n')
    snap = parse(text)
    s = snap.series[0]
    assert s.prompt_tokens_by_source == (("local_compute", 3423.0), ("local_cache_hit", 7840.0), ("external_kv_transfer", 0.0))
    assert s.prompt_tokens == 11263.0 and s.prompt_tokens_cached == 7840.0
    assert any("unknown source 'bogus'" in w for w in snap.warnings)
    assert snap.to_json()["series"][0]["prompt_tokens_by_source"]["local_cache_hit"] == 7840.0


@pytest.mark.parametrize("size", ["inf", "1e999", "-inf", "nan", "0", "-16", "16.5", "x"])
def test_a_block_size_that_is_no_whole_number_is_a_warning_not_a_crash(size):
    snap = parse(f'vllm:cache_config_info{{block_size="{size}",enable_prefix_caching="True"}} 1.0\n'
                 'vllm:prefix_cache_queries_total{model_name="m"} 10\nvllm:prefix_cache_hits_total{model_name="m"} 5\n')
    assert snap.block_size is None and snap.prefix_caching_enabled is True
    assert any("bad block_size" in w for w in snap.warnings)


@pytest.mark.parametrize("line", ["process_start_time_seconds NaN", "process_start_time_seconds +Inf",
                                  'vllm:prefix_cache_queries_created{model_name="m"} NaN'])
def test_a_start_time_that_is_no_time_is_dropped_and_counted(line):
    snap = parse(line + '\nvllm:prefix_cache_queries_total{model_name="m"} 10\nvllm:prefix_cache_hits_total{model_name="m"} 5\n')
    assert snap.process_start_time is None and snap.series[0].created is None
    assert dict(snap.rejected) == {"non_finite_start_time": 1}
    assert any("a start time must be a finite time" in w for w in snap.warnings)


def test_warnings_of_a_body_of_bad_lines_are_a_capped_sample_and_a_count():
    bad = 'vllm:prefix_cache_queries_total{model_name="m"} x\n' * 50000
    snap = parse(bad + 'vllm:prefix_cache_queries_total{model_name="m"} 10\nvllm:prefix_cache_hits_total{model_name="m"} 5\n')
    assert len(snap.warnings) == 100 and snap.warning_count == 50000 and snap.warnings_dropped == 49900
    out = snap.to_json()
    assert out["warnings_total"] == 50000 and len(out["warnings"]) == 100
    noted = snap.noted(["a counter stepped back"], {"counter_step_back": 1})
    assert noted.warning_count == 50001 and len(noted.warnings) == 100 and dict(noted.rejected) == {"counter_step_back": 1}


@pytest.mark.parametrize("line", [
    pytest.param('vllm:prefix_cache_queries_total{model_name="m",model_name="x"} 5', id="plain"),
    pytest.param('vllm:prefix_cache_queries_total{model_name="a\\\\b",engine="0",engine="1"} 5', id="escaped"),
])
def test_a_label_named_twice_refuses_the_sample_as_prometheus_does(line):
    snap = parse(line + "\n")
    assert snap.series == () and "a label twice" in snap.warnings[0]


def test_a_label_value_over_the_cap_refuses_its_sample_and_is_counted():
    """Four 1.9 MB model names made our /metrics 144 MB and the process 1.3 GB."""
    long_name = "m" * (MAX_LABEL_VALUE + 1)
    text = (f'vllm:prefix_cache_queries_total{{model_name="{long_name}"}} 5\n'
            'vllm:prefix_cache_queries_total{model_name="ok"} 5\nvllm:prefix_cache_hits_total{model_name="ok"} 1\n')
    snap = parse(text)
    assert [s.model_name for s in snap.series] == ["ok"] and dict(snap.rejected) == {"label_value_too_long": 1}
    assert len(snap.warnings[0]) < 200


def test_samples_held_apart_refuse_a_label_value_over_the_cap_as_a_body_does():
    """parse_samples (the Prometheus source) tests the values' total length first: one
    value over the cap is refused, many values that are each within it are not."""
    from exporter.parse.vllm_metrics import long_labels, parse_samples
    half = "h" * (MAX_LABEL_VALUE // 2 + 1)  # two of them are over the cap together, neither alone
    samples = [("vllm:prefix_cache_queries_total", {"model_name": "m" * (MAX_LABEL_VALUE + 1)}, "5"),
               ("vllm:prefix_cache_queries_total", {"model_name": "ok", "engine": half, "other": half}, "5"),
               ("vllm:prefix_cache_hits_total", {"model_name": "ok", "engine": half, "other": half}, "1")]
    snap = parse_samples([(name, labels, value, long_labels(labels)) for name, labels, value in samples])
    assert [s.model_name for s in snap.series] == ["ok"] and dict(snap.rejected) == {"label_value_too_long": 1}
    assert "line 1:" in snap.warnings[0] and len(snap.warnings[0]) < 200


def test_parsing_stops_at_the_series_limit():
    body = "".join(f'vllm:prefix_cache_queries_total{{model_name="m{i}"}} 1\n' for i in range(50_000))
    snap = parse(body, series_limit=2000)
    assert snap.over_series_limit and len(snap.series) == 2000
    assert not parse(body[: body.index('m2000"')].rpartition("\n")[0] + "\n", series_limit=2000).over_series_limit


def test_warnings_name_the_right_line_across_skipped_families_comments_and_crlf():
    """The body is read a stretch between comment lines at a time, skipped families in
    one jump: every line keeps its number, CRLF reads as LF, and a '#' inside a label
    value or a sample line starting with '#' do not end or start a stretch wrongly."""
    lines = [
        "# HELP vllm:e2e_request_latency_seconds skipped whole",
        "# TYPE vllm:e2e_request_latency_seconds histogram",
        *[f'vllm:e2e_request_latency_seconds_bucket{{le="{i}",model_name="m"}} 1.0' for i in range(5)],
        "# TYPE vllm:prefix_cache_queries counter",
        'vllm:prefix_cache_queries_total{model_name="m#1"} 10',  # line 9: a '#' inside a value
        "",
        'vllm:prefix_cache_queries_total{model_name="m"} x',  # line 11: a bad value
        "#vllm:prefix_cache_hits_total{model_name=\"m\"} 99",  # a comment, not a sample
        "# TYPE vllm:unknown_family gauge",
        'vllm:unknown_family{model_name="m"} 1',
        'vllm:prefix_cache_hits_total{model_name="m"} y',  # line 15: misplaced in a skipped family, still read
        'vllm:prefix_cache_hits_total{model_name="m#1"} 4',
    ]
    text = "\n".join(lines) + "\n"
    for body in (text, text.replace("\n", "\r\n"), text.rstrip("\n")):
        snap = parse(body)
        assert [w.split(":")[0] for w in snap.warnings] == ["line 11", "line 15"], body[-20:]
        (s,) = snap.series
        assert (s.model_name, s.prefix_cache.queries, s.prefix_cache.hits) == ("m#1", 10.0, 4.0)


# --- the scrape cache (memo) a poller keeps per target -----------------------------------
def same(a, b) -> bool:
    """Equal snapshots, NaN too (a NaN equals nothing, so == would call a body unlike itself)."""
    return repr(a) == repr(b)


def _recorded_bodies() -> list[tuple[str, str]]:
    folders = (UPSTREAM, FIXTURES / "engine-metrics", EDGE)
    return [(p.name, read(p)) for folder in folders for p in sorted(folder.glob("*.txt"))]


def test_a_memo_gives_the_same_snapshot_for_every_recorded_body_first_and_again():
    bodies = _recorded_bodies()
    assert len(bodies) >= 15
    for name, text in bodies:
        memo: dict = {}
        plain = parse(text)
        assert same(parse(text, memo=memo), plain), name  # filling the memo
        assert same(parse(text, memo=memo), plain), name  # every labelled series taken from it
    shared: dict = {}  # one memo across every engine's body, as a target that changed engine
    for _ in range(2):
        for name, text in bodies:
            assert same(parse(text, memo=shared), parse(text)), name


def test_a_memo_follows_bodies_whose_labels_and_values_change():
    replica = simulator.Replica("r", simulator.Scenario(request_rate=2.0), start=-900.0, seed=3, generation="current",
                                model_names=["a/m1", "b/m2"], engines=2)
    memo: dict = {}
    for i in range(1, 30):
        replica.advance(i * 5.0)
        text = replica.render()
        if i % 3 == 0:  # labels that change: a model renamed, an engine gone, a label added, a malformed one
            text = text.replace('model_name="a/m1"', f'model_name="a/m1-{i}"').replace('engine="1"', f'engine="1",pod="p{i}"')
        if i % 7 == 0:
            text = text.replace('model_name="b/m2"', 'model_name="b/m2",model_name="x"', 1)
        assert same(parse(text, memo=memo), parse(text)), i


def test_a_memo_stays_within_a_few_times_what_the_last_body_sent():
    memo: dict = {}
    for i in range(200):  # every body a new model name: nothing of the last one comes back
        text = "".join(f'vllm:prefix_cache_queries_total{{model_name="m{i}-{j}"}} {j}\n' for j in range(10))
        snap = parse(text, memo=memo)
        assert [s.prefix_cache.queries for s in snap.series] == [float(j) for j in range(10)]
        assert len(memo) <= MEMO_SLACK * 10 + MEMO_FLOOR
    big = "".join(f'vllm:prefix_cache_queries_total{{model_name="n{j}"}} 1\n' for j in range(1000))
    parse(big, memo=memo)
    assert len(memo) >= 1000  # a large body keeps its own series
    parse('vllm:prefix_cache_queries_total{model_name="n1"} 1\n', memo=memo)
    assert len(memo) <= MEMO_SLACK + MEMO_FLOOR  # and lets them go once the body is small


def test_a_memo_keeps_no_line_over_the_label_bound():
    """Four 1.9 MB model names made our /metrics 144 MB: a memo must not hold such lines."""
    memo: dict = {}
    long_name = "m" * (MAX_LABEL_VALUE + 1)
    text = (f'vllm:prefix_cache_queries_total{{model_name="{long_name}"}} 5\n'
            'vllm:prefix_cache_queries_total{model_name="ok"} 5\nvllm:prefix_cache_hits_total{model_name="ok"} 1\n')
    for _ in range(2):
        assert same(parse(text, memo=memo), parse(text))
    assert sorted(memo) == ['vllm:prefix_cache_hits_total{model_name="ok"}', 'vllm:prefix_cache_queries_total{model_name="ok"}']


def test_a_malformed_line_of_a_series_in_the_memo_is_still_refused():
    memo: dict = {}
    good = 'vllm:prefix_cache_queries_total{model_name="m"} 5\nvllm:prefix_cache_hits_total{model_name="m"} 1\n'
    parse(good, memo=memo)
    bad = 'vllm:prefix_cache_queries_total{model_name="m"} 5 6 7\nvllm:prefix_cache_hits_total{model_name="m"}\n'
    assert same(parse(bad, memo=memo), parse(bad))
    assert len(parse(bad, memo=memo).warnings) == 2


def _held_apart(text: str) -> list[tuple[str, dict[str, str], str, bool]]:
    """A body's samples as a source holds them (prometheus_client's reading, not ours)."""
    from prometheus_client.parser import text_string_to_metric_families
    from exporter.parse.names import ROLE_BY_NAME
    from exporter.parse.vllm_metrics import long_labels
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in ROLE_BY_NAME:
                out.append((s.name, dict(s.labels), repr(float(s.value)), long_labels(s.labels)))
    return out


def _plan_of(samples):
    from exporter.parse.vllm_metrics import SamplePlan
    names, labels, _, longs = zip(*samples)
    return SamplePlan(names, labels, longs)


def test_a_plan_files_every_recorded_bodys_samples_as_the_loop_does():
    """The plan (what a structure of samples is filed as, made once for a pod's series)
    gives the loop's snapshot for every recorded body, at any series limit; a current
    vLLM's series are filed by it, not by the loop."""
    from exporter.parse.vllm_metrics import parse_samples
    planned = 0
    for name, text in _recorded_bodies():
        try:
            samples = _held_apart(text)
        except ValueError:
            continue  # a body prometheus_client refuses (garbage, truncated)
        if not samples:
            continue
        plan = _plan_of(samples)
        planned += plan.filed_as is not None
        for limit in (0, 1, 2):
            assert same(parse_samples(samples, limit, plan), parse_samples(samples, limit)), (name, limit)
    assert planned >= 5
    replica = simulator.Replica("r", simulator.Scenario(request_rate=2.0), start=-900.0, seed=3, generation="current")
    replica.advance(0.0)
    assert _plan_of(_held_apart(replica.render())).filed_as is not None



@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_plan_files_any_values_as_the_loop_does(data):
    """Values a counter must not have, times that are none, texts that are no number, a
    sample the structure does not fit (another label dict, a name changed): the planned
    snapshot is the loop's, warnings and refusals included."""
    from exporter.parse.vllm_metrics import parse_samples
    replica = simulator.Replica("r", simulator.Scenario(request_rate=2.0), start=-900.0, seed=3, generation="current",
                                model_names=["a", "b"])
    replica.advance(0.0)
    samples = _held_apart(replica.render())
    plan = _plan_of(samples)
    values = st.sampled_from(["1", "0", "-1", "-0.0", "NaN", "+Inf", "-Inf", "x", "1e308", "7.5", ""])
    changed = data.draw(st.lists(st.tuples(st.integers(0, len(samples) - 1), values), max_size=4))
    for i, value in changed:
        name, labels, _, long = samples[i]
        samples[i] = (name, labels, value, long)
    if data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(samples) - 1))
        name, labels, value, long = samples[i]
        samples[i] = (name, dict(labels, model_name="other"), value, long)
    assert same(parse_samples(samples, 0, plan), parse_samples(samples))
