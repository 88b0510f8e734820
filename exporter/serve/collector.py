"""Our /metrics: a custom Collector over the latest published state.

METRICS is the one table of our metric names. `collect()` builds fresh families from
the state every scrape; it does no I/O and must never raise.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .. import __version__
from ..alerting.deploys import SOURCES as DEPLOY_SOURCES
from ..alerting.rollouts import scope_text
from ..config.sections import Target
from ..monitor.targetview import POLL_RESULTS
from ..monitor.targetview import TargetView
from ..parse import roles, tiers
from ..parse.vllm_metrics import REJECT_REASONS
from ..peers.urls import redact_url
from ..series import hitratio
from ..series.blockindex import top_and_other
from .state import Reading, State

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: str  # gauge | counter | histogram | summary
    help: str
    labels: tuple[str, ...]
    target_labels: bool = True  # a `target` label gets the target's configured extra labels
    # a vLLM engine's own series, one to one (renamed at most): withheld for a vLLM pod read from a
    # Prometheus, which holds them under vLLM's names; not those we convert, fill in or sum
    # (the lookup pair's unit and gpu_ fallback, LMCache's tiers, other engines' sums)
    as_read: bool = False

    @property
    def exposed_name(self) -> str:
        return self.name + ("_total" if self.kind == "counter" else "")


def _m(name: str, kind: str, help_text: str, *labels: str, target_labels: bool = True, as_read: bool = False) -> MetricDef:
    return MetricDef("prefixcache_" + name, kind, help_text, labels, target_labels, as_read)


_W = "over the sliding window in label `window` (configured: {windows})"
# name -> definition. Labels after `target` get the target's configured extra labels.
METRICS: dict[str, MetricDef] = {d.name: d for d in (
    _m("build_info", "gauge", "Build information of vllm-prefix-cache-exporter; value 1.", "version"),
    _m("config_last_reload_successful", "gauge", "1 if the last configuration load succeeded; a failed reload keeps the old config."),
    _m("config_last_reload_success_timestamp_seconds", "gauge", "Unix time of the last successful configuration load."),
    _m("target_up", "gauge", "1 if the last poll of the vLLM target returned vLLM metrics, else 0.", "target"),
    _m("scrape_duration_seconds", "gauge", "Duration of the last poll of the vLLM target's /metrics.", "target"),
    _m("last_scrape_success_timestamp_seconds", "gauge", "Unix time of the last successful poll of the target.", "target"),
    _m("scrapes", "counter", f"Polls of the vLLM target by result ({', '.join(POLL_RESULTS)}).", "target", "result"),
    _m("skipped_polls", "counter", "Polls of the target not started when due: its last poll was still running, or every worker for slow and new targets was busy (logged once when skipping starts and once when it ends).", "target"),
    _m("parse_warnings", "gauge", "Warnings about the last /metrics body: lines the parser could not use, counters stepping back (the log and status page show the first 100).", "target"),
    _m("rejected_samples", "counter", "Samples of the target refused, by `reason`: non_finite_counter, negative_counter (a counter of +Inf, NaN or below zero would poison every window), counter_too_large (above 2**53, where a float loses whole increments: a reset after it would quantize every later window), non_finite_start_time (a NaN start time would be a restart every poll), counter_step_back (a counter a little below its last value with no restart: held, never a reset), flapping_start_time (start times that go back or change every few polls: one URL in front of several processes; not restarts, no cold-start grace), label_value_too_long (a label value over 1024 characters, which would be one of our labels), future_timestamp and non_finite_timestamp (central mode: a sample Prometheus answered after the query's time or at no finite time, which would be the pod's newest for good).", "target", "reason"),
    _m("collect_errors", "counter", "Renders of this /metrics that failed (the request got HTTP 500; see the log)."),
    _m("rule_evaluation_errors", "counter", "Rule evaluations that failed with an internal error (see the log)."),
    _m("clock_steps_back", "counter", "Polls that saw the wall clock step back (NTP, VM migration); logged."),
    _m("history_samples", "gauge", "Samples kept in the target's window history (bounded by the longest window).", "target"),
    _m("prefix_caching_enabled", "gauge", "1 if vLLM reports prefix caching on (cache_config_info or V0 gauge), 0 if off; absent if unknown.", "target"),
    _m("block_size_tokens", "gauge", "KV-cache block size from vllm:cache_config_info; only full blocks can be hit.", "target"),
    # raw counters, re-exported so PromQL can recompute every derived value
    _m("vllm_prefix_cache_queries", "counter", "vLLM prefix-cache queries as read from the target (vllm:prefix_cache_queries_total or the gpu_ pair), in `unit`.", "target", "model_name", "engine", "unit"),
    _m("vllm_prefix_cache_hits", "counter", "vLLM prefix-cache hits as read from the target, in `unit`.", "target", "model_name", "engine", "unit"),
    _m("vllm_external_prefix_cache_queries", "counter", "vLLM external (KV connector) prefix-cache queries, tokens.", "target", "model_name", "engine"),
    _m("vllm_external_prefix_cache_hits", "counter", "vLLM external (KV connector) prefix-cache hits, tokens.", "target", "model_name", "engine"),
    _m("vllm_prompt_tokens", "counter", "vLLM prompt tokens processed, as read from the target.", "target", "model_name", "engine", as_read=True),
    _m("vllm_preemptions", "counter", "vLLM preemptions, as read from the target.", "target", "model_name", "engine", as_read=True),
    _m("vllm_time_to_first_token_seconds", "histogram", "vLLM time-to-first-token histogram as read from the target (buckets as vLLM sets them).", "target", "model_name", "engine", as_read=True),
    _m("vllm_kv_cache_usage_ratio", "gauge", "vLLM KV-cache usage, 0-1 (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc).", "target", "model_name", "engine"),
    _m("vllm_prompt_tokens_by_source", "counter", "vLLM 0.16+ admitted prefill: prompt tokens by `source` (local_compute, local_cache_hit, external_kv_transfer), counted once per request when its first token is out.", "target", "model_name", "engine", "source", as_read=True),
    _m("vllm_prompt_tokens_cached", "counter", "vLLM 0.16+ admitted prefill: cached prompt tokens (local + external).", "target", "model_name", "engine", as_read=True),
    _m("cached_tokens_by_tier", "counter", "Cached prompt tokens by cache `tier` as the engine counts them: device, host, storage/disk, unattributed (SGLang's cache_source=total fallback), p2p (vLLM 0.33: KV another replica sent, a transfer); SGLang cached_tokens_total, vLLM prompt_tokens_cached_by_source, TensorRT-LLM prompt_cache_hit_tokens_total.", "target", "model_name", "engine", "tier"),
    _m("vllm_kv_block_idle_before_evict_seconds", "histogram", "vLLM 0.12+ with --kv-cache-metrics: how long sampled KV blocks sat unused before eviction, as read from the target.", "target", "model_name", "engine", as_read=True),
    _m("vllm_kv_block_reuse_gap_seconds", "histogram", "vLLM 0.12+ with --kv-cache-metrics: gaps between uses of one sampled KV block, as read from the target.", "target", "model_name", "engine", as_read=True),
    _m("kv_evicted_before_reuse", "gauge", "1 if sampled KV blocks are evicted sooner (median idle time before eviction) than they are typically reused (median reuse gap), since the engine started: direct evidence of eviction pressure; 0 if not; absent without vLLM's residency histograms.", "target", "model_name", "engine"),
    _m("engine_sleep_level", "gauge", "vLLM sleep mode (vllm:engine_sleep_state): 0 awake, 1 asleep with its weights offloaded, 2 asleep with its weights discarded; both levels discard the KV cache, so a wake is a cold start. An engine asleep serves nothing and is not down; absent where vLLM does not say.", "target", "model_name", "engine"),
    _m("engine_cache_hit_rate", "gauge", "The engine's own hit-rate gauge: SGLang's sglang:cache_hit_rate (the LAST prefill batch, or since start in old versions), TensorRT-LLM's trtllm_kv_cache_hit_rate (blocks since start); never a windowed rate; exported as read, never alerted on.", "target", "model_name"),
    _m("decode_target", "gauge", "1 if the target is a prefill/decode decode pod, from its `role: decode` label or its shape (90%+ of prompt tokens since start arrived as KV transfer), else 0: its transfers are not hits, and the hit-rate rules and the fleet leave it out.", "target"),
    _m("target_engine_info", "gauge", "Which engine's metric names the target serves (`engine`: vllm, sglang or trtllm); value 1.", "target", "engine"),
    _m("vllm_hit_ratio_since_start", "gauge", "V0 engines only: vLLM's block hit rate averaged since start (vllm:gpu_prefix_cache_hit_rate); no window can be derived from it.", "target", "model_name", as_read=True),
    # vLLM's KV cache events (targets[].kv_events), over the shortest configured window
    _m("kv_events_connected", "gauge", "1 while the target's KV event publisher is connected (targets[].kv_events).", "target"),
    _m("kv_events_last_batch_timestamp_seconds", "gauge", "Unix time the newest KV event batch arrived: an old one with prefill going on is a silent publisher, not a cache without misses.", "target"),
    _m("kv_events_batches", "counter", "KV event batches by `result`: received, replayed (a sequence gap asked of the replay socket), dropped (a gap it did not fill), decode_error (garbage or over a cap), shed (over the decoding budget of a flood).", "target", "result"),
    _m("kv_events_publisher_restarts", "counter", "KV event publishers that started their sequence again: a new vLLM process, its cache empty.", "target"),
    _m("kv_events_indexed_blocks", "gauge", "Blocks in the target's KV event index (kv_events.index_blocks caps it, oldest dropped first).", "target"),
    _m("kv_new_tokens_per_second", "gauge", "Prompt tokens per second vLLM computed and stored (its cache missed them), by `prompt_group` (requests whose first blocks match, or differ only in a short span such as a timestamp; `prompt_prefix`: its text where it differs from the other groups; top kv_events.top_groups, the rest \"other\").", "target", "prompt_group", "prompt_prefix"),
    _m("kv_new_tokens_per_second_by_cache_salt", "gauge", "Prompt tokens per second computed and stored, by the requests' `cache_salt` (a tenant; top kv_events.top_groups, the rest \"other\").", "target", "cache_salt"),
    _m("kv_new_tokens_per_second_by_lora", "gauge", "Prompt tokens per second computed and stored, by LoRA adapter (`lora_adapter`; top kv_events.top_groups, the rest \"other\").", "target", "lora_adapter"),
    _m("kv_missed_requests_ratio", "gauge", "Of the requests that stored new blocks, the share by `miss_kind`: first_block_new (even their first block missed), volatile (a block differing from a cached one in a few tokens: a value that changes per request).", "target", "miss_kind"),
    _m("kv_restored_blocks_ratio", "gauge", "Of the blocks stored, the share removed from the cache shortly before (kv: evicted before their reuse).", "target"),
    # derived per window
    _m("hit_ratio", "gauge", "Token-weighted prefix-cache hit ratio increase(hits)/increase(queries), summed over engines, " + _W + "; absent below global.min_query_tokens.", "target", "model_name", "window"),
    _m("query_tokens_per_second", "gauge", "Prefix-cache query tokens per second " + _W + " (a block-counting target's blocks times its block size).", "target", "model_name", "window"),
    _m("hit_tokens_per_second", "gauge", "Prefix-cache hit tokens per second " + _W + " (a block-counting target's blocks times its block size).", "target", "model_name", "window"),
    _m("recomputed_tokens_per_second", "gauge", "Prompt tokens per second that missed the prefix cache and were prefilled again " + _W + ".", "target", "model_name", "window"),
    _m("admitted_hit_ratio", "gauge", "Token-weighted hit ratio from the admitted-prefill counters (vLLM 0.16+: local cache hits / prompt tokens, each request counted once when scheduled) " + _W + "; the rules judge it, with what other tiers brought, as prefixcache_effective_hit_ratio.", "target", "model_name", "window"),
    _m("effective_hit_ratio", "gauge", "Token-weighted hit ratio of every cache tier: prompt tokens served from the GPU prefix cache or brought by a KV connector or offload tier, over the prompt tokens queried, summed over engines, " + _W + "; from the admitted-prefill counters where the engine has them; the ratio the rules judge; absent below global.min_query_tokens.", "target", "model_name", "window"),
    _m("tier_hit_ratio", "gauge", "The share of queried prompt tokens each cache `tier` served " + _W + ": device (the GPU prefix cache), external (a KV connector: vllm:external_prefix_cache_hits or prompt_tokens_by_source external_kv_transfer; p2p and tiers of other names too), host, storage (disk too), unattributed (SGLang's cache_source=total); they add up to prefixcache_effective_hit_ratio; only where more than one tier served tokens in a window kept (a tier that stopped shows 0 until it leaves the longest window).", "target", "model_name", "window", "tier"),
    _m("hit_ratio_disagreement", "gauge", "prefixcache_hit_ratio (lookups) minus prefixcache_admitted_hit_ratio " + _W + ": far from 0, the engine's counters disagree (retry over-count, hits not recorded).", "target", "model_name", "window"),
    _m("external_hit_ratio", "gauge", "External (KV connector) prefix-cache hit ratio " + _W + ".", "target", "model_name", "window"),
    _m("ttft_seconds", "summary", "Time to first token: `quantile` is histogram_quantile over vLLM's bucket increase " + _W + "; _sum and _count are vLLM's cumulative totals, summed over engines.", "target", "model_name", "window"),
    _m("ttft_mean_seconds", "gauge", "Mean time to first token " + _W + ".", "target", "model_name", "window"),
    _m("ttft_hit_ratio_correlation", "gauge", "Pearson correlation between per-poll hit ratio and per-poll mean TTFT " + _W + "; negative means misses cost latency.", "target", "model_name", "window"),
    _m("ttft_change_per_10pt_hit_ratio_seconds", "gauge", "Fitted change of mean TTFT when the hit ratio rises by 10 percentage points " + _W + ".", "target", "model_name", "window"),
    _m("kv_cache_usage_max_ratio", "gauge", "Highest KV-cache usage seen " + _W + ".", "target", "model_name", "window"),
    # a prefix-aware router's prediction (target: the router; model_name "" where it names no model: the pool)
    _m("predicted_hit_ratio", "gauge", "Prefix-cache hit ratio the router (llm-d EPP, Dynamo) predicted at routing time " + _W + "; `weighting` is tokens (predicted tokens / input tokens) or per_request_mean (the mean of its per-request ratio histogram).", "target", "model_name", "window", "weighting"),
    _m("router_delivered_hit_ratio", "gauge", "What the engine targets delivered for the router's model (all models for model_name \"\") " + _W + ": token-weighted hits / queries over every engine target, beside prefixcache_predicted_hit_ratio.", "target", "model_name", "window"),
    # rules and deploys
    _m("alert_state", "gauge", "1 for each alert of ours that is not inactive, by `state` (pending, firing, inconclusive: too few tokens to judge); `version` names the version a fleet alert judges (target is then empty) and `scope` the replicas it judges, by analysis.scope_labels (namespace=prod,owner=vllm; empty for a target's alert).", "alertname", "target", "model_name", "cause", "severity", "state", "version", "scope", target_labels=False),
    _m("deploy_events", "counter", "Deploy events and the other events the rules weigh, by `source`: api, annotations_file, config_change, change_point (deploys); restart, sleep and wake (vLLM's sleep mode: a wake is a cold start), replicas (the number of replicas serving a model changed: an event of every replica of it, with an empty target); with the target's labels; target is empty for fleet-wide events.", "target", "source"),
    _m("last_deploy_timestamp_seconds", "gauge", "Unix time of the newest deploy event (restarts excluded), for Grafana annotations, with the target's labels; target is empty for fleet-wide events.", "target"),
    # delivery to Alertmanager
    _m("alertmanager_notifications", "counter", "POSTs to Alertmanager's /api/v2/alerts by `result`: success; failure (kept and retried); rejected (a 4xx answer: the batch is dropped, see the log).", "alertmanager", "result"),
    _m("alertmanager_alerts_sent", "counter", "Alerts delivered to Alertmanager (firing, re-sent and resolved).", "alertmanager"),
    _m("alertmanager_queue_length", "gauge", "Alerts waiting for delivery to the Alertmanager (latest state per alert).", "alertmanager"),
    _m("alertmanager_dropped_alerts", "counter", "Alerts dropped because the delivery queue was full.", "alertmanager"),
    _m("alertmanager_last_success_timestamp_seconds", "gauge", "Unix time of the last successful delivery to the Alertmanager.", "alertmanager"),
    _m("alertmanagers_discovered", "gauge", "Alertmanagers that get our alerts: each configured URL whose host is an address, and every address of a URL's name (re-resolved every alertmanager.refresh_interval); absent without alertmanager.urls. 0: every alert waits."),
    # service discovery (central mode)
    _m("polled_targets", "gauge", "Targets this process polls: static and discovered, in its shard."),
    _m("discovery_targets", "gauge", "Targets the discovery `source` (prometheus, file_sd) gave; its last good list while it fails.", "source"),
    _m("discovery_last_refresh_successful", "gauge", "1 if the last refresh of the discovery `source` succeeded; while 0 its last good targets are kept (see the log).", "source"),
    _m("discovery_last_success_timestamp_seconds", "gauge", "Unix time of the last successful refresh of the discovery `source`.", "source"),
    _m("discovery_refresh_failures", "counter", "Refreshes of the discovery `source` that failed (unreachable Prometheus, malformed file_sd file, ...).", "source"),
    _m("discovery_matched_nothing", "gauge", "1 while every answer of the discovery `source` since start held no target of ours: far more often a wrong selector (match_labels, job, scrape_pool) than an empty fleet; the log names what the answer held.", "source"),
    _m("discovery_dropped", "gauge", "What the last answer of the discovery `source` had over a limit and was dropped, by `reason`: target_limit, url_length_limit (targets), label_limit, label_value_length_limit, invalid_label_name (labels).", "source", "reason"),
    _m("task_runs", "counter", "Runs of the sidecar's periodic `task` that ended: read (the Prometheus source's reads), evaluate (the rules), discover (discovery refreshes).", "task"),
    _m("task_runs_missed", "counter", "Runs of the periodic `task` not started when due because its last run still ran (logged once when it falls behind and once when it keeps its interval again): its samples and alerts come later, none is lost.", "task"),
    _m("task_last_duration_seconds", "gauge", "How long the last run of the periodic `task` took; over prefixcache_task_interval_seconds, runs are missed.", "task"),
    _m("task_interval_seconds", "gauge", "Seconds between the runs the periodic `task` is due (global.poll_interval; discovery.refresh_interval).", "task"),
    # warm-up after a (re)start
    _m("warmup_requests", "counter", "Warm-up requests sent to the local vLLM by `result` (success, http_error, timeout, connection_error, cancelled).", "result"),
    _m("warmup_running", "gauge", "1 while a warm-up runs."),
    _m("warmup_done", "gauge", "1 once a warm-up finished since the last start or restart of vLLM; /-/ready waits for it when gated."),
    _m("warmup_runs", "counter", "Warm-ups finished."),
    _m("warmup_last_duration_seconds", "gauge", "Duration of the last warm-up."),
    _m("warmup_last_failed_requests", "gauge", "Requests of the last warm-up that failed."),
)}


def _fmt_window_help(help_text: str, windows: str) -> str:
    return help_text.replace("{windows}", windows)


class PrefixCacheCollector(Collector):
    def __init__(self, state: State, windows: Iterable[str], top_groups: int = 10):
        self.state = state
        self.top_groups = top_groups
        self.windows = ", ".join(windows)

    def describe(self) -> list[Metric]:
        """Every family we may expose, without samples: the registry checks them against
        every other collector's names (process_*, python_gc_*) without calling collect()."""
        return [Metric(d.name, d.help, d.kind) for d in METRICS.values()]

    def collect(self) -> Iterator[Metric]:
        """Raises on a bug: the HTTP layer turns that into a 500, a log line and a count,
        which a silent empty answer would hide."""
        reading = self.state.read()  # once: every family of a render from the same moment
        fams = Families(self.windows, label_names(reading))
        self._fill(fams, reading)
        yield from fams.done()

    def _fill(self, f: "Families", reading: Reading) -> None:
        self.head(f, reading)
        p = reading.published
        for view in sorted(reading.targets, key=lambda v: v.target.name):
            self.target(f, view, *self.per_target(p, view.target.name))
        self.tail(f, reading)

    @staticmethod
    def per_target(p, name: str) -> tuple:
        """What a target's families read besides its view: (skipped polls, deploy counts by
        source, newest deploy time, whether a vLLM engine's own series are exported: last,
        as it says which families the target has); with the view, the key of its cached
        fragment."""
        counts = p.deploys.counts.get(name) if p.deploys is not None else None
        last = p.deploys.last.get(name) if p.deploys is not None else None
        return p.skipped_polls.get(name, 0), counts, last, name not in p.engine_series_withheld

    @staticmethod
    def _engine_series(f: "Families", s, engine: str, t: Target, as_read: bool) -> None:
        """A series' values as the engine counted them; those of METRICS' `as_read` families
        only with `as_read`."""
        pc, ext = s.prefix_cache, s.external_prefix_cache
        if pc is not None:
            if pc.queries is not None:
                f.add("prefixcache_vllm_prefix_cache_queries", (s.model_name, engine, pc.unit), pc.queries, target=t)
            if pc.hits is not None:
                f.add("prefixcache_vllm_prefix_cache_hits", (s.model_name, engine, pc.unit), pc.hits, target=t)
        if ext is not None:
            if ext.queries is not None:
                f.add("prefixcache_vllm_external_prefix_cache_queries", (s.model_name, engine), ext.queries, target=t)
            if ext.hits is not None:
                f.add("prefixcache_vllm_external_prefix_cache_hits", (s.model_name, engine), ext.hits, target=t)
        if s.kv_cache_usage is not None:
            f.add("prefixcache_vllm_kv_cache_usage_ratio", (s.model_name, engine), s.kv_cache_usage, target=t)
        if s.engine_hit_rate is not None:
            f.add("prefixcache_engine_cache_hit_rate", (s.model_name,), s.engine_hit_rate, target=t)
        for tier, value in s.cached_tokens_by_tier or ():
            f.add("prefixcache_cached_tokens_by_tier", (s.model_name, engine, tier), value, target=t)
        if not as_read:
            return
        for name, value in (("prefixcache_vllm_prompt_tokens", s.prompt_tokens), ("prefixcache_vllm_preemptions", s.preemptions)):
            if value is not None:
                f.add(name, (s.model_name, engine), value, target=t)
        if s.hit_rate_since_start is not None:
            f.add("prefixcache_vllm_hit_ratio_since_start", (s.model_name,), s.hit_rate_since_start, target=t)
        for source, value in s.prompt_tokens_by_source or ():
            f.add("prefixcache_vllm_prompt_tokens_by_source", (s.model_name, engine, source), value, target=t)
        if s.prompt_tokens_cached is not None:
            f.add("prefixcache_vllm_prompt_tokens_cached", (s.model_name, engine), s.prompt_tokens_cached, target=t)
        for name, hist in (("prefixcache_vllm_kv_block_idle_before_evict_seconds", s.kv_idle_before_evict),
                           ("prefixcache_vllm_kv_block_reuse_gap_seconds", s.kv_reuse_gap)):
            if hist is not None and hist.sum is not None:
                f.histogram(name, (s.model_name, engine), hist.buckets, hist.sum, target=t)
        h = s.ttft
        if h is not None and h.buckets and math.isinf(h.buckets[-1][0]) and h.sum is not None:
            f.histogram("prefixcache_vllm_time_to_first_token_seconds", (s.model_name, engine), h.buckets, h.sum, target=t)

    def head(self, f: "Families", reading: Reading) -> None:
        """The process's families before the targets' (build, reload, error counters)."""
        p = reading.published
        f.add("prefixcache_build_info", (__version__,), 1.0, target=None)
        f.add("prefixcache_config_last_reload_successful", (), 1.0 if p.config_reload_success else 0.0, target=None)
        if p.config_reload_time is not None:
            f.add("prefixcache_config_last_reload_success_timestamp_seconds", (), p.config_reload_time, target=None)
        f.add("prefixcache_collect_errors", (), p.counters.collect_errors, target=None)
        f.add("prefixcache_rule_evaluation_errors", (), p.counters.evaluation_errors, target=None)
        f.add("prefixcache_clock_steps_back", (), p.counters.clock_steps_back, target=None)

    def tail(self, f: "Families", reading: Reading) -> None:
        """The families after the targets': alerts, fleet-wide deploys, discovery, warm-up,
        routers, Alertmanagers."""
        p = reading.published
        for a in p.alerts or ():
            labels = dict(a.labels)
            f.add("prefixcache_alert_state", (a.alertname, a.target, a.model, labels.get("cause", ""), labels.get("severity", ""), a.state, a.version,
                                              scope_text(a.scope)), 1.0, target=None)
        # from zero for every source, so that increase() sees the first event (each target's are with its families)
        fleet = p.deploys.counts.get("", {}) if p.deploys is not None else {}
        for source in sorted(set(DEPLOY_SOURCES) | set(fleet)):
            f.add("prefixcache_deploy_events", (source,), fleet.get(source, 0), target=_FLEET_WIDE)
        last = p.deploys.last.get("") if p.deploys is not None else None
        if last is not None:
            f.add("prefixcache_last_deploy_timestamp_seconds", (), last, target=_FLEET_WIDE)
        known = {v.target.name: v.target for v in reading.targets}
        f.add("prefixcache_polled_targets", (), len(reading.targets), target=None)
        for src in p.discovery:
            f.add("prefixcache_discovery_targets", (src.name,), len(src.targets), target=None)
            f.add("prefixcache_discovery_last_refresh_successful", (src.name,), 1.0 if src.ok else 0.0, target=None)
            f.add("prefixcache_discovery_refresh_failures", (src.name,), src.failures, target=None)
            if src.answered:  # of its current selection: a reload to a wrong URL has not answered yet
                f.add("prefixcache_discovery_matched_nothing", (src.name,), 0.0 if src.matched_ever else 1.0, target=None)
            for reason, n in src.dropped:
                f.add("prefixcache_discovery_dropped", (src.name, reason), n, target=None)
            if src.last_success is not None:
                f.add("prefixcache_discovery_last_success_timestamp_seconds", (src.name,), src.last_success, target=None)
        for task, stats in sorted(p.tasks.items()):  # from zero, so that increase() sees the first miss
            f.add("prefixcache_task_runs", (task,), stats.runs, target=None)
            f.add("prefixcache_task_runs_missed", (task,), stats.missed, target=None)
            f.add("prefixcache_task_interval_seconds", (task,), stats.interval, target=None)
            if stats.last_seconds is not None:
                f.add("prefixcache_task_last_duration_seconds", (task,), stats.last_seconds, target=None)
        warm = p.warmup
        if warm is not None:
            for result, count in sorted(warm.results.items()):
                f.add("prefixcache_warmup_requests", (result,), count, target=None)
            f.add("prefixcache_warmup_running", (), 1.0 if warm.running else 0.0, target=None)
            f.add("prefixcache_warmup_done", (), 1.0 if warm.done else 0.0, target=None)
            f.add("prefixcache_warmup_runs", (), warm.runs, target=None)
            if warm.last_duration is not None:
                f.add("prefixcache_warmup_last_duration_seconds", (), warm.last_duration, target=None)
                f.add("prefixcache_warmup_last_failed_requests", (), warm.last_failed, target=None)
        for name, models in sorted(p.routing.items()):
            router_target = known.get(name)
            if router_target is None:
                continue  # gone with its target
            for model, by_window in sorted(models.items()):
                for window, (predicted, delivered) in by_window.items():
                    f.add("prefixcache_predicted_hit_ratio", (model, window, predicted.weighting), predicted.ratio, target=router_target)
                    f.add_present("prefixcache_router_delivered_hit_ratio", (model, window), delivered.ratio, target=router_target)
        if p.alertmanagers_discovered is not None:
            f.add("prefixcache_alertmanagers_discovered", (), p.alertmanagers_discovered, target=None)
        for q in p.alertmanager:
            url = redact_url(q.url)
            f.add("prefixcache_alertmanager_notifications", (url, "success"), q.notifications_ok, target=None)
            f.add("prefixcache_alertmanager_notifications", (url, "failure"), q.notifications_failed, target=None)
            f.add("prefixcache_alertmanager_notifications", (url, "rejected"), q.rejected, target=None)
            f.add("prefixcache_alertmanager_alerts_sent", (url,), q.alerts_sent, target=None)
            f.add("prefixcache_alertmanager_queue_length", (url,), q.pending, target=None)
            f.add("prefixcache_alertmanager_dropped_alerts", (url,), q.dropped, target=None)
            if q.last_success is not None:
                f.add("prefixcache_alertmanager_last_success_timestamp_seconds", (url,), q.last_success, target=None)

    def target(self, f: "Families", v: TargetView, skipped: int = 0, deploys=None, last_deploy: float | None = None,
               engine_series: bool = True) -> None:
        """One target's families: its view, its skipped polls, its deploy events (with its
        labels, so that a dashboard filters them; a target that went takes them along);
        a vLLM engine's own series as read (METRICS' `as_read`) unless `engine_series` is False."""
        t = v.target
        f.add("prefixcache_target_up", (), 1.0 if v.up else 0.0, target=t)
        if v.scrape_duration is not None:
            f.add("prefixcache_scrape_duration_seconds", (), v.scrape_duration, target=t)
        if v.last_success_time is not None:
            f.add("prefixcache_last_scrape_success_timestamp_seconds", (), v.last_success_time, target=t)
        scrapes = dict(v.scrapes)
        for result in sorted(set(POLL_RESULTS) | set(scrapes)):  # from zero: increase() sees the first failure
            f.add("prefixcache_scrapes", (result,), scrapes.get(result, 0), target=t)
        f.add("prefixcache_skipped_polls", (), skipped, target=t)
        rejected = dict(v.rejected)
        for reason in sorted(set(REJECT_REASONS) | set(rejected)):
            f.add("prefixcache_rejected_samples", (reason,), rejected.get(reason, 0), target=t)
        f.add("prefixcache_history_samples", (), v.samples_kept, target=t)
        snap = v.snapshot
        if snap is not None:
            f.add("prefixcache_parse_warnings", (), snap.warning_count, target=t)
            if snap.engine_kind is not None:
                f.add("prefixcache_target_engine_info", (snap.engine_kind,), 1.0, target=t)
        if snap is not None or t.labels:
            f.add("prefixcache_decode_target", (), 1.0 if roles.role(t.labels, snap)[0] == roles.DECODE else 0.0, target=t)
        if snap is not None:
            if snap.prefix_caching_enabled is not None:
                f.add("prefixcache_prefix_caching_enabled", (), 1.0 if snap.prefix_caching_enabled else 0.0, target=t)
            if snap.block_size is not None:
                f.add("prefixcache_block_size_tokens", (), snap.block_size, target=t)
        if snap is not None and v.up:
            for s in snap.series:
                engine = s.engine or ""
                self._engine_series(f, s, engine, t, as_read=engine_series or snap.engine_kind != "vllm")
                if s.sleep_level is not None:
                    f.add("prefixcache_engine_sleep_level", (s.model_name, engine), s.sleep_level, target=t)
                pressure = tiers.evicted_before_reuse(s.kv_idle_before_evict, s.kv_reuse_gap)
                if pressure is not None:
                    f.add("prefixcache_kv_evicted_before_reuse", (s.model_name, engine), 1.0 if pressure else 0.0, target=t)
        if v.kv is not None:
            _kv_families(f, v.kv, t, self.top_groups)
        mine = deploys or {}
        for source in sorted(set(DEPLOY_SOURCES) | set(mine)):
            f.add("prefixcache_deploy_events", (source,), mine.get(source, 0), target=t)
        if last_deploy is not None:
            f.add("prefixcache_last_deploy_timestamp_seconds", (), last_deploy, target=t)
        ttft_totals = _ttft_totals(snap) if snap is not None and v.up else {}
        for model, windows in sorted(v.stats.items()):
            tiers_served = hitratio.tiers_in_use(windows.values())
            for window, ws in windows.items():
                labels = (model, window)
                for name, value_of in _WINDOW_GAUGES_BEFORE_TTFT:
                    f.add_present(name, labels, value_of(ws), target=t)
                shares = hitratio.tier_shares(ws) if ws.effective_hit_ratio is not None and len(tiers_served) > 1 else {}
                for tier in sorted(tiers_served) if shares else ():
                    f.add("prefixcache_tier_hit_ratio", (model, window, tier), shares.get(tier, 0.0), target=t)
                totals = ttft_totals.get(model)
                if ws.ttft_quantiles and totals is not None:
                    f.summary("prefixcache_ttft_seconds", labels, sorted(ws.ttft_quantiles.items()), totals, target=t)
                for name, value_of in _WINDOW_GAUGES_AFTER_TTFT:
                    f.add_present(name, labels, value_of(ws), target=t)


