"""The one table of upstream metric names: every name the parser reads, of every vLLM
generation (each entry noting the versions that export it), SGLang, LMCache, TensorRT-LLM
and the prefix-aware routers, with the role that tells the parser how to file a sample.
exporter/parse/vllm_metrics.py reads only the lines named here.
"""
from __future__ import annotations

# Each entry: exposition name -> (role, field). Roles tell the parser how to file the
# sample; the field is where it lands on SeriesSnapshot or Snapshot.
V0_GPU_HIT_RATE = "vllm:gpu_prefix_cache_hit_rate"
V0_CPU_HIT_RATE = "vllm:cpu_prefix_cache_hit_rate"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
GPU_PREFIX_QUERIES = "vllm:gpu_prefix_cache_queries_total"  # deprecated 0.9.2, gone 0.12
GPU_PREFIX_HITS = "vllm:gpu_prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
TTFT = "vllm:time_to_first_token_seconds"
KV_USAGE = "vllm:kv_cache_usage_perc"  # 0.9.2 on
GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"  # V0 and V1 up to 0.10.x
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached_total"  # 0.16 on
GENERATION_TOKENS = "vllm:generation_tokens_total"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
# sleep mode (--enable-sleep-mode): 1 on the engine's state, 0 on the others; both sleep
# levels discard the KV cache while the process lives on
ENGINE_SLEEP_STATE = "vllm:engine_sleep_state"  # sleep_state=awake|weights_offloaded (level 1)|discard_all (level 2)
CACHE_CONFIG_INFO = "vllm:cache_config_info"
LORA_REQUESTS_INFO = "vllm:lora_requests_info"
PROCESS_START_TIME = "process_start_time_seconds"
# admitted prefill (0.16 on): each request counted once, when its first token is out
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"  # source=local_compute|local_cache_hit|external_kv_transfer
PROMPT_TOKENS_RECOMPUTED = "vllm:prompt_tokens_recomputed_total"  # 0.16-0.19 only
# 0.33 on: cached prompt tokens by tier; `p2p` is KV sent by another replica (P/D), not a hit
PROMPT_TOKENS_CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"  # source=device|host|p2p|disk|external_unspecified
PREFILL_KV_COMPUTED = "vllm:request_prefill_kv_computed_tokens"  # histogram, 0.13 on
# KV residency (0.12 on, with --kv-cache-metrics; sampled blocks, observed at eviction)
KV_IDLE_BEFORE_EVICT = "vllm:kv_block_idle_before_evict_seconds"  # last access -> eviction
KV_REUSE_GAP = "vllm:kv_block_reuse_gap_seconds"  # between accesses of one block
# SGLang (--enable-metrics): tokenizer counters count at request finish; label model_name
# (old builds: name); sums over cache_source / is_streaming / engine_type
SGLANG_PROMPT_TOKENS = "sglang:prompt_tokens_total"
SGLANG_CACHED_TOKENS = "sglang:cached_tokens_total"  # 0.4.4 on
SGLANG_TTFT = "sglang:time_to_first_token_seconds"
SGLANG_TOKEN_USAGE = "sglang:token_usage"
SGLANG_QUEUE = "sglang:num_queue_reqs"
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_CACHE_HIT_RATE = "sglang:cache_hit_rate"  # the last prefill batch: exported, never a windowed rate
# LMCache inside vLLM's /metrics (multiprocess mode): one series per TP worker, each
# counting the same tokens, so workers are combined with max, never summed
LMCACHE_REQUESTED = "lmcache:num_requested_tokens_total"
LMCACHE_HIT = "lmcache:num_hit_tokens_total"
LMCACHE_LOOKUP_REQUESTS = "lmcache:num_lookup_requests_total"
LMCACHE_LOOKUP_TOKENS = "lmcache:num_lookup_tokens_total"
LMCACHE_LOOKUP_HITS = "lmcache:num_lookup_hits_total"
# TensorRT-LLM `trtllm-serve` (/prometheus/metrics, with return_perf_metrics and
# enable_iter_perf_stats): labels model_name, engine_type. The block counters are
# labelled children created at their first increment, so a declared family with no
# sample yet counts 0 (see TRTLLM_ZERO_WHEN_DECLARED).
TRTLLM_REUSED_BLOCKS = "trtllm_kv_cache_reused_blocks_total"
TRTLLM_MISSED_BLOCKS = "trtllm_kv_cache_missed_blocks_total"
TRTLLM_TOKENS_PER_BLOCK = "trtllm_kv_cache_tokens_per_block"  # blocks -> tokens; KvCacheConfig default 32
TRTLLM_HIT_RATE = "trtllm_kv_cache_hit_rate"  # reused/(reused+missed) since start: exported, never a windowed rate
TRTLLM_TTFT = "trtllm_time_to_first_token_seconds"
TRTLLM_KV_UTILIZATION = "trtllm_kv_cache_utilization"  # used/max blocks, 0-1
TRTLLM_PROMPT_TOKENS = "trtllm_prompt_tokens_total"
TRTLLM_GENERATION_TOKENS = "trtllm_generation_tokens_total"
TRTLLM_RUNNING = "trtllm_num_requests_running"
TRTLLM_WAITING = "trtllm_num_requests_waiting"
TRTLLM_CACHE_HIT_TOKENS = "trtllm_prompt_cache_hit_tokens_total"  # by cache_level and cache_tier (gpu, host, disk...)
# Routers (exporter/alerting/router.py): what a prefix-aware router predicted it would hit.
# The EPP (GIE v0.4.0+; llm-d-router v0.9.0+ adds llm_d_epp_* twins of the same values)
# observes its predicted match once per request, with no labels.
EPP_HIT_RATIO = "inference_extension_prefix_indexer_hit_ratio"  # histogram of ratios
EPP_HIT_BYTES = "inference_extension_prefix_indexer_hit_bytes"  # histogram: matched blocks x block tokens x 4
LLMD_HIT_RATIO = "llm_d_epp_prefix_indexer_hit_ratio"
LLMD_HIT_BYTES = "llm_d_epp_prefix_indexer_hit_bytes"
EPP_INPUT_TOKENS = "inference_objective_input_tokens"  # histogram, model_name/target_model_name: usage.prompt_tokens
LLMD_INPUT_TOKENS = "llm_d_epp_request_input_tokens"
EPP_MODEL_INPUT_TOKENS = "inference_model_input_tokens"  # the same, before InferenceModel became InferenceObjective
# Dynamo's frontend: predicted overlap per routed request; newer builds count tokens per `model` and `phase`
DYNAMO_KV_HIT_RATE = "dynamo_component_router_kv_hit_rate"  # histogram, buckets linear(0, 0.05, 21)
DYNAMO_SELECTED_TOKENS = "dynamo_component_router_kv_selected_cached_prefix_tokens_total"
DYNAMO_INPUT_TOKENS = "dynamo_component_router_input_sequence_tokens"  # histogram

