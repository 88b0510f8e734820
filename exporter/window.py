"""Window math over one target's scrape history: pure functions of samples and `now`.

Semantics follow PromQL so that our numbers can be checked against a real Prometheus:
a decrease in a counter is a reset and the new value is the increase since it
(`increase()` without extrapolation); quantiles are `histogram_quantile()`'s.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

from .vllm_metrics import Histogram, Snapshot

QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class SeriesSample:
    """The counters of one (model_name, engine) series at one scrape."""

    queries: float | None
    hits: float | None
    unit: str | None
    external_queries: float | None
    external_hits: float | None
    ttft_bounds: tuple[float, ...] | None
    ttft_buckets: tuple[float, ...] | None
    ttft_sum: float | None
    ttft_count: float | None
    prompt_tokens: float | None
    preemptions: float | None
    kv_cache_usage: float | None


@dataclass(frozen=True)
class TargetSample:
    t: float
    series: dict[tuple[str, str | None], SeriesSample]


def sample_from_snapshot(t: float, snap: Snapshot) -> TargetSample:
    out = {}
    for s in snap.series:
        pc, ext, h = s.prefix_cache, s.external_prefix_cache, s.ttft
        complete_ttft = h is not None and h.buckets and math.isinf(h.buckets[-1][0])
        out[s.key] = SeriesSample(
            queries=pc.queries if pc else None,
            hits=pc.hits if pc else None,
            unit=pc.unit if pc else None,
            external_queries=ext.queries if ext else None,
            external_hits=ext.hits if ext else None,
            ttft_bounds=h.bounds if complete_ttft else None,
            ttft_buckets=tuple(c for _, c in h.buckets) if complete_ttft else None,
            ttft_sum=h.sum if h else None,
            ttft_count=h.count if h else None,
            prompt_tokens=s.prompt_tokens,
            preemptions=s.preemptions,
            kv_cache_usage=s.kv_cache_usage,
        )
    return TargetSample(t=t, series=out)


class History:
    """A target's samples, kept only as far back as the longest window needs.

    Not thread-safe: the poller owns one per target and appends from its job only."""

    def __init__(self, keep_seconds: float) -> None:
        self.keep_seconds = keep_seconds
        self._samples: deque[TargetSample] = deque()

    def append(self, sample: TargetSample) -> None:
        if self._samples and sample.t <= self._samples[-1].t:
            return  # out-of-order or duplicate time: the earlier sample stands
        self._samples.append(sample)
        horizon = sample.t - self.keep_seconds
        # keep one sample at or before the horizon so a full window has a left edge
        while len(self._samples) > 2 and self._samples[1].t <= horizon:
            self._samples.popleft()

    def samples(self) -> tuple[TargetSample, ...]:
        return tuple(self._samples)

    def __len__(self) -> int:
        return len(self._samples)


# --- PromQL building blocks ------------------------------------------------------------
def counter_increase(values: Sequence[float]) -> float | None:
    """increase() without extrapolation: last - first, plus the value before each reset."""
    if len(values) < 2:
        return None
    total = values[-1] - values[0]
    prev = values[0]
    for v in values[1:]:
        if v < prev:
            total += prev
        prev = v
    return total


def interval_delta(prev: float, cur: float) -> float:
    return cur if cur < prev else cur - prev


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile over (upper bound, cumulative count) pairs."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda b: b[0])
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return math.nan
    ordered = _coalesce(ordered)
    ordered = _monotonic(ordered)
    if len(ordered) < 2:
        return math.nan
    observations = ordered[-1][1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    b = next(i for i, (_, c) in enumerate(ordered) if c >= rank)
    if b == len(ordered) - 1:
        return ordered[-2][0]
    if b == 0 and ordered[0][0] <= 0:
        return ordered[0][0]
    start, end, count = 0.0, ordered[b][0], ordered[b][1]
    if b > 0:
        start = ordered[b - 1][0]
        count -= ordered[b - 1][1]
        rank -= ordered[b - 1][1]
    return start + (end - start) * (rank / count)


def _coalesce(ordered: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for le, c in ordered:
        if out and out[-1][0] == le:
            out[-1] = (le, out[-1][1] + c)
        else:
            out.append((le, c))
    return out


def _monotonic(ordered: list[tuple[float, float]]) -> list[tuple[float, float]]:
    # Buckets scraped non-atomically can dip; PromQL lifts each to the running maximum.
    out = [ordered[0]]
    top = ordered[0][1]
    for le, c in ordered[1:]:
        if c > top:
            top = c
        elif c < top:
            c = top
        out.append((le, c))
    return out


def pearson(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """(r, slope of y on x), or None with fewer than three points or no spread."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    if sxx <= 0 or syy <= 0:
        return None
    return sxy / math.sqrt(sxx * syy), sxy / sxx


# --- the summary of one window ---------------------------------------------------------
@dataclass(frozen=True)
class WindowStats:
    """Derived values of one (model_name, window); None where there is too little data."""

    window: str
    seconds: float
    query_increase: float | None
    hit_increase: float | None
    unit: str | None
    hit_ratio: float | None
    query_rate: float | None
    hit_rate: float | None
    external_hit_ratio: float | None
    ttft_quantiles: dict[float, float]
    ttft_mean: float | None
    ttft_count_increase: float | None
    correlation: float | None
    ttft_per_10_points: float | None
    prompt_token_increase: float | None
    preemption_increase: float | None
    kv_cache_usage_max: float | None
    samples: int


def _within(samples: Sequence[TargetSample], now: float, seconds: float) -> list[TargetSample]:
    # (now - seconds, now], as PromQL range selectors since Prometheus 3.0
    return [s for s in samples if now - seconds < s.t <= now]


