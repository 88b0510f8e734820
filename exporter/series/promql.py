"""PromQL's arithmetic where our numbers must equal a real Prometheus's:
histogram_quantile() over cumulative buckets, and the Pearson fit of two series."""
from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from operator import itemgetter


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile over (upper bound, cumulative count) pairs."""
    return histogram_quantiles((q,), buckets)[0]


def histogram_quantiles(qs: Sequence[float], buckets: Sequence[tuple[float, float]]) -> list[float]:
    """Several quantiles of one histogram: the buckets are sorted, merged and made
    monotonic once."""
    ordered = sorted(buckets, key=_bound)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return [_outside(q) if _outside(q) is not None else math.nan for q in qs]
    bounds, counts = _cumulative(ordered)
    out = []
    for q in qs:
        edge = _outside(q)
        out.append(edge if edge is not None else _quantile(q, bounds, counts))
    return out


_bound = itemgetter(0)


def _outside(q: float) -> float | None:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    return None


def _cumulative(ordered: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The bounds and counts of sorted buckets, those of one bound merged (summed) and each
    count lifted to the running maximum: buckets scraped non-atomically can dip, and
    PromQL lifts them."""
    bounds: list[float] = []
    counts: list[float] = []
    for le, c in ordered:
        if bounds and bounds[-1] == le:
            bounds[-1] = le  # the last of equal bounds (0.0 and -0.0), as PromQL's merge keeps
            counts[-1] += c
        else:
            bounds.append(le)
            counts.append(c)
    top = counts[0]
    for i in range(1, len(counts)):
        c = counts[i]
        if c > top:
            top = c
        elif c < top:
            counts[i] = top
    return bounds, counts


def _quantile(q: float, bounds: list[float], counts: list[float]) -> float:
    if len(counts) < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    total = sum(counts)
    # the first bucket holding the rank: the counts never fall, so bisect finds it where
    # no count is NaN (a NaN is neither above nor below, and the walk steps over it)
    b = bisect_left(counts, rank) if rank == rank and total == total else len(counts)
    if b == len(counts):
        # none at or above the rank (a NaN rank, or counts below zero): PromQL's search then
        # ends on the +Inf bucket
        b = next((i for i, c in enumerate(counts) if c >= rank), len(counts) - 1)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:
        return math.nan  # 0/0, as PromQL computes it (q=0 with an empty first bucket)
    return start + (end - start) * (rank / count)
