"""Window math over one target's scrape history: pure functions of samples and `now`.

Semantics follow PromQL so that our numbers can be checked against a real Prometheus:
increases are `increase()` without extrapolation over the reset-adjusted samples of
exporter/series/history.py (which says where a decrease is no reset, unlike PromQL), and
quantiles are `histogram_quantile()`'s (exporter/series/promql.py). Every ratio is in [0, 1].
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from operator import sub
from typing import NamedTuple

from .samples import COUNTERS, TIER_BASE, TIER_SLOTS, Layout, Samples, SeriesKey, _as_samples
from .hitratio import counts, effective_counts, ratio, tokens
from .modellog import least_squares_fit
from .promql import histogram_quantiles

QUANTILES = (0.5, 0.9, 0.99)


# --- the summary of one window ---------------------------------------------------------
class _WindowValues(NamedTuple):
    window: str
    seconds: float
    query_increase: float | None
    hit_increase: float | None
    unit: str | None
    hit_ratio: float | None
    query_rate: float | None
    hit_rate: float | None
    external_hit_ratio: float | None
    ttft_mean: float | None
    ttft_count_increase: float | None
    correlation: float | None
    ttft_per_10_points: float | None
    prompt_token_increase: float | None
    preemption_increase: float | None
    kv_cache_usage_max: float | None
    samples: int
    admitted_hit_increase: float | None  # tokens served from cache, counted once per request as it is scheduled
    admitted_prompt_increase: float | None  # prompt tokens over the same time
    admitted_hit_ratio: float | None
    lazy_ttft: "_LazyTTFT"
    # every tier (exporter/series/hitratio.py): what a connector brought, the engine's named tiers, the judged ratio
    block_size: int | None = None  # the target's, for the counts in blocks
    external_hit_increase: float | None = None  # the connector's hits (vllm:external_prefix_cache_hits)
    external_transfer_increase: float | None = None  # the same, admitted (prompt_tokens_by_source external_kv_transfer)
    tier_increases: tuple = ()  # ((tier, cached tokens), ...) where the engine names its tiers, else ()
    effective_hit_ratio: float | None = None  # every tier's cached tokens / queried tokens; None under the token floor


class _TTFTSource:
    """What the windows of one summary share: the samples, the window's layout runs."""

    __slots__ = ("view", "runs", "lo", "hi")

    def __init__(self, view, runs, lo: int, hi: int):
        self.view, self.runs, self.lo, self.hi = view, runs, lo, hi


class _LazyTTFT:
    """Where a model's TTFT bucket increases come from, for each window (seconds -> a
    source, shared by every model of the summary; the model's series, or explicit edges),
    and their quantiles once asked for. The windows of a model that share a layout share
    one: at 10,000 models, one object a window was 30,000 more a poll for the garbage
    collector to walk."""

    __slots__ = ("sources", "keys", "quantiles")

    def __init__(self, sources: dict[float, _TTFTSource] | None = None, keys=None):
        self.sources, self.keys = sources, keys
        self.quantiles: dict[float, dict[float, float]] | None = None  # seconds -> quantiles, made when first asked

    def compute(self, seconds: float) -> dict[float, float]:
        if self.quantiles is None:
            self.quantiles = {}
        quantiles = self.quantiles.get(seconds)
        if quantiles is None:
            quantiles = {}
            src = self.sources.get(seconds) if self.sources else None
            if src is not None:
                edges = self.keys if isinstance(self.keys, dict) else {k: (src.lo, src.hi - 1) for k in self.keys}
                buckets = _ttft_bucket_increase(src.view, src.runs, edges)
                if buckets is not None:
                    for q, value in zip(QUANTILES, histogram_quantiles(QUANTILES, buckets)):
                        if not math.isnan(value):
                            quantiles[q] = value
            self.quantiles[seconds] = quantiles
        return quantiles


class WindowStats(_WindowValues):
    """Derived values of one (model_name, window); None where there is too little data.

    Read-only (a tuple). TTFT quantiles are computed when first asked for (by the
    collector, or the TTFT rule once its cheap tests pass), not at every poll: most
    polls never need them, and at thousands of models they were most of a poll's cost."""

    __slots__ = ()

    def __new__(cls, ttft: _LazyTTFT | None = None, **values):
        return super().__new__(cls, lazy_ttft=ttft or _LazyTTFT(), **values)

    @property
    def ttft_quantiles(self) -> dict[float, float]:
        """p50/p90/p99 of the window's TTFT bucket increase (histogram_quantile)."""
        return self.lazy_ttft.compute(self.seconds)


