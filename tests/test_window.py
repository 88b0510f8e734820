import math
import statistics

import pytest
from hypothesis import given, settings, strategies as st

from exporter.parse.snapshot import CounterPair, Histogram, SeriesSnapshot, Snapshot
from exporter.series.history import History
from exporter.series.modellog import least_squares_fit
from exporter.series.promql import histogram_quantile, histogram_quantiles
from exporter.series.window import summarize, window_stats

INF = math.inf


def snap(queries=None, hits=None, buckets=None, ttft_sum=None, engine="0", model="m", unit="tokens", kv=None, extra=()):
    series = [SeriesSnapshot(
        model_name=model, engine=engine,
        prefix_cache=CounterPair(queries, hits, unit) if queries is not None or hits is not None else None,
        external_prefix_cache=None,
        ttft=Histogram(tuple(buckets), buckets[-1][1], ttft_sum) if buckets else None,
        kv_cache_usage=kv, preemptions=None, prompt_tokens=None,
    )] + list(extra)
    return Snapshot(prefix_caching_enabled=True, block_size=16, series=tuple(series), warnings=())


@pytest.mark.parametrize("values, expected", [
    pytest.param([], None, id="no-samples"),
    pytest.param([5.0], None, id="single-sample"),
    pytest.param([1.0, 4.0, 9.0], 8.0, id="monotonic"),
    pytest.param([10.0, 20.0, 5.0, 8.0], 18.0, id="one-reset-new-value-is-the-increase"),
    pytest.param([10.0, 2.0, 1.0, 3.0], 5.0, id="two-resets"),
    pytest.param([10.0, 10.0, 10.0], 0.0, id="flat"),
    pytest.param([7.0, 0.0], 0.0, id="reset-to-zero"),
])
def test_increase_matches_promql_reset_handling(values, expected):
    h = History(3600.0)
    for i, v in enumerate(values):
        h.append(i * 10.0, snap(v, v))
    ws = window_stats(h.samples(), "m", 100.0, "1m", 3600.0, min_query_tokens=0)
    assert ws.query_increase == expected and ws.hit_increase == expected


@pytest.mark.parametrize("q, buckets, expected", [
    pytest.param(0.5, [(1.0, 10.0), (2.0, 20.0), (INF, 20.0)], 1.0, id="interpolate-at-edge"),
    pytest.param(0.25, [(1.0, 10.0), (2.0, 20.0), (INF, 20.0)], 0.5, id="lowest-bucket-starts-at-zero"),
    pytest.param(0.75, [(1.0, 10.0), (2.0, 20.0), (INF, 20.0)], 1.5, id="linear-inside-bucket"),
    pytest.param(0.99, [(1.0, 10.0), (2.0, 10.0), (INF, 20.0)], 2.0, id="in-inf-bucket-returns-highest-finite"),
    pytest.param(0.5, [(1.0, 0.0), (INF, 0.0)], math.nan, id="no-observations-nan"),
    pytest.param(0.5, [(1.0, 3.0), (2.0, 4.0)], math.nan, id="no-inf-bucket-nan"),
    pytest.param(0.5, [(INF, 4.0)], math.nan, id="single-bucket-nan"),
    pytest.param(-0.1, [(1.0, 3.0), (INF, 4.0)], -INF, id="q-below-zero"),
    pytest.param(1.1, [(1.0, 3.0), (INF, 4.0)], INF, id="q-above-one"),
    pytest.param(0.5, [(-1.0, 3.0), (0.0, 4.0), (INF, 4.0)], -1.0, id="first-bucket-non-positive"),
    pytest.param(0.5, [(2.0, 20.0), (1.0, 10.0), (INF, 20.0)], 1.0, id="unsorted-input"),
    pytest.param(0.75, [(1.0, 10.0), (2.0, 8.0), (3.0, 20.0), (INF, 20.0)], 2.5, id="non-monotonic-lifted"),
    pytest.param(0.5, [(1.0, 5.0), (1.0, 5.0), (2.0, 20.0), (INF, 20.0)], 1.0, id="duplicate-bounds-coalesce"),
    # no count reaches the rank: PromQL's search ends on the +Inf bucket (this raised StopIteration)
    pytest.param(0.0, [(1.0, INF), (2.0, INF), (INF, INF)], 2.0, id="nan-rank-ends-on-the-inf-bucket"),
    pytest.param(0.5, [(1.0, -5.0), (INF, -2.0)], 1.0, id="counts-below-zero-end-on-the-inf-bucket"),
])
def test_histogram_quantile_edge_cases(q, buckets, expected):
    got = histogram_quantile(q, buckets)
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(expected)


