"""What a scrape's samples were filed as (each series' fields, buckets and start times,
the info samples, the process start) -> the Snapshot: its pairs, histograms, tiers,
cache settings and the warnings of what is missing. The parser's loop and a sample
plan (exporter/parse/vllm_metrics.py) file the samples; this finishes either alike."""
from __future__ import annotations

import math

from . import cacheconfig, tiers, trtllm
from .names import (BY_SOURCE, CACHED_BY_SOURCE, GPU_PREFIX_HITS, GPU_PREFIX_QUERIES, SLEEP_STATES, TRTLLM_MISSED_BLOCKS,
                    TRTLLM_REUSED_BLOCKS, TRTLLM_TOKENS_PER_BLOCK, TRTLLM_ZERO_WHEN_DECLARED)
from .router_metrics import RouterBuilder
from .snapshot import MAX_WARNINGS, CounterPair, Histogram, SeriesSnapshot, Snapshot, key_order


class SeriesBuilder:
    __slots__ = ("values", "buckets", "created", "tiers", "hists")

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.buckets: dict[float, float] = {}
        self.created: dict[str, float] = {}
        self.tiers: dict[str, float] = {}  # cache tier -> cached prompt tokens
        self.hists: dict[str, dict[float, float]] = {}  # KV residency histograms: name -> le -> count


class Warnings:
    """A list's `append` that keeps the first MAX_WARNINGS and counts every one."""

    __slots__ = ("kept", "total")

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.total = 0

    def append(self, warning: str) -> None:
        self.total += 1
        if len(self.kept) < MAX_WARNINGS:
            self.kept.append(warning)


def finish(series: dict[tuple[str, str | None], SeriesBuilder], infos: dict[str, list[dict[str, str]]], process_start: float | None,
            rejected: dict[str, int], kinds: set[str], trtllm_keys: set[tuple[str, str | None]], router: RouterBuilder,
            warnings: Warnings, helps: dict[str, str], declared: set[str], over_series_limit: bool) -> Snapshot:
    """What the samples were filed as -> the Snapshot."""
    gpu_unit = _gpu_pair_unit(helps)
    for key in trtllm_keys:
        values = series[key].values
        if any(f in values for f in TRTLLM_ZERO_WHEN_DECLARED.values()):
            for family, field_name in TRTLLM_ZERO_WHEN_DECLARED.items():
                if family in declared:
                    values.setdefault(field_name, 0.0)
    # LMCache's tokens stand in for vLLM's external counters only where those are missing
    vllm_external = {m for (m, _), b in series.items() if "external_queries" in b.values}
    built = []
    in_order = sorted(series.items(), key=lambda kv: key_order(kv[0])) if len(series) > 1 else series.items()  # one: nothing to sort
    for (model, engine), b in in_order:
        built.append(_series(model, engine, b, gpu_unit, warnings, use_lmcache=model not in vllm_external))

    cache_config = cacheconfig.single_info(infos.get("cache_config"), "cache_config_info", warnings)
    lora = cacheconfig.single_info(infos.get("lora"), "lora_requests_info", warnings)
    v0_gauges = [b.values["v0_gpu_hit_rate"] for b in series.values() if "v0_gpu_hit_rate" in b.values]
    enabled, block_size = cacheconfig.settings(cache_config, v0_gauges, warnings)
    if block_size is None:
        block_size = trtllm.block_size([b.values for b in series.values()], TRTLLM_TOKENS_PER_BLOCK, warnings)
    if gpu_unit is None and any(b.values.get("gpu_queries") is not None and "queries" not in b.values for b in series.values()):
        warnings.append("vllm:gpu_prefix_cache_* has no HELP line; assuming tokens (0.9.x) not blocks (0.8.x)")
    return Snapshot(
        prefix_caching_enabled=enabled,
        block_size=block_size,
        series=tuple(built),
        warnings=tuple(warnings.kept),
        warnings_dropped=warnings.total - len(warnings.kept),
        process_start_time=process_start,
        cache_config=tuple(sorted(cache_config.items())) if cache_config is not None else None,
        lora_config=tuple(sorted((k, v) for k, v in lora.items() if k not in ("running_lora_adapters", "waiting_lora_adapters"))) if lora is not None else None,
        rejected=tuple(sorted(rejected.items())),
        engine_kind=_engine_kind(kinds),
        router=router.build(),
        over_series_limit=over_series_limit,
    )