def _key_edges(view: Samples, runs: list[tuple[Layout, int, int]], key: SeriesKey) -> tuple[int, int] | None:
    """First and last sample index holding `key` among the clipped runs."""
    first = last = None
    for layout, a, b in runs:
        if key in layout.position:
            if first is None:
                first = a
            last = b
    return None if first is None else (first, last)


def _increases(view: Samples, edges: dict) -> list[float | None]:
    """Increase of every counter slot, summed over engines, in one pass; None for a
    counter no engine has twice. The values are reset-adjusted already."""
    n = len(COUNTERS)
    totals = [0.0] * n
    seen = [False] * n
    for key, (a, b) in edges.items():
        if a == b:
            continue
        sa, sb = view[a], view[b]
        va, vb = sa.values, sb.values
        oa = sa.layout.offsets[sa.layout.position[key]]
        ob = sb.layout.offsets[sb.layout.position[key]]
        for j in range(n):
            x, y = va[oa + j], vb[ob + j]
            if x == x and y == y:
                totals[j] += y - x
                seen[j] = True
    return [t if s else None for t, s in zip(totals, seen)]


def _ttft_bucket_increase(view: Samples, runs, edges: dict) -> list[tuple[float, float]] | None:
    """Per-bucket increase summed over engines. A series whose bucket layout changed in
    the window (a restart with other buckets) contributes only its latest layout."""
    summed: dict[float, float] = {}
    seen = False
    for key in edges:
        holding = [(layout, a, b) for layout, a, b in runs if key in layout.position and layout.bounds[layout.position[key]]]
        if not holding:
            continue
        layout, _, last = holding[-1]
        bounds = layout.bounds[layout.position[key]]
        first = holding[-1][1]
        for other, a, _ in reversed(holding[:-1]):
            if other.bounds[other.position[key]] != bounds:
                break
            first = a
        if first == last:
            continue
        _, row_a = view[first].buckets(key)
        _, row_b = view[last].buckets(key)
        for le, a, b in zip(bounds, row_a, row_b):
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
        return ratio(self.hit_tokens, self.query_tokens) if self.query_tokens > 0 else None


def recent_intervals(view: Samples, model_name: str, since: float) -> list[Interval]:
    """The model's per-poll intervals that ended after `since`, from its log: O(intervals)."""
    log = view.logs.get(model_name)
    if log is None:
        return []
    t, t_start, q, h, _, _, kv, start, end = log
    lo = bisect_right(t, since, start, end)
    out = []
    for i in range(lo, end):
        if t_start[i] == t[i]:
            continue  # the model's first poll: no interval yet
        usage = kv[i]
        out.append(Interval(t_start[i], t[i], q[i], h[i], 0.0, 0.0, usage if usage == usage else None))
    return out


def last_hit_time(view: Samples, model_name: str) -> float | None:
    """When the model's lookup hits last grew, from its log (the rare path of a rule)."""
    log = view.logs.get(model_name)
    if log is None:
        return None
    t, _, _, h, _, _, _, start, end = log
    for i in range(end - 1, start - 1, -1):
        if h[i] > 0:
            return t[i]
    return None


def interval_sums(view: Samples, model_name: str, *edges: float) -> list[tuple[float, float, int]]:
    """For consecutive spans (e0, e1], (e1, e2], ...: (query tokens, hit tokens, intervals)
    of the model's poll intervals that ended in each, from its log without building
    objects: a cheap first test."""
    log = view.logs.get(model_name)
    if log is None:
        return [(0.0, 0.0, 0)] * (len(edges) - 1)
    t, t_start, q, h, _, _, _, start, end = log
    cuts = [bisect_right(t, e, start, end) for e in edges]
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        # only a model's very first entry has no interval (its start is its own time)
        n = hi - lo - (1 if lo < hi and t_start[lo] == t[lo] else 0)
        queries = sum(q[lo:hi])
        out.append((queries, min(sum(h[lo:hi]), queries), n))  # hits above queries are all hits
    return out