def _series_values(samples: Iterable[TargetSample], key, attr: str) -> list[float]:
    out = []
    for s in samples:
        ser = s.series.get(key)
        if ser is None:
            continue
        v = getattr(ser, attr)
        if v is not None:
            out.append(v)
    return out


def _sum_increase(samples: Sequence[TargetSample], keys, attr: str) -> float | None:
    total, seen = 0.0, False
    for key in keys:
        inc = counter_increase(_series_values(samples, key, attr))
        if inc is not None:
            total += inc
            seen = True
    return total if seen else None


def _ttft_bucket_increase(samples: Sequence[TargetSample], keys) -> list[tuple[float, float]] | None:
    """Per-bucket increase summed over engines. A series whose bucket layout changed in
    the window (a restart with other buckets) contributes only its latest layout."""
    summed: dict[float, float] = {}
    seen = False
    for key in keys:
        rows = [(s.series[key].ttft_bounds, s.series[key].ttft_buckets) for s in samples
                if key in s.series and s.series[key].ttft_bounds is not None]
        if len(rows) < 2:
            continue
        bounds = rows[-1][0]
        run = []
        for b, counts in reversed(rows):
            if b != bounds:
                break
            run.append(counts)
        run.reverse()
        if len(run) < 2:
            continue
        for i, le in enumerate(bounds):
            inc = counter_increase([c[i] for c in run])
            summed[le] = summed.get(le, 0.0) + (inc or 0.0)
        seen = True
    return sorted(summed.items()) if seen else None


def _intervals(samples: Sequence[TargetSample], keys) -> tuple[list[float], list[float]]:
    """Per scrape interval: (hit ratio, mean TTFT), where both are defined."""
    ratios, ttfts = [], []
    for prev, cur in zip(samples, samples[1:]):
        dq = dh = ds = dc = 0.0
        for key in keys:
            a, b = prev.series.get(key), cur.series.get(key)
            if a is None or b is None:
                continue
            if None not in (a.queries, b.queries, a.hits, b.hits):
                dq += interval_delta(a.queries, b.queries)
                dh += interval_delta(a.hits, b.hits)
            if None not in (a.ttft_sum, b.ttft_sum, a.ttft_count, b.ttft_count):
                ds += interval_delta(a.ttft_sum, b.ttft_sum)
                dc += interval_delta(a.ttft_count, b.ttft_count)
        if dq > 0 and dc > 0:
            ratios.append(dh / dq)
            ttfts.append(ds / dc)
    return ratios, ttfts


def window_stats(
    samples: Sequence[TargetSample],
    model_name: str,
    now: float,
    window: str,
    seconds: float,
    min_query_tokens: float,
    block_size: int | None = None,
) -> WindowStats:
    inside = _within(samples, now, seconds)
    keys = sorted({k for s in inside for k in s.series if k[0] == model_name}, key=lambda k: k[1] or "")
    units = {s.series[k].unit for s in inside for k in keys if s.series[k].unit is not None}
    unit = units.pop() if len(units) == 1 else None
    queries = _sum_increase(inside, keys, "queries")
    hits = _sum_increase(inside, keys, "hits")
    span = inside[-1].t - inside[0].t if len(inside) >= 2 else 0.0
    # the floor is in tokens; a 0.8.x target counts blocks
    query_tokens = None if queries is None else queries * ((block_size or 16) if unit == "blocks" else 1)
    hit_ratio = None
    if queries is not None and hits is not None and query_tokens is not None and query_tokens >= max(min_query_tokens, 1e-12) and unit is not None:
        hit_ratio = hits / queries
    ext_q = _sum_increase(inside, keys, "external_queries")
    ext_h = _sum_increase(inside, keys, "external_hits")
    buckets = _ttft_bucket_increase(inside, keys)
    quantiles = {}
    if buckets is not None:
        for q in QUANTILES:
            value = histogram_quantile(q, buckets)
            if not math.isnan(value):
                quantiles[q] = value
    ttft_sum = _sum_increase(inside, keys, "ttft_sum")
    ttft_count = _sum_increase(inside, keys, "ttft_count")
    ratios, ttfts = _intervals(inside, keys)
    fit = pearson(ratios, ttfts)
    kv = [v for k in keys for v in _series_values(inside, k, "kv_cache_usage")]
    return WindowStats(
        window=window,
        seconds=seconds,
        query_increase=queries,
        hit_increase=hits,
        unit=unit,
        hit_ratio=hit_ratio,
        query_rate=queries / span if queries is not None and span > 0 else None,
        hit_rate=hits / span if hits is not None and span > 0 else None,
        external_hit_ratio=ext_h / ext_q if ext_q and ext_h is not None else None,
        ttft_quantiles=quantiles,
        ttft_mean=ttft_sum / ttft_count if ttft_sum is not None and ttft_count else None,
        ttft_count_increase=ttft_count,
        correlation=fit[0] if fit else None,
        ttft_per_10_points=fit[1] * 0.1 if fit else None,
        prompt_token_increase=_sum_increase(inside, keys, "prompt_tokens"),
        preemption_increase=_sum_increase(inside, keys, "preemptions"),
        kv_cache_usage_max=max(kv) if kv else None,
        samples=len(inside),
    )


def summarize(
    samples: Sequence[TargetSample],
    now: float,
    windows: Sequence[tuple[str, float]],
    min_query_tokens: float,
    block_size: int | None = None,
) -> dict[str, dict[str, WindowStats]]:
    """model_name -> window name -> WindowStats, for every model seen in the history."""
    models = sorted({k[0] for s in samples for k in s.series})
    return {
        m: {name: window_stats(samples, m, now, name, secs, min_query_tokens, block_size) for name, secs in windows}
        for m in models
    }
