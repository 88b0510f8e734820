"""What the parser makes of one /metrics body: a Snapshot of its prefix-cache series,
and the `parse` command's JSON of it. Plain frozen values."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from .router_metrics import RouterSnapshot

# A body of bad lines would otherwise keep a warning per line: keep this many, count the rest.
MAX_WARNINGS = 100


@dataclass(frozen=True, slots=True)
class CounterPair:
    """None where the text carries only one half of the pair."""

    queries: float | None
    hits: float | None
    unit: str  # "tokens" or "blocks"


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative buckets sorted by upper bound; `+Inf` is math.inf."""

    buckets: tuple[tuple[float, float], ...]
    count: float | None
    sum: float | None

    @property
    def bounds(self) -> tuple[float, ...]:
        return tuple(le for le, _ in self.buckets)


def key_order(key: tuple[str, str | None]) -> tuple[str, str]:
    """A series key (model, engine) as text, to sort on: engine is None on some series
    and a string on others of the same model."""
    return key[0], key[1] or ""


@dataclass(frozen=True, slots=True)
class SeriesSnapshot:
    model_name: str
    engine: str | None
    prefix_cache: CounterPair | None
    external_prefix_cache: CounterPair | None
    ttft: Histogram | None
    kv_cache_usage: float | None
    preemptions: float | None
    prompt_tokens: float | None
    prompt_tokens_cached: float | None = None
    generation_tokens: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    hit_rate_since_start: float | None = None  # V0 gauge, block ratio since start
    created: float | None = None  # `_created` of the queries counter
    prompt_tokens_by_source: tuple[tuple[str, float], ...] | None = None  # 0.16 on, admitted prefill
    prompt_tokens_recomputed: float | None = None  # 0.16-0.19
    prefill_kv_computed: tuple[float, float] | None = None  # (sum, count) of the 0.13+ histogram
    engine_hit_rate: float | None = None  # SGLang's cache_hit_rate gauge: the last prefill batch
    lmcache_lookups: tuple[float | None, float | None, float | None] | None = None  # (requests, tokens, hit tokens), max over workers
    prompt_tokens_cached_by_source: tuple[tuple[str, float], ...] | None = None  # 0.33 on: device, host, p2p (a transfer), disk, ...
    cached_tokens_by_tier: tuple[tuple[str, float], ...] | None = None  # exporter/parse/tiers.py
    kv_idle_before_evict: Histogram | None = None  # vLLM 0.12+ with --kv-cache-metrics
    kv_reuse_gap: Histogram | None = None
    sleep_level: int | None = None  # vllm:engine_sleep_state: 0 awake, 1 weights offloaded, 2 all discarded; None: not said

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.model_name, self.engine)


@dataclass(frozen=True, slots=True)
class Snapshot:
    prefix_caching_enabled: bool | None
    block_size: int | None
    series: tuple[SeriesSnapshot, ...]
    warnings: tuple[str, ...]
    process_start_time: float | None = None
    engine_kind: str | None = None  # "vllm" or "sglang": whose names the text uses
    cache_config: tuple[tuple[str, str], ...] | None = None
    lora_config: tuple[tuple[str, str], ...] | None = None
    rejected: tuple[tuple[str, int], ...] = ()  # reason -> samples refused (non-finite or negative counters)
    warnings_dropped: int = 0  # warnings past the MAX_WARNINGS kept in `warnings`
    router: RouterSnapshot | None = None  # a prefix-aware router's predictions (exporter/parse/router_metrics.py)
    over_series_limit: bool = False  # parsing stopped at the series limit: `series` is the body's first ones only

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(sorted({s.model_name for s in self.series}))

    @property
    def warning_count(self) -> int:
        return len(self.warnings) + self.warnings_dropped

    def noted(self, warnings: Sequence[str], rejected: dict[str, int]) -> "Snapshot":
        """This snapshot with what ingesting it found (a counter stepping back, start
        times flapping): shown and counted as the parser's own findings are."""
        kept = MAX_WARNINGS - len(self.warnings)
        counts = dict(self.rejected)
        for reason, n in rejected.items():
            counts[reason] = counts.get(reason, 0) + n
        return replace(self, warnings=self.warnings + tuple(warnings[:max(0, kept)]),
                       warnings_dropped=self.warnings_dropped + max(0, len(warnings) - max(0, kept)),
                       rejected=tuple(sorted(counts.items())))

    def to_json(self) -> dict:
        """The `parse` output contract (docs/tools.md, `parse`): users script against it."""
        return {
            "engine_kind": self.engine_kind,
            "prefix_caching_enabled": self.prefix_caching_enabled,
            "block_size": self.block_size,
            "process_start_time": self.process_start_time,
            "cache_config": dict(self.cache_config) if self.cache_config is not None else None,
            "lora_config": dict(self.lora_config) if self.lora_config is not None else None,
            "series": [_series_json(s) for s in self.series],
            "warnings": list(self.warnings),
            "warnings_total": self.warning_count,  # `warnings` holds the first MAX_WARNINGS
            "rejected_samples": dict(self.rejected),
            "router": None if self.router is None else {
                "kind": self.router.kind,
                "models": {m: {"predicted_tokens": c.predicted_tokens, "input_tokens": c.input_tokens,
                               "ratio_sum": c.ratio_sum, "ratio_count": c.ratio_count} for m, c in self.router.models},
            },
        }


def _series_json(s: SeriesSnapshot) -> dict:
    def pair(p: CounterPair | None):
        return None if p is None else {"queries": p.queries, "hits": p.hits, "unit": p.unit}

    ttft = None
    if s.ttft is not None:
        ttft = {
            "count": s.ttft.count,
            "sum": s.ttft.sum,
            "buckets": [["+Inf" if math.isinf(le) else le, c] for le, c in s.ttft.buckets],
        }
    return {
        "model_name": s.model_name,
        "engine": s.engine,
        "prefix_cache": pair(s.prefix_cache),
        "external_prefix_cache": pair(s.external_prefix_cache),
        "ttft": ttft,
        "kv_cache_usage": s.kv_cache_usage,
        "preemptions": s.preemptions,
        "prompt_tokens": s.prompt_tokens,
        "prompt_tokens_cached": s.prompt_tokens_cached,
        "hit_rate_since_start": s.hit_rate_since_start,
        "created": s.created,
        "prompt_tokens_by_source": dict(s.prompt_tokens_by_source) if s.prompt_tokens_by_source is not None else None,
        "prompt_tokens_recomputed": s.prompt_tokens_recomputed,
        "prefill_kv_computed": {"sum": s.prefill_kv_computed[0], "count": s.prefill_kv_computed[1]} if s.prefill_kv_computed else None,
        "engine_hit_rate": s.engine_hit_rate,
        "lmcache_lookups": dict(zip(("requests", "tokens", "hits"), s.lmcache_lookups)) if s.lmcache_lookups else None,
        "prompt_tokens_cached_by_source": dict(s.prompt_tokens_cached_by_source) if s.prompt_tokens_cached_by_source is not None else None,
        "cached_tokens_by_tier": dict(s.cached_tokens_by_tier) if s.cached_tokens_by_tier is not None else None,
        "kv_idle_before_evict": {"count": s.kv_idle_before_evict.count, "sum": s.kv_idle_before_evict.sum} if s.kv_idle_before_evict else None,
        "kv_reuse_gap": {"count": s.kv_reuse_gap.count, "sum": s.kv_reuse_gap.sum} if s.kv_reuse_gap else None,
        "sleep_level": s.sleep_level,
    }