def _promql_walk(q: float, buckets) -> float:
    """histogram_quantile as PromQL's bucketQuantile reads it, step by step: sort by bound,
    merge equal bounds, lift each count to the running maximum, walk to the first bucket
    whose count reaches the rank, interpolate in it."""
    if math.isnan(q):
        return math.nan
    if q < 0 or q > 1:
        return -INF if q < 0 else INF
    ordered = sorted(buckets, key=lambda b: b[0])
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return math.nan
    merged = []
    for le, c in ordered:
        merged[-1:] = [(le, merged[-1][1] + c)] if merged and merged[-1][0] == le else merged[-1:] + [(le, c)]
    lifted, top = [], merged[0][1]
    for le, c in merged:
        top = c if c > top else top
        lifted.append((le, top if c < top else c))
    if len(lifted) < 2 or lifted[-1][1] == 0 or math.isnan(lifted[-1][1]):
        return math.nan
    rank = q * lifted[-1][1]
    b = next((i for i, (_, c) in enumerate(lifted) if c >= rank), len(lifted) - 1)
    if b == len(lifted) - 1:
        return lifted[-2][0]
    if b == 0 and lifted[0][0] <= 0:
        return lifted[0][0]
    start, count = (lifted[b - 1][0], lifted[b][1] - lifted[b - 1][1]) if b else (0.0, lifted[0][1])
    rank -= lifted[b - 1][1] if b else 0.0
    return math.nan if count == 0 else start + (lifted[b][0] - start) * (rank / count)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([-1.0, -0.0, 0.0, 0.1, 0.5, 1.0, 2.5, 10.0, INF, math.nan]),
                          st.sampled_from([0.0, -0.0, 1.0, 2.0, 3.5, 10.0, 100.0, math.nan])), max_size=10),
       st.booleans())
def test_histogram_quantiles_are_promqls_walk_whatever_the_buckets(buckets, with_inf):
    """The quantiles of one histogram, found by bisection where no count is NaN, are the
    bucket walk's: unsorted, repeated, dipping buckets, NaN and signed zeros included."""
    buckets = buckets + [(INF, 5.0)] if with_inf else buckets
    qs = (0.0, 0.25, 0.5, 0.9, 0.99, 1.0, -0.5, 1.5)
    for q, got in zip(qs, histogram_quantiles(qs, buckets)):
        assert repr(got) == repr(_promql_walk(q, buckets)), (q, buckets)


def fit(xs, ys):
    return least_squares_fit(len(xs), sum(xs), sum(ys), sum(x * y for x, y in zip(xs, ys)), sum(x * x for x in xs),
                             sum(y * y for y in ys))


def test_the_running_sums_fit_matches_the_standard_librarys_correlation_and_slope():
    xs, ys = [0.9, 0.8, 0.5, 0.1], [0.1, 0.12, 0.2, 0.3]
    r, slope = fit(xs, ys)
    assert r == pytest.approx(statistics.correlation(xs, ys))
    assert slope == pytest.approx(statistics.linear_regression(xs, ys).slope)
    assert fit([1, 2], [3, 4]) is None
    assert fit([1, 1, 1], [1, 2, 3]) is None


def history_of(points, keep=3600.0):
    h = History(keep)
    for t, s in points:
        h.append(t, s)
    return h