def _log_fit_and_kv(view: Samples, model: str, now: float, seconds: float, with_kv: bool) -> tuple[tuple[float, float] | None, float | None]:
    """Correlation fit and KV max over (now - seconds, now]: running sums when this is the
    history's latest moment and a tracked window, else a scan of the log."""
    log = view.logs.get(model)
    if log is None:
        return None, None
    t, t_start, _, _, x, y, kv, start, end = log
    running = view.running.get(model, {}).get(seconds)
    if running is not None and end and t[end - 1] == now and view.times and view.times[-1] == now:
        return running.fit(), running.kv_max()
    edge = now - seconds
    hi = bisect_right(t, now, start, end)
    lo = bisect_right(t_start, edge, start, hi)  # starts are the previous poll times: sorted
    n = sx = sy = sxy = sxx = syy = 0.0
    for i in range(lo, hi):
        if t_start[i] <= edge:
            continue
        xi, yi = x[i], y[i]
        if xi == xi and yi == yi:
            n += 1
            sx += xi
            sy += yi
            sxy += xi * yi
            sxx += xi * xi
            syy += yi * yi
    kv_max = None
    if with_kv:
        for i in range(bisect_right(t, edge, start, hi), hi):
            v = kv[i]
            if v == v and (kv_max is None or v > kv_max):
                kv_max = v
    return least_squares_fit(n, sx, sy, sxy, sxx, syy), kv_max


def window_stats(
    samples,
    model_name: str,
    now: float,
    window: str,
    seconds: float,
    min_query_tokens: float,
    block_size: int | None = None,
    detailed: bool = True,
) -> WindowStats:
    """One (model, window) over (now - seconds, now]. Costs O(engines x layouts in the
    window), not O(samples): increases come from the first and last sample holding each
    series, since values are reset-adjusted. `detailed` adds the correlation and KV max."""
    view = _as_samples(samples)
    lo, hi = view.span(now - seconds, now)
    runs = view.clipped_runs(lo, hi)
    edges = {}
    units = set()
    for layout, _, _ in runs:
        for key in layout.by_model.get(model_name, ()):
            if key not in edges:
                edges[key] = _key_edges(view, runs, key)
            u = layout.units[layout.position[key]]
            if u is not None:
                units.add(u)
    unit = units.pop() if len(units) == 1 else None
    return _stats(view, model_name, now, window, seconds, lo, hi, _increases(view, edges), unit,
                  _LazyTTFT({seconds: _TTFTSource(view, runs, lo, hi)}, edges), min_query_tokens, block_size, detailed)


def _stats(view: Samples, model_name: str, now: float, window: str, seconds: float, lo: int, hi: int,
           increase: list[float | None], unit: str | None, ttft: "_LazyTTFT", min_query_tokens: float,
           block_size: int | None, detailed: bool) -> WindowStats:
    queries, hits = increase[0], increase[1]
    admitted_hits, admitted_prompt, admitted_ratio = _admitted(increase, min_query_tokens)
    span = view.times[hi - 1] - view.times[lo] if hi - lo >= 2 else 0.0
    # the floor is in tokens; a 0.8.x target counts blocks
    query_tokens = None if queries is None else tokens(queries, unit, block_size)
    hit_ratio = None
    if queries is not None and hits is not None and query_tokens is not None and query_tokens >= max(min_query_tokens, 1e-12) and unit is not None:
        hit_ratio = ratio(hits, queries)
    ext_q, ext_h, ttft_sum, ttft_count = increase[2], increase[3], increase[4], increase[5]
    fit, kv_max = _log_fit_and_kv(view, model_name, now, seconds, detailed) if detailed else (None, None)
    return _with_tiers(WindowStats(
        ttft=ttft,
        window=window,
        seconds=seconds,
        query_increase=queries,
        hit_increase=hits,
        unit=unit,
        hit_ratio=hit_ratio,
        query_rate=queries / span if queries is not None and span > 0 else None,
        hit_rate=hits / span if hits is not None and span > 0 else None,
        external_hit_ratio=ratio(ext_h, ext_q) if ext_q and ext_h is not None else None,
        ttft_mean=ttft_sum / ttft_count if ttft_sum is not None and ttft_count else None,
        ttft_count_increase=ttft_count,
        correlation=fit[0] if fit else None,
        ttft_per_10_points=fit[1] * 0.1 if fit else None,
        prompt_token_increase=increase[6],
        preemption_increase=increase[7],
        kv_cache_usage_max=kv_max,
        samples=hi - lo,
        admitted_hit_increase=admitted_hits,
        admitted_prompt_increase=admitted_prompt,
        admitted_hit_ratio=admitted_ratio,
        block_size=block_size,
        external_hit_increase=ext_h,
        external_transfer_increase=increase[11],
        tier_increases=(),
        effective_hit_ratio=None,
    ), increase, min_query_tokens)


