"""Window math over one target's scrape history: pure functions of samples and `now`.

Semantics follow PromQL so that our numbers can be checked against a real Prometheus:
a decrease in a counter is a reset and the new value is the increase since it
(`increase()` without extrapolation); quantiles are `histogram_quantile()`'s.
"""
from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

from .vllm_metrics import Snapshot

QUANTILES = (0.5, 0.9, 0.99)


# Counters kept per series, in this order in every sample's value array.
COUNTERS = ("queries", "hits", "external_queries", "external_hits", "ttft_sum", "ttft_count", "prompt_tokens", "preemptions")
_GAUGES = ("kv_cache_usage",)
_FIXED = COUNTERS + _GAUGES
NAN = math.nan

SeriesKey = tuple  # (model_name, engine)


@dataclass(frozen=True)
class Layout:
    """Where each series' values sit in a sample's array. Consecutive samples with the
    same series share one Layout object, so a sample costs one float array."""

    keys: tuple[SeriesKey, ...]
    units: tuple[str | None, ...]
    bounds: tuple[tuple[float, ...] | None, ...]
    offsets: tuple[int, ...]
    size: int

    @staticmethod
    def build(keys, units, bounds) -> "Layout":
        offsets, pos = [], 0
        for b in bounds:
            offsets.append(pos)
            pos += len(_FIXED) + (len(b) if b else 0)
        return Layout(tuple(keys), tuple(units), tuple(bounds), tuple(offsets), pos)

    def index(self, key: SeriesKey) -> int | None:
        try:
            return self.keys.index(key)
        except ValueError:
            return None


class TargetSample:
    """One scrape of one target. Counter values are reset-adjusted: each reset adds the
    value seen before it, so `last - first` over any two samples is PromQL's increase()
    without extrapolation, however many samples were thinned out between them."""

    __slots__ = ("t", "layout", "values")

    def __init__(self, t: float, layout: Layout, values: array):
        self.t = t
        self.layout = layout
        self.values = values

    def get(self, key: SeriesKey, name: str) -> float | None:
        i = self.layout.index(key)
        if i is None:
            return None
        v = self.values[self.layout.offsets[i] + _FIXED.index(name)]
        return None if v != v else v

    def buckets(self, key: SeriesKey) -> tuple[tuple[float, ...], list[float]] | None:
        i = self.layout.index(key)
        if i is None or not self.layout.bounds[i]:
            return None
        start = self.layout.offsets[i] + len(_FIXED)
        bounds = self.layout.bounds[i]
        return bounds, list(self.values[start:start + len(bounds)])

    def unit(self, key: SeriesKey) -> str | None:
        i = self.layout.index(key)
        return None if i is None else self.layout.units[i]


def _raw_values(s) -> tuple[list[float], tuple[float, ...] | None, str | None]:
    pc, ext, h = s.prefix_cache, s.external_prefix_cache, s.ttft
    complete = h is not None and bool(h.buckets) and math.isinf(h.buckets[-1][0])
    fixed = [
        pc.queries if pc else None, pc.hits if pc else None,
        ext.queries if ext else None, ext.hits if ext else None,
        h.sum if h else None, h.count if h else None,
        s.prompt_tokens, s.preemptions, s.kv_cache_usage,
    ]
    values = [NAN if v is None else float(v) for v in fixed]
    if complete:
        values.extend(float(c) for _, c in h.buckets)
    return values, (h.bounds if complete else None), (pc.unit if pc else None)


class History:
    """A target's samples, reset-adjusted, kept as far back as the longest window needs.

    Samples newer than `fine_seconds` are all kept; older ones are thinned to one per
    `coarse_step`, which the adjusted counters allow without changing any increase.
    Not thread-safe: the poller owns one per target and appends from its job only."""

    def __init__(self, keep_seconds: float, fine_seconds: float | None = None, coarse_step: float = 60.0):
        self.keep_seconds = keep_seconds
        self.fine_seconds = keep_seconds if fine_seconds is None else min(fine_seconds, keep_seconds)
        self.coarse_step = coarse_step
        self._samples: deque[TargetSample] = deque()
        self._layout: Layout | None = None
        self._last_raw: dict[tuple[SeriesKey, int], float] = {}
        self._offset: dict[tuple[SeriesKey, int], float] = {}

    def append(self, t: float, snapshot: Snapshot) -> TargetSample | None:
        if self._samples and t <= self._samples[-1].t:
            return None  # out-of-order or duplicate time: the earlier sample stands
        keys, units, bounds, rows = [], [], [], []
        for s in snapshot.series:
            values, b, unit = _raw_values(s)
            keys.append(s.key)
            units.append(unit)
            bounds.append(b)
            rows.append(values)
        layout = self._layout
        if layout is None or layout.keys != tuple(keys) or layout.units != tuple(units) or layout.bounds != tuple(bounds):
            layout = self._layout = Layout.build(keys, units, bounds)
        flat = array("d")
        for key, values, b in zip(keys, rows, bounds):
            for j, raw in enumerate(values):
                if j == len(COUNTERS):  # the gauge is taken as it is
                    flat.append(raw)
                    continue
                flat.append(self._adjust((key, j if j < len(_FIXED) else (j, b)), raw))
        sample = TargetSample(t, layout, flat)
        self._samples.append(sample)
        self._prune(t)
        return sample

    def _adjust(self, slot, raw: float) -> float:
        if raw != raw:
            return NAN
        prev = self._last_raw.get(slot)
        offset = self._offset.get(slot, 0.0)
        if prev is not None and raw < prev:
            offset += prev
            self._offset[slot] = offset
        self._last_raw[slot] = raw
        return raw + offset

    def _prune(self, now: float) -> None:
        samples = self._samples
        horizon = now - self.keep_seconds
        # keep one sample at or before the horizon so a full window has a left edge
        while len(samples) > 2 and samples[1].t <= horizon:
            samples.popleft()
        # thin the part older than the fine horizon to one sample per coarse step
        fine = now - self.fine_seconds
        if len(samples) < 3 or samples[1].t > fine:
            return
        kept: list[TargetSample] = []
        while len(samples) > 1 and samples[0].t <= fine:
            s = samples.popleft()
            if not kept or s.t - kept[-1].t >= self.coarse_step or samples[0].t > fine:
                kept.append(s)
        samples.extendleft(reversed(kept))

    def samples(self) -> tuple[TargetSample, ...]:
        return tuple(self._samples)

    def __len__(self) -> int:
        return len(self._samples)