def test_hit_ratio_over_a_window_with_a_reset():
    h = history_of([(0, snap(1000, 800)), (10, snap(2000, 1700)), (20, snap(500, 400)), (30, snap(1500, 1300))])
    ws = window_stats(h.samples(), "m", 30, "1m", 60, min_query_tokens=100)
    # increases: queries 1000 + 500 + 1000, hits 900 + 400 + 900
    assert ws.query_increase == 2500 and ws.hit_increase == 2200
    assert ws.hit_ratio == pytest.approx(2200 / 2500)
    assert ws.query_rate == pytest.approx(2500 / 30)


def test_a_reset_before_a_new_series_appears_keeps_its_offset_across_the_layout_change():
    """Reset offsets are per slot: a new model (a new layout) must neither drop the offset
    of a reset counter nor invent one where there was no reset."""
    other = snap(100, 50, model="n").series[0]
    h = history_of([(0, snap(1000, 800)), (10, snap(2000, 1700)), (20, snap(500, 400)),
                    (30, snap(1500, 1300, extra=[other])), (40, snap(2500, 2200, extra=[snap(300, 250, model="n").series[0]]))])
    ws = window_stats(h.samples(), "m", 40, "1m", 60, min_query_tokens=100)
    assert (ws.query_increase, ws.hit_increase) == (3500, 3100)  # 1000 + 500 + 1000 + 1000; 900 + 400 + 900 + 900
    ws = window_stats(h.samples(), "n", 40, "1m", 60, min_query_tokens=100)
    assert (ws.query_increase, ws.hit_increase) == (200, 200)


@pytest.mark.parametrize("points, min_tokens", [
    pytest.param([(0, snap(1000, 800))], 1, id="single-sample"),
    pytest.param([(0, snap(1000, 800)), (10, snap(1000, 800))], 1, id="zero-queries"),
    pytest.param([(0, snap(1000, 800)), (10, snap(1050, 840))], 100, id="under-token-minimum"),
    pytest.param([(0, snap(1000, None)), (10, snap(3000, None))], 1, id="hits-missing"),
])
def test_hit_ratio_absent_not_zero_or_nan(points, min_tokens):
    h = history_of(points)
    ws = window_stats(h.samples(), "m", points[-1][0], "1m", 60, min_query_tokens=min_tokens)
    assert ws.hit_ratio is None


def test_window_edges_are_left_open_and_gaps_shrink_the_window():
    points = [(t, snap(1000.0 * t, 500.0 * t)) for t in (0, 10, 20, 30)] + [(120, snap(120000.0, 60000.0)), (130, snap(130000.0, 65000.0))]
    h = history_of(points)
    ws = window_stats(h.samples(), "m", 130, "1m", 60, min_query_tokens=1)
    assert ws.samples == 2 and ws.query_increase == 10000.0
    ws = window_stats(h.samples(), "m", 70, "1m", 60, min_query_tokens=1)
    assert ws.samples == 2  # t=20 and t=30; t=10 sits on the open left edge
    assert ws.query_increase == 10000.0


def test_blocks_unit_floor_counts_tokens():
    h = history_of([(0, snap(0, 0, unit="blocks")), (10, snap(10, 5, unit="blocks"))])
    assert window_stats(h.samples(), "m", 10, "1m", 60, min_query_tokens=100, block_size=16).hit_ratio == 0.5
    assert window_stats(h.samples(), "m", 10, "1m", 60, min_query_tokens=200, block_size=16).hit_ratio is None


def test_engines_are_summed_before_dividing():
    def two(q0, h0, q1, h1):
        base = snap(q0, h0, engine="0")
        other = snap(q1, h1, engine="1").series[0]
        return Snapshot(True, 16, base.series + (other,), ())
    h = history_of([(0, two(0, 0, 0, 0)), (10, two(1000, 900, 100, 0))])
    ws = window_stats(h.samples(), "m", 10, "1m", 60, min_query_tokens=1)
    assert ws.hit_ratio == pytest.approx(900 / 1100)


