"""Our window math against a real Prometheus, on the same samples.

Prometheus scrapes a simulated vLLM; we read back the raw samples of the 1m range,
feed them through our History/window code, and compare with PromQL's own
`increase(hits[1m]) / increase(queries[1m])` and
`histogram_quantile(0.99, rate(bucket[1m]))`.

Why exact equality holds although PromQL extrapolates and we do not: hits and queries
(and all TTFT buckets) come from one scrape, so they share sample times, and PromQL
scales each by the same factor, which cancels in a ratio and in a quantile. The one
exception is PromQL's clamp of the extrapolation at a counter's zero point, which
applies only when a counter's first sample in the range is small against its increase:
the test checks that this does not happen (a warm replica) rather than loosening the
tolerance.
"""
import math
import time

import pytest

from exporter.parse.snapshot import CounterPair, Histogram, SeriesSnapshot, Snapshot
from exporter.series.history import History
from exporter.series.window import window_stats


POD = '{pod="vllm-0"}'
HITS = "vllm:prefix_cache_hits_total" + POD
QUERIES = "vllm:prefix_cache_queries_total" + POD
BUCKET = "vllm:time_to_first_token_seconds_bucket" + POD

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scraped(prometheus_fleet):
    prom = prometheus_fleet.prometheus
    return prom, time.time()


def snapshots_from(prom, at):
    """Rebuild the scraped snapshots, one per sample time, from Prometheus' raw samples."""
    by_t = {}

    def put(t, key, value):
        by_t.setdefault(float(t), {})[key] = float(value)

    for name, key in ((HITS, "hits"), (QUERIES, "queries")):
        (series,) = prom.range_samples(name, "1m", at)
        for t, v in series["values"]:
            put(t, key, v)
    for series in prom.range_samples(BUCKET, "1m", at):
        le = float(series["metric"]["le"])
        for t, v in series["values"]:
            put(t, ("le", le), v)
    out = []
    for t, values in sorted(by_t.items()):
        buckets = tuple(sorted((k[1], v) for k, v in values.items() if isinstance(k, tuple)))
        s = SeriesSnapshot("demo/llama-3-8b", "0", CounterPair(values["queries"], values["hits"], "tokens"), None,
                           Histogram(buckets, buckets[-1][1], None), None, None, None)
        out.append((t, Snapshot(True, 16, (s,), ())))
    return out


def assert_no_zero_clamp(prom, at):
    for series in prom.range_samples(BUCKET, "1m", at) + prom.range_samples(HITS, "1m", at) + prom.range_samples(QUERIES, "1m", at):
        first, last = float(series["values"][0][1]), float(series["values"][-1][1])
        increase = last - first
        assert increase == 0 or first >= increase, f"zero-point clamp would apply to {series['metric']}"


@pytest.mark.parametrize("offset", [pytest.param(0, id="healthy-window"), pytest.param(-1, id="latest-window")])
def test_hit_ratio_and_ttft_p99_equal_promql_on_the_same_samples(scraped, offset):
    prom, now = scraped
    # one window early in the run, while healthy, and the latest one, after the deploy
    at = (now - 60) if offset == 0 else (now - 1)
    assert_no_zero_clamp(prom, at)
    history = History(keep_seconds=3600)
    snaps = snapshots_from(prom, at)
    assert len(snaps) >= 20
    for t, snap in snaps:
        history.append(t, snap)
    ours = window_stats(history.samples(), "demo/llama-3-8b", at, "1m", 3600, min_query_tokens=1)

    (ratio,) = prom.query(f"increase({HITS}[1m]) / increase({QUERIES}[1m])", at)
    (p99,) = prom.query(f"histogram_quantile(0.99, rate({BUCKET}[1m]))", at)
    theirs_ratio, theirs_p99 = float(ratio["value"][1]), float(p99["value"][1])
    assert math.isfinite(theirs_ratio) and math.isfinite(theirs_p99)
    assert ours.hit_ratio == pytest.approx(theirs_ratio, rel=1e-9)
    assert ours.ttft_quantiles[0.99] == pytest.approx(theirs_p99, rel=1e-9)