# --- PromQL building blocks ------------------------------------------------------------
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


def _values(samples: Iterable[TargetSample], key: SeriesKey, name: str) -> list[float]:
    out = []
    for s in samples:
        v = s.get(key, name)
        if v is not None:
            out.append(v)
    return out


def _sum_increase(samples: Sequence[TargetSample], keys, name: str) -> float | None:
    """Increase summed over engines; the values are reset-adjusted already."""
    total, seen = 0.0, False
    for key in keys:
        values = _values(samples, key, name)
        if len(values) >= 2:
            total += values[-1] - values[0]
            seen = True
    return total if seen else None


def _ttft_bucket_increase(samples: Sequence[TargetSample], keys) -> list[tuple[float, float]] | None:
    """Per-bucket increase summed over engines. A series whose bucket layout changed in
    the window (a restart with other buckets) contributes only its latest layout."""
    summed: dict[float, float] = {}
    seen = False
    for key in keys:
        rows = [b for b in (s.buckets(key) for s in samples) if b is not None]
        if len(rows) < 2:
            continue
        bounds = rows[-1][0]
        first = len(rows) - 1
        while first > 0 and rows[first - 1][0] == bounds:
            first -= 1
        if first == len(rows) - 1:
            continue
        for le, a, b in zip(bounds, rows[first][1], rows[-1][1]):
            summed[le] = summed.get(le, 0.0) + (b - a)
        seen = True
    return sorted(summed.items()) if seen else None


@dataclass(frozen=True)
class Interval:
    """What happened between two consecutive polls of one model, summed over engines."""

    start: float
    end: float
    query_tokens: float
    hit_tokens: float
    ttft_sum: float
    ttft_count: float
    kv_cache_usage: float | None

    @property
    def hit_ratio(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens > 0 else None


def intervals(samples: Sequence[TargetSample], keys) -> list[Interval]:
    out = []
    for prev, cur in zip(samples, samples[1:]):
        dq = dh = ds = dc = 0.0
        kv = None
        for key in keys:
            q0, q1, h0, h1 = prev.get(key, "queries"), cur.get(key, "queries"), prev.get(key, "hits"), cur.get(key, "hits")
            if None not in (q0, q1, h0, h1):
                dq += q1 - q0
                dh += h1 - h0
            s0, s1, c0, c1 = prev.get(key, "ttft_sum"), cur.get(key, "ttft_sum"), prev.get(key, "ttft_count"), cur.get(key, "ttft_count")
            if None not in (s0, s1, c0, c1):
                ds += s1 - s0
                dc += c1 - c0
            usage = cur.get(key, "kv_cache_usage")
            if usage is not None and usage == usage:
                kv = usage if kv is None else max(kv, usage)
        out.append(Interval(prev.t, cur.t, dq, dh, ds, dc, kv))
    return out


def model_keys(samples: Sequence[TargetSample], model_name: str) -> list[SeriesKey]:
    return sorted({k for s in samples for k in s.layout.keys if k[0] == model_name}, key=lambda k: k[1] or "")


def _correlation_points(ivs: Sequence[Interval]) -> tuple[list[float], list[float]]:
    """Per poll interval: (hit ratio, mean TTFT), where both are defined."""
    ratios, ttfts = [], []
    for iv in ivs:
        if iv.query_tokens > 0 and iv.ttft_count > 0:
            ratios.append(iv.hit_tokens / iv.query_tokens)
            ttfts.append(iv.ttft_sum / iv.ttft_count)
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
    keys = model_keys(inside, model_name)
    units = {u for s in inside for k in keys if (u := s.unit(k)) is not None}
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
    ratios, ttfts = _correlation_points(intervals(inside, keys))
    fit = pearson(ratios, ttfts)
    kv = [v for k in keys for v in _values(inside, k, "kv_cache_usage")]
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


def stats_between(samples: Sequence[TargetSample], model_name: str, start: float, end: float,
                  min_query_tokens: float, block_size: int | None = None) -> WindowStats:
    """The window (start, end]: for baselines before an event and the time after it."""
    return window_stats(samples, model_name, end, "", max(end - start, 1e-9), min_query_tokens, block_size)


def summarize(
    samples: Sequence[TargetSample],
    now: float,
    windows: Sequence[tuple[str, float]],
    min_query_tokens: float,
    block_size: int | None = None,
) -> dict[str, dict[str, WindowStats]]:
    """model_name -> window name -> WindowStats, for every model seen in the history."""
    models = sorted({k[0] for s in samples for k in s.layout.keys})
    return {
        m: {name: window_stats(samples, m, now, name, secs, min_query_tokens, block_size) for name, secs in windows}
        for m in models
    }