def test_ttft_quantiles_from_bucket_increase_and_mean():
    b0 = [(0.1, 10.0), (0.5, 10.0), (INF, 10.0)]
    b1 = [(0.1, 20.0), (0.5, 30.0), (INF, 30.0)]
    h = history_of([(0, snap(0, 0, b0, 1.0)), (10, snap(100, 50, b1, 5.0))])
    ws = window_stats(h.samples(), "m", 10, "1m", 60, min_query_tokens=1)
    # increase: 10 in (0, 0.1], 10 in (0.1, 0.5]
    assert ws.ttft_quantiles[0.5] == pytest.approx(0.1)
    assert ws.ttft_quantiles[0.99] == pytest.approx(0.1 + 0.4 * 0.98)
    assert ws.ttft_mean == pytest.approx(4.0 / 20)


def test_ttft_bucket_layout_change_uses_the_latest_layout_only():
    old = [(0.1, 10.0), (INF, 10.0)]
    new0 = [(0.2, 0.0), (1.0, 0.0), (INF, 0.0)]
    new1 = [(0.2, 4.0), (1.0, 8.0), (INF, 8.0)]
    h = history_of([(0, snap(0, 0, old, 1.0)), (5, snap(10, 5, new0, 0.0)), (10, snap(20, 10, new1, 3.0))])
    ws = window_stats(h.samples(), "m", 10, "1m", 60, min_query_tokens=1)
    assert ws.ttft_quantiles[0.5] == pytest.approx(0.2)


def test_correlation_of_hit_ratio_and_ttft_per_interval():
    points, q, hits, count, total = [], 0.0, 0.0, 0.0, 0.0
    buckets = lambda c: [(1.0, c), (INF, c)]
    for i, ratio in enumerate([0.9, 0.9, 0.8, 0.5, 0.2, 0.1]):
        q += 1000
        hits += 1000 * ratio
        count += 10
        total += 10 * (0.3 - 0.25 * ratio)  # mean TTFT falls 25 ms per 10 points
        points.append((i * 5.0, snap(q, hits, buckets(count), total)))
    h = history_of(points)
    ws = window_stats(h.samples(), "m", 25, "1m", 60, min_query_tokens=1)
    assert ws.correlation == pytest.approx(-1.0)
    assert ws.ttft_per_10_points == pytest.approx(-0.025)


def test_memory_stays_bounded_and_thinning_keeps_increases_exact():
    h = History(keep_seconds=600, fine_seconds=120, coarse_step=60)
    q = 0.0
    for i in range(2000):
        q = q + 100 if i % 300 else 50.0  # a reset every 300 samples
        h.append(i * 5.0, snap(q, q / 2))
    samples = h.samples()
    # one sample at or before the horizon is kept as the left edge: at most a coarse step
    assert samples[-1].t - samples[0].t <= 600 + 60
    assert len(samples) < 120 / 5 + 600 / 60 + 4
    full = History(keep_seconds=600)
    q = 0.0
    for i in range(2000):
        q = q + 100 if i % 300 else 50.0
        full.append(i * 5.0, snap(q, q / 2))
    now = 1999 * 5.0
    for seconds in (60, 300, 590):
        thin = window_stats(samples, "m", now, "w", seconds, 1).query_increase
        dense = window_stats(full.samples(), "m", now, "w", seconds, 1).query_increase
        first_t = next(s.t for s in samples if s.t > now - seconds)
        dense_aligned = window_stats(full.samples(), "m", now, "w", now - first_t + 1e-9, 1).query_increase
        assert thin == dense_aligned
        assert dense >= thin


def test_out_of_order_samples_are_ignored():
    h = history_of([(10, snap(100, 50)), (5, snap(10, 5)), (10, snap(200, 50))])
    assert len(h) == 1