_FLEET_WIDE = Target("", "")


def label_names(reading: Reading) -> tuple[str, ...]:
    names: set[str] = set()
    for v in reading.targets:
        names.update(k for k, _ in v.target.labels)
    return tuple(sorted(names))


# derived per-window gauges: (metric, value or None); absent values are not exported
_WINDOW_GAUGES_BEFORE_TTFT = (
    ("prefixcache_hit_ratio", lambda ws: ws.hit_ratio),
    ("prefixcache_query_tokens_per_second", lambda ws: hitratio.token_rates(ws)[0]),
    ("prefixcache_hit_tokens_per_second", lambda ws: hitratio.token_rates(ws)[1]),
    ("prefixcache_recomputed_tokens_per_second", lambda ws: _recomputed(*hitratio.token_rates(ws))),
    ("prefixcache_admitted_hit_ratio", lambda ws: ws.admitted_hit_ratio),
    ("prefixcache_effective_hit_ratio", lambda ws: ws.effective_hit_ratio),
    ("prefixcache_hit_ratio_disagreement",
     lambda ws: ws.hit_ratio - ws.admitted_hit_ratio if ws.hit_ratio is not None and ws.admitted_hit_ratio is not None else None),
    ("prefixcache_external_hit_ratio", lambda ws: ws.external_hit_ratio),
)
_WINDOW_GAUGES_AFTER_TTFT = (
    ("prefixcache_ttft_mean_seconds", lambda ws: ws.ttft_mean),
    ("prefixcache_ttft_hit_ratio_correlation", lambda ws: ws.correlation),
    ("prefixcache_ttft_change_per_10pt_hit_ratio_seconds", lambda ws: ws.ttft_per_10_points),
    ("prefixcache_kv_cache_usage_max_ratio", lambda ws: ws.kv_cache_usage_max),
)