_NO_TIERS = [None] * len(TIER_SLOTS)
assert _WindowValues._fields[-2:] == ("tier_increases", "effective_hit_ratio")  # _with_tiers sets them by position


def _named_tiers(increase: list[float | None]) -> tuple[tuple[str, float], ...]:
    """(tier, increase) of each tier the engine names (or a connector's slot with data)."""
    named = increase[TIER_BASE:TIER_BASE + len(TIER_SLOTS)]
    return tuple((name, v) for name, v in zip(TIER_SLOTS, named) if v is not None) if named != _NO_TIERS else ()


def _with_tiers(ws: WindowStats, increase: list[float | None], min_query_tokens: float) -> WindowStats:
    """The window with the tiers the engine names and the ratio of every tier judged
    (exporter/series/hitratio.py), None under the token floor as the other ratios are.
    Both are WindowStats' last two fields, set by slicing: this runs per model, window and
    poll, and NamedTuple._replace walks every field in Python."""
    tiers = _named_tiers(increase)
    if tiers:
        ws = tuple.__new__(WindowStats, ws[:-2] + (tiers, ws[-1]))
    judged = _judged(*effective_counts(ws), max(min_query_tokens, 1e-12))
    if judged is not None:
        ws = tuple.__new__(WindowStats, ws[:-1] + (judged,))
    return ws


def _judged(hits: float, queries: float, floor: float) -> float | None:
    """The ratio over every tier (hitratio.effective_counts), None under the token floor."""
    return ratio(hits, queries) if queries > 0 and queries >= floor else None


def _admitted(increase: list[float | None], min_tokens: float) -> tuple[float | None, float | None, float | None]:
    """(hit tokens, prompt tokens, ratio) from the admitted-prefill counters: local cache
    hits by source (less the recomputed last token of 0.16-0.19), else all cached tokens
    less those an external connector brought; None where the target has neither."""
    prompt, local, recomputed, cached, external = increase[6], increase[8], increase[9], increase[10], increase[11]
    if local is not None:
        hits = local - (recomputed or 0.0)
    elif cached is not None:
        hits = cached - (external or 0.0)
    else:
        return None, None, None
    if prompt is None:
        return hits, None, None
    return hits, prompt, (ratio(hits, prompt) if prompt >= max(min_tokens, 1e-12) else None)