def test_summarize_covers_every_model_and_window():
    other = snap(0, 0, model="n").series[0]
    h = history_of([(0, Snapshot(True, 16, snap(0, 0).series + (other,), ())), (10, snap(100, 50))])
    out = summarize(h.samples(), 10, [("1m", 60), ("5m", 300)], 1)
    assert set(out) == {"m", "n"}
    assert set(out["m"]) == {"1m", "5m"}
    assert out["m"]["1m"].hit_ratio == 0.5
    assert out["n"]["1m"].hit_ratio is None


def test_a_model_that_vanished_drops_out_once_no_window_holds_it():
    h = History(60.0 + 5.0, windows=(10.0, 60.0))
    for i in range(20):
        t = i * 5.0
        other = () if t > 20 else snap(100.0 * t, 50.0 * t, model="gone").series
        h.append(t, Snapshot(True, 16, snap(100.0 * t, 80.0 * t).series + other, ()))
        out = summarize(h.samples(), t, [("10s", 10.0), ("1m", 60.0)], 1)
        assert ("gone" in out) == (t < 20 + 60)  # windows are left-open: (t - 60, t]
    assert set(h.logs) == {"m"}


def test_memory_of_a_target_whose_models_churn_stays_bounded():
    """A target that brings a new model every poll must not grow the history's maps."""
    h = History(60.0 + 5.0, windows=(10.0, 60.0))
    for i in range(400):
        h.append(i * 5.0, Snapshot(True, 16, snap(100.0 * i, 50.0 * i, model=f"m{i}").series, ()))
    assert len(h.logs) <= 14 and len(h.running) == len(h.logs)
    assert len(h._last_raw) <= 14 * 8 and len(h._offset) <= 14 * 8


def test_running_sums_match_a_full_rescan():
    """The O(1)-per-poll correlation and KV maximum equal a scan of the window."""
    h = History(600.0, windows=(60.0, 300.0))
    q = hits = count = total = 0.0
    for i in range(200):
        ratio = 0.5 + 0.4 * math.sin(i / 7.0)
        q += 1000
        hits += 1000 * ratio
        count += 10
        total += 10 * (0.3 - 0.25 * ratio + 0.01 * math.cos(i))
        h.append(i * 5.0, snap(q, hits, [(1.0, count), (INF, count)], total, kv=0.5 + 0.4 * math.cos(i / 3.0)))
    now = 199 * 5.0
    view = h.samples()
    for seconds in (60.0, 300.0):
        fast = window_stats(view, "m", now, "w", seconds, 1)
        view_without_running = type(view)(tuple(view), view.logs, {})
        slow = window_stats(view_without_running, "m", now, "w", seconds, 1)
        assert fast.correlation == pytest.approx(slow.correlation, abs=1e-9)
        assert fast.ttft_per_10_points == pytest.approx(slow.ttft_per_10_points, abs=1e-9)
        assert fast.kv_cache_usage_max == slow.kv_cache_usage_max


@pytest.mark.parametrize("q, buckets", [
    pytest.param(0.0, [(1.0, 0.0), (2.0, 5.0), (INF, 5.0)], id="q0-empty-first-bucket"),
    pytest.param(0.0, [(1.0, 0.0), (INF, 0.0)], id="q0-no-observations"),
])
def test_histogram_quantile_nan_where_prometheus_gives_nan(q, buckets):
    assert math.isnan(histogram_quantile(q, buckets))


def test_a_counter_that_steps_back_a_little_is_held_not_reset():
    """PromQL takes every decrease for a reset; a hits counter one token short would add
    its whole value to the window. Here it is held, counted, and the ratio stays right."""
    h = History(3600.0)
    h.append(0, snap(1e9, 5e8))
    h.append(10, snap(1e9 + 2000, 5e8 + 1000))
    h.append(20, snap(1e9 + 4000, 5e8 + 999))  # a token short of the read before
    assert len(h.steps_back) == 1 and "hits counter stepped back" in h.steps_back[0]
    h.append(30, snap(1e9 + 6000, 5e8 + 3000))
    assert h.steps_back == []
    ws = window_stats(h.samples(), "m", 30, "1m", 60, min_query_tokens=100)
    assert (ws.query_increase, ws.hit_increase) == (6000, 3000) and ws.hit_ratio == 0.5


