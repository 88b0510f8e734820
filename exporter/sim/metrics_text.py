"""What a simulated replica counted, rendered as the /metrics text of the vLLM generation
(or SGLang) it plays: the names, labels, HELP texts and buckets those engines use."""
from __future__ import annotations

import functools


def _labels(**labels: str | None) -> str:
    return _label_text(tuple(labels.items()))


@functools.lru_cache(maxsize=8192)
def _label_text(labels: tuple[tuple[str, str | None], ...]) -> str:
    """Rendered once per label set: a replica renders the same few hundred sets at every scrape."""
    parts = []
    for k, v in labels:
        if v is None:
            continue
        v = str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        parts.append(f'{k}="{v}"')
    return "{" + ",".join(parts) + "}"


def _fmt(v: float) -> str:
    return repr(float(v))


def _render_sglang(r: "Replica") -> str:
    """SGLang 0.5.x names: tokenizer counters split by is_streaming (and cached tokens by
    cache_source), scheduler gauges with tp_rank; the parser must sum the splits."""
    out: list[str] = []
    add = out.append
    add("# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.")
    add("# TYPE process_start_time_seconds gauge")
    add(f"process_start_time_seconds {_fmt(r.created)}")
    for mi, model in enumerate(r.model_names):
        x = r.engines[mi]
        base = dict(engine_type="unified", model_name=model)
        add("# TYPE sglang:prompt_tokens_total counter")
        add(f"sglang:prompt_tokens_total{_labels(**base, is_streaming='false')} {_fmt(x.prompt_tokens // 3)}")
        add(f"sglang:prompt_tokens_total{_labels(**base, is_streaming='true')} {_fmt(x.prompt_tokens - x.prompt_tokens // 3)}")
        add("# TYPE sglang:cached_tokens_total counter")
        add(f"sglang:cached_tokens_total{_labels(cache_source='device', **base)} {_fmt(x.hits - x.hits // 4)}")
        add(f"sglang:cached_tokens_total{_labels(cache_source='host', **base)} {_fmt(x.hits // 4)}")
        sched = dict(engine_type="unified", model_name=model, pp_rank="0", tp_rank="0")
        add("# TYPE sglang:token_usage gauge")
        add(f"sglang:token_usage{_labels(**sched)} {_fmt(round(x.kv_usage, 2))}")
        add("# TYPE sglang:cache_hit_rate gauge")
        add(f"sglang:cache_hit_rate{_labels(**sched)} {_fmt(x.last_hit_rate)}")
        add("# TYPE sglang:num_queue_reqs gauge")
        add(f"sglang:num_queue_reqs{_labels(**sched)} 0.0")
        add("# TYPE sglang:time_to_first_token_seconds histogram")
        _histogram_lines(add, "sglang:time_to_first_token_seconds", x.hist["ttft"],
                         lambda le, base=base: _labels(**base, is_streaming="true", le=le))
    return "\n".join(out) + "\n"


def _histogram_lines(add, name: str, h: "_Hist", labels_with_le) -> None:
    """The _bucket, _count and _sum lines of one histogram; `labels_with_le(le)` renders
    the label set, `le` None for _count and _sum."""
    cum = 0
    for le, c in zip(h.bounds, h.counts):
        cum += c
        add(f"{name}_bucket{labels_with_le(_fmt(le))} {_fmt(cum)}")
    add(f"{name}_bucket{labels_with_le('+Inf')} {_fmt(h.count)}")
    add(f"{name}_count{labels_with_le(None)} {_fmt(h.count)}")
    add(f"{name}_sum{labels_with_le(None)} {_fmt(h.sum)}")