def _engine_kind(kinds: set[str]) -> str | None:
    """Whose names the text uses; vLLM's where it holds several (LMCache and
    connectors write into vLLM's own /metrics)."""
    if "vllm" in kinds or len(kinds) > 1:
        return "vllm" if "vllm" in kinds else sorted(kinds)[0]
    return next(iter(kinds), None)


def _gpu_pair_unit(helps: dict[str, str]) -> str | None:
    if not helps:  # samples without a text (the Prometheus source): no HELP line to read
        return None
    for name in (GPU_PREFIX_QUERIES, GPU_PREFIX_HITS):
        text = helps.get(name, "").lower()
        if "block" in text:
            return "blocks"
        if "token" in text:
            return "tokens"
    return None


def _pair(values: dict[str, float], queries: str, hits: str, unit: str, what: str, warnings: list[str]) -> CounterPair | None:
    q, h = values.get(queries), values.get(hits)
    if q is None and h is None:
        return None
    if q is None or h is None:
        warnings.append(f"{what}: only {'hits' if q is None else 'queries'} of the hits/queries pair is present")
    return CounterPair(queries=q, hits=h, unit=unit)


def _prefix_pair(values: dict[str, float], gpu_unit: str | None, what: str, warnings: list[str]) -> CounterPair | None:
    """The new pair wins; the deprecated `gpu_` pair is never added to it. A half
    missing from the new pair (an excerpt, a cut body) is taken from the deprecated
    one, which counts the same tokens in 0.9.2-0.11.x."""
    new = _pair(values, "queries", "hits", "tokens", what, [])
    old_unit = gpu_unit or "tokens"
    old = _pair(values, "gpu_queries", "gpu_hits", old_unit, what, [])
    if new is None:
        if old is not None and (old.queries is None or old.hits is None):
            warnings.append(f"{what}: only one half of vllm:gpu_prefix_cache_* is present")
        return old
    if (new.queries is None or new.hits is None) and old is not None and old_unit == "tokens":
        queries = new.queries if new.queries is not None else old.queries
        hits = new.hits if new.hits is not None else old.hits
        warnings.append(f"{what}: vllm:prefix_cache_* is incomplete; the missing half is read from the deprecated gpu_ pair")
        new = CounterPair(queries=queries, hits=hits, unit="tokens")
    if new.queries is None or new.hits is None:
        warnings.append(f"{what}: only one half of vllm:prefix_cache_* is present")
    return new


# (source, the field it is filed as): the names made once, not at every scrape
_BY_SOURCE_FIELDS = tuple((s, "source_" + s) for s in BY_SOURCE)
_CACHED_BY_SOURCE_FIELDS = tuple((s, "cached_source_" + s) for s in CACHED_BY_SOURCE)