def test_a_small_decrease_after_a_restart_is_a_reset():
    """A changed process start time makes any decrease a reset, as PromQL would."""
    def started(at, q, hits):
        return replace_start(snap(q, hits), at)
    h = history_of([(0, started(100.0, 1000, 500)), (10, started(100.0, 2000, 1000)), (20, started(15.0, 1900, 950))])
    assert h.steps_back == []
    ws = window_stats(h.samples(), "m", 20, "1m", 60, min_query_tokens=100)
    assert (ws.query_increase, ws.hit_increase) == (1000 + 1900, 500 + 950)


def replace_start(s, at):
    from dataclasses import replace
    return replace(s, process_start_time=at)


def test_hits_above_queries_are_a_ratio_of_one_not_150_percent():
    h = history_of([(0, snap(1000, 0, engine="0")), (10, snap(3000, 3000, engine="0"))])
    h.append(20, snap(5000, 6000, engine="0"))
    for ws in summarize(h.samples(), 20, [("1m", 60.0), ("10s", 10.0)], 100).values():
        for w in ws.values():
            assert w.hit_ratio is None or 0.0 <= w.hit_ratio <= 1.0
    ws = window_stats(h.samples(), "m", 20, "1m", 60, min_query_tokens=100)
    assert ws.hit_ratio == 1.0


def test_a_counter_still_below_a_poll_after_its_step_back_counts_on_from_there():
    """Part of a summed counter reset (a worker of several restarted): held for good, its
    hits stood still until the counter passed its old value again (a 40% step of a day-old
    counter: most of a day of hits counted as none). Held one poll, it counts on."""
    h = History(3600.0)
    h.append(0, snap(1e9, 8e8))
    h.append(10, snap(1e9 + 2000, 8e8 + 1600))
    h.append(20, snap(1e9 + 4000, 0.6 * (8e8 + 3200)))  # 40% of the hits gone
    assert len(h.steps_back) == 1 and "held at" in h.steps_back[0]
    h.append(30, snap(1e9 + 6000, 0.6 * (8e8 + 3200) + 1600))
    assert len(h.steps_back) == 1 and "counts on from there" in h.steps_back[0]
    h.append(40, snap(1e9 + 8000, 0.6 * (8e8 + 3200) + 3200))
    assert h.steps_back == []
    ws = window_stats(h.samples(), "m", 40, "1m", 60, min_query_tokens=100)
    # one interval's hits (the step's) are lost, none counted twice, none negative
    assert ws.query_increase == 8000 and ws.hit_increase == pytest.approx(1600 + 0 + 1600 + 1600)
    ws = window_stats(h.samples(), "m", 40, "20s", 20, min_query_tokens=100)
    assert ws.hit_ratio == pytest.approx(0.8)


def test_the_tiers_an_engine_names_are_windowed_and_the_judged_ratio_counts_every_tier():
    from exporter.series import hitratio

    def tiered(device, host, total):
        s = snap(total, device + host)
        (series,) = s.series
        from dataclasses import replace
        return replace(s, series=(replace(series, cached_tokens_by_tier=(("device", device), ("host", host))),))
    h = history_of([(1, tiered(0, 0, 0)), (30, tiered(3000, 6000, 10000)), (60, tiered(6000, 6000, 20000))])
    ws = window_stats(h.samples(), "m", 60, "1m", 60, min_query_tokens=100)
    assert dict(ws.tier_increases) == {"device": 6000, "host": 6000}
    assert ws.effective_hit_ratio == pytest.approx(0.6)  # SGLang's pair already counts every tier
    assert hitratio.tier_shares(ws) == pytest.approx({"device": 0.3, "host": 0.3})
    last = window_stats(h.samples(), "m", 60, "31s", 31, min_query_tokens=100)
    assert hitratio.tier_shares(last) == pytest.approx({"device": 0.3, "host": 0.0})  # the host tier stopped