def render(r: "Replica") -> str:
    g = r.generation
    if g == "sglang":
        return _render_sglang(r)
    out: list[str] = []
    add = out.append
    v1 = g != "v0"
    has_engine = v1
    created = g in ("v0.8", "v0.10", "current")
    rows = []  # (model_name, engine label, _Engine)
    for mi, model in enumerate(r.model_names):
        for e in range(r.n_engines):
            rows.append((model, str(e) if has_engine else None, r.engines[mi * r.n_engines + e]))

    def family(name: str, kind: str, help_text: str, values):
        add(f"# HELP {name} {help_text}")
        add(f"# TYPE {name} {kind}")
        for model, engine, v in values:
            add(f"{name}{_labels(engine=engine, model_name=model)} {_fmt(v)}")

    def counter(name: str, help_text: str, attr: str):
        family(name + "_total", "counter", help_text, [(m, e, getattr(x, attr)) for m, e, x in rows])
        if created:
            family(name + "_created", "gauge", help_text, [(m, e, r.created) for m, e, x in rows])

    def histogram(name: str, help_text: str, key: str):
        add(f"# HELP {name} {help_text}")
        add(f"# TYPE {name} histogram")
        for model, engine, x in rows:
            _histogram_lines(add, name, x.hist[key], lambda le, engine=engine, model=model: _labels(engine=engine, le=le, model_name=model))
        if created:
            family(name + "_created", "gauge", help_text, [(m, e, r.created) for m, e, x in rows])

    add("# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.")
    add("# TYPE process_start_time_seconds gauge")
    add(f"process_start_time_seconds {_fmt(r.created)}")
    caching = r._state["prefix_caching"]
    if g in ("v0.10", "current"):
        add("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
        add("# TYPE vllm:cache_config_info gauge")
        for e in sorted({e for _, e, _ in rows}):
            info = _labels(block_size=str(r.scenario.block_size), cache_dtype="auto", enable_prefix_caching=str(bool(caching)),
                           engine=e, gpu_memory_utilization="0.9", num_gpu_blocks=str(r._state["kv_blocks"]),
                           prefix_caching_hash_algo="sha256")
            add(f"vllm:cache_config_info{info} 1.0")
    family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
           [(m, e, round(x.kv_usage * 20)) for m, e, x in rows])
    family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [(m, e, 0) for m, e, x in rows])
    if g == "current":
        asleep = r._state["sleep"]
        add("# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
            "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.")
        add("# TYPE vllm:engine_sleep_state gauge")
        for model, engine, _ in rows:
            for state, on in (("awake", not asleep), ("weights_offloaded", asleep == 1), ("discard_all", asleep == 2)):
                add(f"vllm:engine_sleep_state{_labels(engine=engine, model_name=model, sleep_state=state)} {_fmt(1.0 if on else 0.0)}")
    if g == "v0":
        family("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.", [(m, e, x.kv_usage) for m, e, x in rows])
        family("vllm:gpu_prefix_cache_hit_rate", "gauge", "GPU prefix cache block hit rate.",
               [(m, e, (x.hit_blocks / x.query_blocks if x.query_blocks else 0.0) if caching else -1) for m, e, x in rows])
        family("vllm:cpu_prefix_cache_hit_rate", "gauge", "CPU prefix cache block hit rate.", [(m, e, 0.0 if caching else -1) for m, e, x in rows])
    if g == "v0.8":
        family("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.", [(m, e, x.kv_usage) for m, e, x in rows])
        counter("vllm:gpu_prefix_cache_queries", "GPU prefix cache queries, in terms of number of queried blocks.", "query_blocks")
        counter("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits, in terms of number of cached blocks.", "hit_blocks")
    if g == "v0.10":
        family("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.", [(m, e, x.kv_usage) for m, e, x in rows])
        counter("vllm:gpu_prefix_cache_queries", "GPU prefix cache queries, in terms of number of queried tokens. DEPRECATED: Use vllm:prefix_cache_queries instead.", "queries")
        counter("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: Use vllm:prefix_cache_hits instead.", "hits")
    if g in ("v0.10", "current"):
        family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", [(m, e, x.kv_usage) for m, e, x in rows])
        counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", "queries")
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", "hits")
    if g == "current":
        family("vllm:external_prefix_cache_queries_total", "counter", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", [(m, e, x.external_queries) for m, e, x in rows])
        family("vllm:external_prefix_cache_hits_total", "counter", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", [(m, e, x.external_hits) for m, e, x in rows])
        counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", "cached_tokens")
        add("# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.")
        add("# TYPE vllm:prompt_tokens_by_source_total counter")
        for model, engine, x in rows:
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
                add(f"vllm:prompt_tokens_by_source_total{_labels(engine=engine, model_name=model, source=source)} {_fmt(getattr(x, source))}")
    counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "preemptions")
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens")
    counter("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens")
    histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft_old" if g == "v0" else "ttft")
    if g == "current":
        for key in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_inference_time_seconds",
                    "request_prefill_time_seconds", "request_decode_time_seconds", "inter_token_latency_seconds",
                    "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total"):
            histogram("vllm:" + key, f"Histogram of {key.replace('_', ' ')}.", key)
    return "\n".join(out) + "\n"