def _series(model: str, engine: str | None, b: SeriesBuilder, gpu_unit: str | None, warnings: list[str],
            use_lmcache: bool = True) -> SeriesSnapshot:
    v = b.values
    what = f"model_name={model!r} engine={engine!r}"
    # 0.9.2-0.11.x expose both pairs: the new one wins, they are never added.
    prefix = _prefix_pair(v, gpu_unit, what, warnings)
    if prefix is None and "sglang_prompt_tokens" in v:
        # SGLang: cached tokens of all tiers over prompt tokens, both counted at request finish
        prefix = CounterPair(queries=v["sglang_prompt_tokens"], hits=v.get("sglang_cached_tokens"), unit="tokens")
    if prefix is None:
        prefix = trtllm.block_pair(v, what, warnings, (TRTLLM_REUSED_BLOCKS, TRTLLM_MISSED_BLOCKS, TRTLLM_TOKENS_PER_BLOCK))
    external = _pair(v, "external_queries", "external_hits", "tokens", what + " external", warnings)
    if external is None and use_lmcache and ("lmcache_requested" in v or "lmcache_hit" in v):
        external = _pair(v, "lmcache_requested", "lmcache_hit", "tokens", what + " lmcache", warnings)
    by_source = tuple((s, v[field]) for s, field in _BY_SOURCE_FIELDS if field in v) or None
    cached_by_source = tuple((s, v[field]) for s, field in _CACHED_BY_SOURCE_FIELDS if field in v) or None
    # either `_created` dates the same process start; a change of it is a restart
    created = b.created.get("new", b.created.get("deprecated"))
    ttft = None
    if b.buckets or "ttft_count" in v or "ttft_sum" in v:
        buckets = tuple(sorted(b.buckets.items()))
        count = v.get("ttft_count")
        if not buckets or not math.isinf(buckets[-1][0]):
            warnings.append(f"{what}: TTFT histogram has no +Inf bucket (truncated?)")
        ttft = Histogram(buckets=buckets, count=count, sum=v.get("ttft_sum"))
    v0 = v.get("v0_gpu_hit_rate")
    return SeriesSnapshot(
        model_name=model,
        engine=engine,
        prefix_cache=prefix,
        external_prefix_cache=external,
        ttft=ttft,
        kv_cache_usage=v.get("kv_usage", v.get("gpu_cache_usage")),
        preemptions=v.get("preemptions"),
        prompt_tokens=v.get("prompt_tokens", v.get("sglang_prompt_tokens")),
        prompt_tokens_cached=v.get("prompt_tokens_cached"),
        generation_tokens=v.get("generation_tokens"),
        requests_running=v.get("requests_running"),
        requests_waiting=v.get("requests_waiting"),
        hit_rate_since_start=v0 if v0 is not None and 0 <= v0 <= 1 else None,  # -1: caching off; a ratio is 0-1
        created=created,
        prompt_tokens_by_source=by_source,
        prompt_tokens_cached_by_source=cached_by_source,
        cached_tokens_by_tier=tiers.by_tier(b.tiers, cached_by_source),
        kv_idle_before_evict=tiers.histogram(b.hists.get("idle_before_evict"), v.get("idle_before_evict_sum"), v.get("idle_before_evict_count")),
        kv_reuse_gap=tiers.histogram(b.hists.get("reuse_gap"), v.get("reuse_gap_sum"), v.get("reuse_gap_count")),
        prompt_tokens_recomputed=v.get("prompt_tokens_recomputed"),
        sleep_level=_sleep_level(v),
        prefill_kv_computed=(v["prefill_kv_computed_sum"], v.get("prefill_kv_computed_count", 0.0)) if "prefill_kv_computed_sum" in v else None,
        engine_hit_rate=_ratio_or_none(v.get("engine_hit_rate"), what, warnings),
        lmcache_lookups=tuple(v.get(k) for k in ("lmcache_lookup_requests", "lmcache_lookup_tokens", "lmcache_lookup_hits"))
        if any(k in v for k in ("lmcache_lookup_requests", "lmcache_lookup_tokens", "lmcache_lookup_hits")) else None,
    )


def _sleep_level(v: dict[str, float]) -> int | None:
    """0 awake, 1 or 2 the sleep level (a sleeping engine whose level is not set: 1),
    None where the engine does not say."""
    states = {state: v["sleep_" + state] for state in SLEEP_STATES if "sleep_" + state in v}
    if not states:
        return None
    if states.get("awake", 0.0) >= 1.0:
        return 0
    asleep = [level for state, level in SLEEP_STATES.items() if level and states.get(state, 0.0) >= 1.0]
    if asleep:
        return max(asleep)
    return 1 if "awake" in states else None


def _ratio_or_none(value: float | None, what: str, warnings: list[str]) -> float | None:
    """Released SGLang and TRT-LLM report their hit-rate gauge as 0-1; a percent came only
    from an unreleased SGLang branch."""
    if value is None or 0.0 <= value <= 1.0:
        return value
    warnings.append(f"{what}: the engine's cache hit rate gauge {value!r} is not a 0-1 ratio (an unreleased build?); ignored")
    return None
