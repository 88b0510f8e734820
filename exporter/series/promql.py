"""PromQL's arithmetic where our numbers must equal a real Prometheus's:
histogram_quantile() over cumulative buckets, and the Pearson fit of two series."""
from __future__ import annotations

import math
from collections.abc import Sequence


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile over (upper bound, cumulative count) pairs."""
    return histogram_quantiles((q,), buckets)[0]


def histogram_quantiles(qs: Sequence[float], buckets: Sequence[tuple[float, float]]) -> list[float]:
    """Several quantiles of one histogram: the buckets are sorted, merged and made
    monotonic once."""
    ordered = sorted(buckets, key=lambda b: b[0])
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return [_outside(q) if _outside(q) is not None else math.nan for q in qs]
    ordered = _monotonic(_coalesce(ordered))
    out = []
    for q in qs:
        edge = _outside(q)
        out.append(edge if edge is not None else _quantile(q, ordered))
    return out


def _outside(q: float) -> float | None:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    return None


def _quantile(q: float, ordered: list[tuple[float, float]]) -> float:
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
    if count == 0:
        return math.nan  # 0/0, as PromQL computes it (q=0 with an empty first bucket)
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