# Counters whose `<name>_created` sample marks when the series began: a changed value
# is a restart. The queries counters move on every request, so they are the ones read.
CREATED_OF = {
    "vllm:prefix_cache_queries_created": "new",
    "vllm:gpu_prefix_cache_queries_created": "deprecated",
}

ROLE_BY_NAME: dict[str, tuple[str, str]] = {
    V0_GPU_HIT_RATE: ("gauge", "v0_gpu_hit_rate"),
    V0_CPU_HIT_RATE: ("gauge", "v0_cpu_hit_rate"),
    PREFIX_QUERIES: ("counter", "queries"),
    PREFIX_HITS: ("counter", "hits"),
    GPU_PREFIX_QUERIES: ("counter", "gpu_queries"),
    GPU_PREFIX_HITS: ("counter", "gpu_hits"),
    EXTERNAL_QUERIES: ("counter", "external_queries"),
    EXTERNAL_HITS: ("counter", "external_hits"),
    TTFT + "_bucket": ("bucket", "ttft"),
    TTFT + "_sum": ("counter", "ttft_sum"),
    TTFT + "_count": ("counter", "ttft_count"),
    KV_USAGE: ("gauge", "kv_usage"),
    GPU_CACHE_USAGE: ("gauge", "gpu_cache_usage"),
    PREEMPTIONS: ("counter", "preemptions"),
    PROMPT_TOKENS: ("counter", "prompt_tokens"),
    PROMPT_TOKENS_CACHED: ("counter", "prompt_tokens_cached"),
    GENERATION_TOKENS: ("counter", "generation_tokens"),
    REQUESTS_RUNNING: ("gauge", "requests_running"),
    REQUESTS_WAITING: ("gauge", "requests_waiting"),
    ENGINE_SLEEP_STATE: ("by_sleep_state", "sleep_"),
    CACHE_CONFIG_INFO: ("info", "cache_config"),
    LORA_REQUESTS_INFO: ("info", "lora"),
    PROCESS_START_TIME: ("process", "process_start_time"),
    **{name: ("created", kind) for name, kind in CREATED_OF.items()},
    PROMPT_TOKENS_BY_SOURCE: ("by_source", "source_"),
    PROMPT_TOKENS_CACHED_BY_SOURCE: ("by_cached_source", "cached_source_"),
    PROMPT_TOKENS_RECOMPUTED: ("counter", "prompt_tokens_recomputed"),
    KV_IDLE_BEFORE_EVICT + "_bucket": ("hist_bucket", "idle_before_evict"),
    KV_IDLE_BEFORE_EVICT + "_sum": ("counter", "idle_before_evict_sum"),
    KV_IDLE_BEFORE_EVICT + "_count": ("counter", "idle_before_evict_count"),
    KV_REUSE_GAP + "_bucket": ("hist_bucket", "reuse_gap"),
    KV_REUSE_GAP + "_sum": ("counter", "reuse_gap_sum"),
    KV_REUSE_GAP + "_count": ("counter", "reuse_gap_count"),
    PREFILL_KV_COMPUTED + "_sum": ("counter", "prefill_kv_computed_sum"),
    PREFILL_KV_COMPUTED + "_count": ("counter", "prefill_kv_computed_count"),
    SGLANG_PROMPT_TOKENS: ("sum", "sglang_prompt_tokens"),
    SGLANG_CACHED_TOKENS: ("sum", "sglang_cached_tokens"),
    SGLANG_TTFT + "_bucket": ("bucket_sum", "ttft"),
    SGLANG_TTFT + "_sum": ("sum", "ttft_sum"),
    SGLANG_TTFT + "_count": ("sum", "ttft_count"),
    SGLANG_TOKEN_USAGE: ("gauge_max", "kv_usage"),
    SGLANG_QUEUE: ("sum", "requests_waiting"),
    SGLANG_RUNNING: ("sum", "requests_running"),
    SGLANG_CACHE_HIT_RATE: ("gauge_max", "engine_hit_rate"),
    LMCACHE_REQUESTED: ("max", "lmcache_requested"),
    LMCACHE_HIT: ("max", "lmcache_hit"),
    LMCACHE_LOOKUP_REQUESTS: ("max", "lmcache_lookup_requests"),
    LMCACHE_LOOKUP_TOKENS: ("max", "lmcache_lookup_tokens"),
    LMCACHE_LOOKUP_HITS: ("max", "lmcache_lookup_hits"),
    TRTLLM_REUSED_BLOCKS: ("sum", "trtllm_reused"),
    TRTLLM_MISSED_BLOCKS: ("sum", "trtllm_missed"),
    TRTLLM_TOKENS_PER_BLOCK: ("gauge_max", "trtllm_tokens_per_block"),
    TRTLLM_HIT_RATE: ("gauge_max", "engine_hit_rate"),
    TRTLLM_TTFT + "_bucket": ("bucket_sum", "ttft"),
    TRTLLM_TTFT + "_sum": ("sum", "ttft_sum"),
    TRTLLM_TTFT + "_count": ("sum", "ttft_count"),
    TRTLLM_KV_UTILIZATION: ("gauge_max", "kv_usage"),
    TRTLLM_PROMPT_TOKENS: ("sum", "prompt_tokens"),
    TRTLLM_GENERATION_TOKENS: ("sum", "generation_tokens"),
    TRTLLM_RUNNING: ("sum", "requests_running"),
    TRTLLM_WAITING: ("sum", "requests_waiting"),
    TRTLLM_CACHE_HIT_TOKENS: ("tier", "cache_tier"),
    EPP_HIT_RATIO + "_sum": ("router", "epp.ratio_sum.old"),
    EPP_HIT_RATIO + "_count": ("router", "epp.ratio_count.old"),
    EPP_HIT_BYTES + "_sum": ("router", "epp.predicted_bytes.old"),
    LLMD_HIT_RATIO + "_sum": ("router", "epp.ratio_sum.new"),
    LLMD_HIT_RATIO + "_count": ("router", "epp.ratio_count.new"),
    LLMD_HIT_BYTES + "_sum": ("router", "epp.predicted_bytes.new"),
    EPP_INPUT_TOKENS + "_sum": ("router", "epp.input_tokens.old"),
    LLMD_INPUT_TOKENS + "_sum": ("router", "epp.input_tokens.new"),
    EPP_MODEL_INPUT_TOKENS + "_sum": ("router", "epp.input_tokens.older"),
    DYNAMO_KV_HIT_RATE + "_sum": ("router", "dynamo.ratio_sum.new"),
    DYNAMO_KV_HIT_RATE + "_count": ("router", "dynamo.ratio_count.new"),
    DYNAMO_SELECTED_TOKENS: ("router", "dynamo.predicted_tokens.new"),
    DYNAMO_INPUT_TOKENS + "_sum": ("router", "dynamo.input_tokens.new"),
}
ENGINE_PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "trtllm_": "trtllm"}
# A family declared by `# TYPE` but without a sample yet has counted nothing: TRT-LLM
# creates these children at their first increment (no hit yet: no reused sample).
TRTLLM_ZERO_WHEN_DECLARED = {"trtllm_kv_cache_reused_blocks": "trtllm_reused", "trtllm_kv_cache_missed_blocks": "trtllm_missed"}
DECLARED_FAMILY = {n: n for n in TRTLLM_ZERO_WHEN_DECLARED} | {n + "_total": n for n in TRTLLM_ZERO_WHEN_DECLARED}  # TYPE names either
BY_SOURCE = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_BY_SOURCE = ("device", "host", "p2p", "disk", "external_unspecified")
SLEEP_STATES = {"awake": 0, "weights_offloaded": 1, "discard_all": 2}  # the sleep level each state means
# HELP lines are read for these only: the 0.7.3-0.8.x `gpu_` pair counts blocks, the
# 0.9.x pair counts tokens, and HELP is the only place the text says which.
UNIT_FROM_HELP = {GPU_PREFIX_QUERIES, GPU_PREFIX_HITS}