def test_the_windows_of_a_summary_share_a_models_ttft_source_yet_each_has_its_own_quantiles():
    """summarize gives each model one lazy TTFT for all its windows of a layout: each
    window's quantiles are still those of its own span (as window_stats computes them),
    and models never mix."""
    h = History(600.0, windows=(60.0, 300.0))
    counts = {"m": 0.0, "n": 0.0}
    fast_part = {"m": 0.0, "n": 0.0}
    for i in range(60):
        series = []
        for model, slow_after in (("m", 40), ("n", 10)):
            counts[model] += 10
            fast_part[model] += 0.0 if i >= slow_after else 10
            buckets = [(0.1, fast_part[model]), (1.0, counts[model]), (INF, counts[model])]
            series.append(snap(1000.0 * i, 500.0 * i, buckets, 0.5 * counts[model], model=model).series[0])
        h.append(i * 5.0, Snapshot(True, 16, tuple(series), ()))
    now = 59 * 5.0
    out = summarize(h.samples(), now, [("1m", 60.0), ("5m", 300.0)], 1)
    assert out["m"]["1m"].lazy_ttft is out["m"]["5m"].lazy_ttft
    assert out["m"]["1m"].lazy_ttft is not out["n"]["1m"].lazy_ttft
    for model in ("m", "n"):
        for name, seconds in (("1m", 60.0), ("5m", 300.0)):
            alone = window_stats(h.samples(), model, now, name, seconds, 1)
            assert out[model][name].ttft_quantiles == alone.ttft_quantiles
    # m turned slow 95 s ago: its last minute is all slow, its 5 minutes mostly fast
    assert out["m"]["1m"].ttft_quantiles[0.5] > 0.1 >= out["m"]["5m"].ttft_quantiles[0.5]
    assert out["n"]["5m"].ttft_quantiles[0.5] > 0.1


@pytest.mark.parametrize("unit", ["tokens", "blocks"])
def test_a_summarys_windows_equal_window_stats_field_by_field(unit):
    """summarize builds a window's stats in one go from the increases at hand (tiers and
    the judged ratio included); window_stats builds them field by field: they agree."""
    from dataclasses import replace

    def body(i):
        plain = snap(1000.0 * i, 400.0 * i, unit=unit, model="plain").series[0]
        tiered = replace(snap(800.0 * i, 300.0 * i, unit=unit, model="tiered").series[0],
                         cached_tokens_by_tier=(("device", 100.0 * i), ("disk", 50.0 * i)))
        admitted = replace(snap(900.0 * i, 100.0 * i, unit=unit, model="admitted").series[0],
                           external_prefix_cache=CounterPair(800.0 * i, 200.0 * i, "tokens"), prompt_tokens=1000.0 * i,
                           prompt_tokens_by_source=(("local_cache_hit", 150.0 * i), ("external_kv_transfer", 250.0 * i)))
        lookup_external = replace(snap(700.0 * i, 200.0 * i, unit=unit, model="external").series[0],
                                  external_prefix_cache=CounterPair(500.0 * i, 100.0 * i, "tokens"))
        return Snapshot(True, 16, (plain, tiered, admitted, lookup_external), ())
    h = History(600.0, windows=(60.0, 300.0))
    for i in range(1, 40):
        h.append(i * 5.0, body(i))
    now = 39 * 5.0
    windows = [("1m", 60.0), ("5m", 300.0)]
    out = summarize(h.samples(), now, windows, 500)
    for model in ("plain", "tiered", "admitted", "external"):
        for name, seconds in windows:
            alone = window_stats(h.samples(), model, now, name, seconds, 500, block_size=None)
            fast = out[model][name]
            assert fast._asdict() | {"lazy_ttft": None} == alone._asdict() | {"lazy_ttft": None}, (model, name)
    assert out["tiered"]["1m"].tier_increases and out["admitted"]["1m"].effective_hit_ratio is not None