def _recomputed(queries: float | None, hits: float | None) -> float | None:
    return queries - hits if queries is not None and hits is not None else None


def _ttft_totals(snap) -> dict[str, tuple[float, float]]:
    """model -> (count, sum) of vLLM's TTFT histogram, summed over engines."""
    out: dict[str, tuple[float, float]] = {}
    for s in snap.series:
        h = s.ttft
        if h is None or h.count is None or h.sum is None:
            continue
        count, total = out.get(s.model_name, (0.0, 0.0))
        out[s.model_name] = (count + h.count, total + h.sum)
    return out


def _kv_families(f: "Families", kv, t: Target, top: int) -> None:
    f.add("prefixcache_kv_events_connected", (), 1.0 if kv.connected else 0.0, target=t)
    f.add_present("prefixcache_kv_events_last_batch_timestamp_seconds", (), kv.last_message, target=t)
    for result, n in (("received", kv.received), ("replayed", kv.replayed), ("dropped", kv.dropped),
                      ("decode_error", kv.errors), ("shed", kv.shed)):
        f.add("prefixcache_kv_events_batches", (result,), n, target=t)
    f.add("prefixcache_kv_events_publisher_restarts", (), kv.restarts, target=t)
    f.add("prefixcache_kv_events_indexed_blocks", (), dict(kv.size).get("blocks", 0), target=t)
    w = kv.recent
    if w is None:
        return
    span = max(1.0, w.seconds)
    labels = dict(kv.group_labels)
    for group, n in top_and_other(w.counts.by_group, top):
        f.add("prefixcache_kv_new_tokens_per_second", (group, labels.get(group, "")), n / span, target=t)
    for salt, n in top_and_other(w.counts.by_salt, top):
        f.add("prefixcache_kv_new_tokens_per_second_by_cache_salt", (salt,), n / span, target=t)
    for lora, n in top_and_other(w.counts.by_lora, top):
        f.add("prefixcache_kv_new_tokens_per_second_by_lora", (lora,), n / span, target=t)
    if w.counts.stores:
        f.add("prefixcache_kv_missed_requests_ratio", ("first_block_new",), w.counts.new_first / w.counts.stores, target=t)
        f.add("prefixcache_kv_missed_requests_ratio", ("volatile",), w.counts.volatile / w.counts.stores, target=t)
    if w.counts.blocks:
        f.add("prefixcache_kv_restored_blocks_ratio", (), w.counts.restored / w.counts.blocks, target=t)