# What a current vLLM (0.32) exposes that the parser knowingly leaves out, by family (the
# name without _total, _bucket, _sum, _count, _created), each with why. tests/test_real_vllm.py
# reads a real engine's /metrics and fails on a vLLM family neither read nor listed here:
# a prefix or KV family a new release adds is a decision, never an oversight.
IGNORED_FAMILIES: dict[str, str] = {
    "vllm:admission_rejections": "requests refused before scheduling (a queue limit): load, not the cache",
    "vllm:corrupted_requests": "requests with NaN logits: the model, not the cache",
    "vllm:e2e_request_latency_seconds": "whole-request latency: TTFT is the prefill's, and the one read",
    "vllm:inter_token_latency_seconds": "decode speed: the cache saves prefill, not decode",
    "vllm:iteration_tokens": "the histogram vllm:iteration_tokens_total, tokens per engine step: batching, not reuse",
    "vllm:kv_block_lifetime_seconds": "a sampled block's life from allocation to eviction: the idle and reuse-gap histograms "
                                      "answer whether blocks go before their reuse",
    "vllm:mm_cache_hits": "the multimodal processor's input cache (images, audio), not the prefix cache",
    "vllm:mm_cache_queries": "the multimodal processor's input cache (images, audio), not the prefix cache",
    "vllm:num_requests_kv_fetch_by_stage": "a KV connector's fetch stages (P/D): its hits are read from external_prefix_cache_*",
    "vllm:num_requests_waiting_by_reason": "why requests wait (capacity, deferred): num_requests_waiting and preemptions "
                                           "already say the KV cache is full",
    "vllm:request_decode_time_seconds": "decode time: the cache saves prefill",
    "vllm:request_generation_tokens": "output length per request",
    "vllm:request_inference_time_seconds": "prefill plus decode per request: TTFT is read",
    "vllm:request_max_num_generation_tokens": "a request parameter",
    "vllm:request_num_preemptions": "per-request preemptions: num_preemptions_total is read",
    "vllm:request_params_max_tokens": "a request parameter",
    "vllm:request_params_n": "a request parameter",
    "vllm:request_prefill_time_seconds": "prefill time after scheduling: TTFT, read, includes the queue a user waits in",
    "vllm:request_prompt_tokens": "prompt length per request: prompt_tokens_total is read",
    "vllm:request_queue_time_seconds": "queueing: load, not the cache",
    "vllm:request_success": "finished requests by reason",
    "vllm:request_time_per_output_token_seconds": "decode speed",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "speculative decoding",
    "vllm:watermark_requests": "requests held at the KV watermark: preemptions and waiting already show the pressure",
    "vllm:estimated_flops_per_gpu": "a model-FLOPs estimate (--enable-mfu-metrics)",
    "vllm:estimated_read_bytes_per_gpu": "a memory-traffic estimate (--enable-mfu-metrics)",
    "vllm:estimated_write_bytes_per_gpu": "a memory-traffic estimate (--enable-mfu-metrics)",
}
FAMILY_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def family_of(name: str) -> str:
    """A sample's or `# TYPE` line's name without the suffixes its type adds (a counter's
    or histogram's `_created` beside one of the others)."""
    name = name.removesuffix("_created")
    for suffix in FAMILY_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


# Every sample name the parser reads, so that both paths read the same table.
SAMPLE_NAMES: tuple[str, ...] = tuple(sorted(ROLE_BY_NAME))
# Fields the parser files that nothing reads on (no rule, window, cause, status or export
# of ours: tests/test_promread.py holds it): load, not the cache. A scrape reads them
# with the body's other lines at no cost; the Prometheus source does not ask for them,
# 3 of a vLLM pod's 45 series that each read made Prometheus select and send.
UNREAD_FIELDS = frozenset({"generation_tokens", "requests_running", "requests_waiting"})
# what the Prometheus source asks Prometheus for (exporter/discovery/promseries.py)
QUERY_NAMES: tuple[str, ...] = tuple(n for n in SAMPLE_NAMES if ROLE_BY_NAME[n][1] not in UNREAD_FIELDS)
# each name's engine, looked up once per sample instead of testing every prefix
ENGINE_OF = {name: next((kind for prefix, kind in ENGINE_PREFIXES.items() if name.startswith(prefix)), None) for name in ROLE_BY_NAME}
# the families those names belong to: what IGNORED_FAMILIES is checked against
READ_FAMILIES = frozenset(family_of(name) for name in ROLE_BY_NAME)
