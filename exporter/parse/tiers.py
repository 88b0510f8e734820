"""Where cached prompt tokens came from (cache tiers), and how long KV blocks stay
resident (vLLM's residency histograms). Pure.

Tier names follow the engines, normalised so a dashboard sums like with like: device
(GPU), host (CPU), storage/disk, and `unattributed` for SGLang's `cache_source="total"`,
its fallback for requests without per-tier details (disjoint from the others, so it is
summed with them, never dropped). vLLM 0.33's `p2p` stays its own tier: KV another
replica sent (P/D), a transfer rather than a hit.
"""
from __future__ import annotations

import math

from .snapshot import Histogram

UNATTRIBUTED = "unattributed"


def of_sglang(cache_source: str | None) -> str:
    if cache_source is None or cache_source == "total":
        return UNATTRIBUTED
    if cache_source.startswith("storage"):
        return "storage"  # 0.5.9-0.5.19 name the backend: storage_<BackendClass>
    return cache_source


def of_trtllm(cache_tier: str | None) -> str:
    tier = (cache_tier or "").strip().lower()
    return {"gpu": "device", "": UNATTRIBUTED}.get(tier, tier)


def by_tier(collected: dict[str, float], cached_by_source) -> tuple[tuple[str, float], ...] | None:
    out = dict(collected)
    for source, value in cached_by_source or ():
        out[source] = out.get(source, 0.0) + value
    return tuple(sorted(out.items())) or None


def histogram(buckets: dict[float, float] | None, total: float | None, count: float | None) -> Histogram | None:
    if not buckets or not math.isinf(max(buckets)):
        return None  # a cut histogram is no distribution
    return Histogram(buckets=tuple(sorted(buckets.items())), count=count, sum=total)


def median(h: Histogram | None) -> float | None:
    """The upper bound of the bucket holding the middle observation (coarse, never interpolated)."""
    if h is None or not h.buckets or h.buckets[-1][1] <= 0:
        return None
    half = h.buckets[-1][1] / 2
    return next(le for le, c in h.buckets if c >= half)


def evicted_before_reuse(idle: Histogram | None, reuse: Histogram | None) -> bool | None:
    """Direct evidence of eviction pressure: blocks sit idle for less time before they are
    evicted than the engine's typical gap between two uses of a block, so most would have
    been reused had they stayed. None without both histograms."""
    a, b = median(idle), median(reuse)
    if a is None or b is None:
        return None
    return a < b