class Families:
    """Builds families from METRICS; target labels (and configured extras) are added."""

    def __init__(self, windows: str, extra_label_names: tuple[str, ...]):
        self.windows = windows
        self.extra = extra_label_names
        self._fams: dict[str, Metric] = {}
        self._summary_labels: dict[str, list[str]] = {}
        self._label_names: dict[str, list[str]] = {}

    def label_names(self, name: str) -> list[str]:
        """The metric's label names, a target's configured extras right after `target`."""
        names = self._label_names.get(name)
        if names is None:
            d = METRICS[name]
            names = list(d.labels)
            if "target" in names and d.target_labels:
                names[1:1] = self.extra
            self._label_names[name] = names
        return names

    def _family(self, name: str) -> Metric:
        fam = self._fams.get(name)
        if fam is None:
            d = METRICS[name]
            labels = self.label_names(name)
            help_text = _fmt_window_help(d.help, self.windows)
            base = name
            if d.kind == "summary":
                fam = self._fams[name] = Metric(base, help_text, "summary")
                self._summary_labels[name] = labels
            else:
                cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}[d.kind]
                fam = self._fams[name] = cls(base, help_text, labels=labels)
        return fam

    def _labels(self, name: str, values: tuple, target) -> list[str]:
        if target is None:
            return [str(v) for v in values]
        extra = dict(target.labels)
        return [target.name] + [extra.get(k, "") for k in self.extra] + [str(v) for v in values]

    def add(self, name: str, values: tuple, value: float, target) -> None:
        self._family(name).add_metric(self._labels(name, values, target), value)

    def add_present(self, name: str, values: tuple, value: float | None, target) -> None:
        if value is not None:
            self.add(name, values, value, target)

    def histogram(self, name: str, values: tuple, buckets, total: float, target) -> None:
        fam = self._family(name)
        fam.add_metric(self._labels(name, values, target), [("+Inf" if math.isinf(le) else _le(le), c) for le, c in buckets], total)

    def summary(self, name: str, values: tuple, quantiles, totals: tuple[float, float], target) -> None:
        fam = self._family(name)
        labels = dict(zip(self._summary_labels[name], self._labels(name, values, target)))
        for q, value in quantiles:
            fam.add_sample(name, {**labels, "quantile": repr(float(q))}, value)
        fam.add_sample(name + "_count", labels, totals[0])
        fam.add_sample(name + "_sum", labels, totals[1])

    def done(self) -> Iterator[Metric]:
        return iter(self._fams.values())


def _le(le: float) -> str:
    return repr(float(le))