def _windows_of_one_layout(view: Samples, now: float, windows: Sequence[tuple[str, float, int]], hi: int, layout: Layout,
                           models, min_query_tokens: float, block_size: int | None) -> dict[str, dict[str, WindowStats]]:
    """model -> window -> stats for the windows (name, seconds, first sample) whose samples,
    up to sample `hi - 1`, share one layout (the usual case): each model's increases are
    last - first of its series, and the correlation and KV maximum come from the running
    sums when `now` is the latest sample. Model by model, every window of a model at once:
    a window after window pass over 10,000 models found each model's state out of the
    caches four times a poll, and a vector of every series' differences a window was
    170,000 floats; here a model's few floats are made, read and freed while they are hot."""
    n = len(COUNTERS)
    floor = max(min_query_tokens, 1e-12)
    latest = bool(view.times) and view.times[-1] == now
    lv = view[hi - 1].values
    # the windows of one summary: one TTFT source each, one lazy TTFT a model for all its windows
    sources: dict[float, _TTFTSource] = {}
    spans = []
    for name, seconds, lo in windows:
        sources[seconds] = _TTFTSource(view, [(layout, lo, hi - 1)], lo, hi)
        spans.append((name, seconds, view[lo].values, view.times[hi - 1] - view.times[lo], hi - lo))
    running_of = view.running if latest else {}
    by_model, unit_of_model, position = layout.by_model, layout.unit_of_model, layout.position
    offsets, single_base = layout.offsets, layout.single_base
    no_running: dict = {}
    out = {}
    for model in models:
        keys = by_model.get(model)
        if not keys:
            continue
        o = single_base.get(model)
        last = lv[o:o + n] if o is not None else None
        unit = unit_of_model[model]
        running = running_of.get(model, no_running)
        lazy = _LazyTTFT(sources, keys)
        stats = out[model] = {}
        for window, seconds, fv, span, count in spans:
            if last is not None:
                increase = [d if d == d else None for d in map(sub, last, fv[o:o + n])]
            else:
                totals = [0.0] * n
                seen = [False] * n
                for key in keys:
                    k = offsets[position[key]]
                    for j, d in enumerate(map(sub, lv[k:k + n], fv[k:k + n])):
                        if d == d:
                            totals[j] += d
                            seen[j] = True
                increase = [t if s else None for t, s in zip(totals, seen)]
            queries, hits, ext_q, ext_h, ttft_sum, ttft_count, prompt, preempt = increase[:8]
            a_hits, a_prompt, a_ratio = _admitted(increase, min_query_tokens)
            hit_ratio = None
            if queries is not None and hits is not None and unit is not None and \
                    tokens(queries, unit, block_size) >= floor:
                hit_ratio = hits / queries
                hit_ratio = 1.0 if hit_ratio > 1.0 else hit_ratio  # counters are never negative here
            sums = running.get(seconds)
            if sums is not None:
                fit = least_squares_fit(sums.n, sums.sx, sums.sy, sums.sxy, sums.sxx, sums.syy) if sums.n >= 3 else None
                kv_max = sums.kv[1] if sums.kv else None
            else:
                fit, kv_max = _log_fit_and_kv(view, model, now, seconds, True)
            # what _with_tiers adds, from the values at hand
            tiers = _named_tiers(increase)
            transfer = increase[11]
            e_hits, e_queries = counts(queries, hits, ext_h, a_hits, a_prompt, transfer, unit, block_size)
            # positional, in _WindowValues' field order: the hot path of a poll
            stats[window] = tuple.__new__(WindowStats, (
                window, seconds, queries, hits, unit, hit_ratio,
                queries / span if queries is not None and span > 0 else None,
                hits / span if hits is not None and span > 0 else None,
                ratio(ext_h, ext_q) if ext_q and ext_h is not None else None,
                ttft_sum / ttft_count if ttft_sum is not None and ttft_count else None,
                ttft_count, fit[0] if fit else None, fit[1] * 0.1 if fit else None, prompt, preempt, kv_max, count,
                a_hits, a_prompt, a_ratio, lazy, block_size, ext_h, transfer, tiers,
                _judged(e_hits, e_queries, floor)))
    return out


def stats_between(samples, model_name: str, start: float, end: float,
                  min_query_tokens: float, block_size: int | None = None, detailed: bool = False) -> WindowStats:
    """The window (start, end]: for baselines before an event and the time after it."""
    return window_stats(samples, model_name, end, "", max(end - start, 1e-9), min_query_tokens, block_size, detailed)


def summarize(
    samples,
    now: float,
    windows: Sequence[tuple[str, float]],
    min_query_tokens: float,
    block_size: int | None = None,
) -> dict[str, dict[str, WindowStats]]:
    """model_name -> window name -> WindowStats, for every model seen in the longest
    window: a model that vanished drops out once no window holds it."""
    view = _as_samples(samples)
    if not windows:
        return {}
    longest = max(s for _, s in windows)
    longest_span = view.span(now - longest, now)
    runs = view.clipped_runs(*longest_span)
    # one layout (the usual case): its models in the body's order, which the parser sorted, so
    # sorting them is one pass; a set of 10,000 names in hash order took a full sort every poll
    models = sorted(runs[0][0].by_model if len(runs) == 1 else view.models(*longest_span))
    hi = longest_span[1]  # every window ends at the same sample
    spans = [(name, secs, view.span(now - secs, now)[0]) for name, secs in windows]
    # the windows of two samples or more within the latest layout: all of them, usually
    # (every window ends at `hi`, so one within a longest window of one layout has one layout too)
    one_layout = len(runs) == 1
    fast = [(name, secs, lo) for name, secs, lo in spans if hi - lo >= 2 and (one_layout or len(view.clipped_runs(lo, hi)) == 1)]
    out = _windows_of_one_layout(view, now, fast, hi, view[hi - 1].layout, models, min_query_tokens, block_size) if fast else {}
    if len(fast) == len(spans) and len(out) == len(models):
        return out
    empty: dict[str, WindowStats] = {}
    return {m: {name: out.get(m, empty).get(name) or window_stats(view, m, now, name, secs, min_query_tokens, block_size)
                for name, secs in windows} for m in models}
