"""Simulated vLLM replicas: the demo's fleet, the tests' targets, the benchmarks' load.

A replica runs a seeded stream of chat requests through a model of vLLM's automatic
prefix caching: prompts are real token sequences cut into full blocks, each block's
hash chains its parent's hash, tokens and extra keys, and a request hits the longest
run of leading blocks already in an LRU block pool (capped at num_tokens - 1, whole
blocks only). TTFT grows with the uncached tokens. The replica renders what it counted
as vLLM /metrics text of a chosen generation.

Time is whatever the caller passes to `advance()`, so the same replica runs on the wall
clock behind HTTP and on a simulated clock when writing recordings.
"""
from __future__ import annotations

import bisect
import functools
import json
import math
import random
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Iterator, Sequence

from ..tools.cachemodel import BlockPool
from .tokenizer import PIECE, Tokenizer, block_hash_chain, tenant_system_prompt

GENERATIONS = ("v0", "v0.8", "v0.10", "current", "sglang")

TTFT_BUCKETS_OLD = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BUCKETS = TTFT_BUCKETS_OLD + (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


# --- scenarios -------------------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    """At `at` seconds after the replica starts, set `what` to `value`.

    what: "prompt" ("static" | "timestamp" | "tail_edit"), "restart" (value ignored),
    "output_tokens", "request_rate", "kv_blocks", "hits_broken", "prefix_caching",
    "counter_bug" (None, or one of COUNTER_BUGS: vLLM's known bookkeeping bugs)."""

    at: float
    what: str
    value: object = None


@dataclass(frozen=True)
class Scenario:
    request_rate: float = 5.0  # requests/s per replica
    tenants: int = 100  # distinct system prompts, equally popular
    system_tokens: int = 1200
    preamble_tokens: int = 20  # static text before where a deploy may insert a timestamp
    user_tokens: tuple[int, int] = (100, 200)
    output_tokens: int = 200
    block_size: int = 16
    kv_blocks: int = 16000
    prefix_caching: bool = True
    hits_broken: bool = False
    external_cache_fraction: float = 0.0  # a KV connector finds this share of local misses
    counter_bug: str | None = None  # see COUNTER_BUGS
    prompt: str = "static"
    events: tuple[Event, ...] = ()
    # TTFT model: seconds = base + per_uncached * uncached + per_cached * cached, x noise
    ttft_base: float = 0.06
    ttft_per_uncached: float = 0.00018
    ttft_per_cached: float = 0.000004
    decode_seconds_per_token: float = 0.01


# Known ways vLLM's lookup counters lie (docs/engines.md, "When the engine's counters lie"), for the
# instrumentation cross-check: the admitted-prefill counters stay right in each.
RETRY_OVERCOUNT = "retry_overcount"  # <= 0.26: a waiting request's lookup is recorded again on every retry
HITS_NOT_WIRED = "hits_not_wired"  # hits stay 0 while caching works (some hardware backends)
COUNTERS_ZERO = "counters_zero"  # queries and hits both stay 0 (a scheduler that never records)
COUNTER_BUGS = (RETRY_OVERCOUNT, HITS_NOT_WIRED, COUNTERS_ZERO)
RETRIES_UNDER_PRESSURE = 3


def incident(deploy_at: float, **overrides) -> Scenario:
    """The story: healthy, then a client deploy puts a timestamp atop the system prompt."""
    return replace(Scenario(**overrides), events=(Event(deploy_at, "prompt", "timestamp"),))


def kv_pressure(start: float, ramp: float, **overrides) -> Scenario:
    """Longer outputs raise concurrency until KV memory evicts cached prefixes."""
    steps = 10
    events = tuple(Event(start + ramp * i / steps, "output_tokens", int(200 + 1600 * i / steps)) for i in range(1, steps + 1))
    return replace(Scenario(**overrides), events=events)


# --- a replica -------------------------------------------------------------------------
class _Hist:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += value
        self.count += 1


class _Engine:
    """The counters and block pool of one engine (data-parallel rank)."""

    def __init__(self) -> None:
        self.pool: OrderedDict[int, None] = OrderedDict()
        self.queries = 0
        self.hits = 0
        self.query_blocks = 0
        self.hit_blocks = 0
        self.external_queries = 0
        self.external_hits = 0
        self.local_compute = 0  # admitted prefill by source (0.20+ semantics)
        self.local_cache_hit = 0
        self.external_kv_transfer = 0
        self.cached_tokens = 0
        self.last_hit_rate = 0.0  # what SGLang's cache_hit_rate gauge shows: the last request only
        self.lookup_pool = BlockPool(0)  # what a lookup saw before pressure evicted (retry_overcount)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.requests = 0
        self.kv_usage = 0.0
        self.hist = {
            "ttft": _Hist(TTFT_BUCKETS),
            "ttft_old": _Hist(TTFT_BUCKETS_OLD),
            "e2e_request_latency_seconds": _Hist(_LATENCY_BUCKETS),
            "request_queue_time_seconds": _Hist(_LATENCY_BUCKETS),
            "request_inference_time_seconds": _Hist(_LATENCY_BUCKETS),
            "request_prefill_time_seconds": _Hist(_LATENCY_BUCKETS),
            "request_decode_time_seconds": _Hist(_LATENCY_BUCKETS),
            "inter_token_latency_seconds": _Hist(_ITL_BUCKETS),
            "request_prompt_tokens": _Hist(_TOKEN_BUCKETS),
            "request_generation_tokens": _Hist(_TOKEN_BUCKETS),
            "iteration_tokens_total": _Hist(_ITERATION_BUCKETS),
        }


class Replica:
    def __init__(self, name: str, scenario: Scenario, start: float, seed: int = 0,
                 generation: str = "current", model_names: Sequence[str] = ("demo/llama-3-8b",),
                 engines: int = 1, tokenizer: Tokenizer | None = None):
        if generation not in GENERATIONS:
            raise ValueError(f"unknown generation {generation!r}; one of {GENERATIONS}")
        self.name = name
        self.scenario = scenario
        self.generation = generation
        self.model_names = tuple(model_names)
        self.n_engines = 1 if generation in ("v0", "sglang") else engines  # V0 has no engine label; SGLang none we read
        self.tokenizer = tokenizer or Tokenizer()
        self.lock = threading.Lock()
        self._rng = random.Random(seed)
        self._started = start
        self._now = start
        self._next_arrival = start + self._rng.expovariate(scenario.request_rate)
        self._pending = sorted(scenario.events, key=lambda e: e.at)
        self._state = {
            "prompt": scenario.prompt, "output_tokens": scenario.output_tokens,
            "request_rate": scenario.request_rate, "kv_blocks": scenario.kv_blocks,
            "hits_broken": scenario.hits_broken, "prefix_caching": scenario.prefix_caching,
            "counter_bug": scenario.counter_bug,
        }
        self._system = [self._system_prompt(k) for k in range(scenario.tenants)]
        self._chains: list[tuple[int, ...] | None] = [None] * scenario.tenants  # each tenant's block hashes, once
        self.sample: list[dict] | None = None  # set to a list to record the traffic as a whatif sample
        self.sample_bodies = False  # record chat bodies (text) instead of token ids
        self._restart(start)

    # what /tokenize serves and the diagnose tests use
    def system_prompt_text(self, tenant: int) -> str:
        return self._system_text[tenant]

    def request_at(self, tenant: int, t: float, user: str = "Where is my order?") -> dict:
        """The chat request the simulated client sends for `tenant` at time `t`, with the
        system prompt as the current prompt mode renders it (a timestamp after a deploy)."""
        text = self._system_text[tenant]
        if self._state["prompt"] == "timestamp":
            pieces = PIECE.findall(text)
            cut = self.scenario.preamble_tokens
            stamp = datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
            text = "".join(pieces[:cut]) + f" Current date and time: {stamp}." + "".join(pieces[cut:])
        return {"model": self.model_names[0], "messages": [{"role": "system", "content": text}, {"role": "user", "content": user}]}

    def _system_prompt(self, tenant: int) -> list[int]:
        text, ids, pieces = tenant_system_prompt(tenant, self.scenario.system_tokens)
        self.tokenizer.learn(ids, pieces)
        if not hasattr(self, "_system_text"):
            self._system_text = {}
        self._system_text[tenant] = text
        return list(ids)

    def _restart(self, t: float) -> None:
        self.created = t
        self.engines = [_Engine() for _ in range(self.n_engines * len(self.model_names))]

    # --- the simulation --------------------------------------------------------------
    def advance(self, now: float) -> None:
        with self.lock:
            while True:
                next_event = self._started + self._pending[0].at if self._pending else math.inf
                if self._next_arrival <= now and self._next_arrival <= next_event:
                    self._serve(self._next_arrival)
                    self._next_arrival += self._rng.expovariate(self._state["request_rate"])
                elif next_event <= now:
                    self._apply(self._pending.pop(0), next_event)
                else:
                    break
            self._now = max(self._now, now)

    def _apply(self, event: Event, t: float) -> None:
        if event.what == "restart":
            self._restart(t)
        elif event.what in self._state:
            self._state[event.what] = event.value
        else:
            raise ValueError(f"unknown event {event.what!r}")

    def _prompt_tokens(self, tenant: int, t: float) -> list[int]:
        system = self._system[tenant]
        mode = self._state["prompt"]
        if mode == "timestamp":
            stamp = datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
            cut = self.scenario.preamble_tokens
            system = system[:cut] + self.tokenizer.encode(f" Current date and time: {stamp}.") + system[cut:]
        elif mode == "tail_edit":
            system = system[:-24] + self.tokenizer.encode(" Release notes v2: answer in the customer's language.")
        low, high = self.scenario.user_tokens
        n_user = self._rng.randint(low, high)
        unique = self._rng.getrandbits(40) << 12
        return system + list(range(unique, unique + n_user))

    def render_chat(self, body: dict, add_generation_prompt: bool = True) -> list[int]:
        """The simulator's chat template: the tools as JSON, then each message's content,
        in order, tokenized, then the generation prompt. A system message alone renders
        exactly as the simulated traffic's system prompt."""
        tokens: list[int] = []
        if body.get("tools"):
            tokens += self.tokenizer.encode(json.dumps(body["tools"]))
        for m in body.get("messages", []):
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                tokens += self.tokenizer.encode(content)
        if add_generation_prompt:
            tokens += self.tokenizer.encode(" <assistant>")
        return tokens

    def serve_chat(self, body: dict, t: float) -> dict:
        """An OpenAI chat completion: the prompt goes through the prefix cache like traffic."""
        with self.lock:
            tokens = self.render_chat(body)
            hit = self._serve(t, tokens, output=max(1, int(body.get("max_tokens") or 1)))
        return {"object": "chat.completion", "model": body.get("model"), "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(tokens), "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": hit}}}

    def _serve(self, t: float, tokens: list[int] | None = None, output: int | None = None) -> int:
        sc = self.scenario
        engine = self.engines[self._rng.randrange(len(self.engines))]
        tenant = None
        shared: tuple[int, ...] = ()
        if tokens is None:
            tenant = self._rng.randrange(sc.tenants)
            tokens = self._prompt_tokens(tenant, t)
            if self._state["prompt"] == "static":
                shared = self._chains[tenant]
                if shared is None:
                    shared = self._chains[tenant] = block_hash_chain(tuple(self._system[tenant]), sc.block_size)
        if self.sample is not None:
            line = {"t": t, "replica": self.name}
            if tenant is not None:
                line["session"] = f"tenant-{tenant}"
            if self.sample_bodies and tenant is not None:
                line["body"] = self.request_at(tenant, t, user=f"Where is my order {len(self.sample)}?")
            else:
                line["prompt_token_ids"] = list(tokens)
            self.sample.append(line)
        n = len(tokens)
        bs = sc.block_size
        if output is None:
            output = max(1, int(self._rng.expovariate(1.0 / self._state["output_tokens"])))
        # Little's law on the means: blocks held by running requests; what is left of
        # the KV memory may keep cached prefixes
        mean_output = self._state["output_tokens"]
        e2e = sc.ttft_base + mean_output * sc.decode_seconds_per_token
        demand = self._state["request_rate"] / len(self.engines) * e2e * ((n + mean_output) / bs)
        capacity = self._state["kv_blocks"]
        engine.kv_usage = min(1.0, demand / capacity)
        if demand > capacity and self._rng.random() < (demand - capacity) / demand:
            engine.preemptions += 1
        free_for_cache = max(0, int(capacity - demand))

        bug = self._state["counter_bug"]
        matched = 0
        hashes = []
        if self._state["prefix_caching"]:
            # the same walk as the one-loop version (match while the chain is cached,
            # then add every later block), split in phases: this loop is most of what a
            # simulated hour costs, and the tests replay many hours
            pool = engine.pool
            full = n // bs
            hashes = list(shared[:full])
            parent = hashes[-1] if hashes else 0
            for start in range(len(hashes) * bs, full * bs, bs):
                parent = hash((parent, tuple(tokens[start:start + bs])))
                hashes.append(parent)
            touch = pool.move_to_end
            for h in hashes:
                if h not in pool:
                    break
                touch(h)
                matched += 1
            for h in hashes[matched:]:
                pool[h] = None
            popitem = pool.popitem
            for _ in range(len(pool) - free_for_cache):
                popitem(last=False)
        hit_tokens = min(matched * bs, ((n - 1) // bs) * bs)
        if self._state["hits_broken"]:
            hit_tokens = 0
        lookup_hit, lookups = hit_tokens, 1
        if bug == RETRY_OVERCOUNT and self._state["prefix_caching"]:
            # the lookup saw the blocks as they were before pressure evicted them, and a
            # request kept waiting under pressure is looked up (and recorded) again
            engine.lookup_pool.capacity = capacity
            lookup_hit = engine.lookup_pool.serve(hashes, n, bs)
            lookups = 1 + (RETRIES_UNDER_PRESSURE if demand > 0.9 * capacity else 0)
        if self._state["prefix_caching"] and bug != COUNTERS_ZERO:
            engine.queries += n * lookups
            engine.hits += 0 if bug == HITS_NOT_WIRED else lookup_hit * lookups
            engine.query_blocks += n // bs
            engine.hit_blocks += hit_tokens // bs
        external = 0
        if sc.external_cache_fraction > 0:
            missed = n - hit_tokens
            engine.external_queries += missed
            external = int(missed * sc.external_cache_fraction) // bs * bs
            engine.external_hits += external
        # admitted prefill, once per request: local_compute + local_cache_hit + external = prompt
        engine.local_cache_hit += hit_tokens
        engine.external_kv_transfer += external
        engine.local_compute += n - hit_tokens - external
        engine.cached_tokens += hit_tokens + external
        engine.last_hit_rate = hit_tokens / n if n else 0.0
        engine.prompt_tokens += n
        engine.generation_tokens += output
        engine.requests += 1
        uncached = n - hit_tokens
        # bounded noise keeps TTFT out of the lowest buckets, as real prefill does
        noise = min(1.5, max(0.7, math.exp(self._rng.gauss(0.0, 0.15))))
        ttft = (sc.ttft_base + sc.ttft_per_uncached * uncached + sc.ttft_per_cached * hit_tokens) * noise
        decode = output * sc.decode_seconds_per_token * noise
        h = engine.hist
        h["ttft"].observe(ttft)
        h["ttft_old"].observe(ttft)
        h["e2e_request_latency_seconds"].observe(ttft + decode)
        h["request_queue_time_seconds"].observe(ttft * 0.1)
        h["request_inference_time_seconds"].observe(ttft * 0.9 + decode)
        h["request_prefill_time_seconds"].observe(ttft * 0.9)
        h["request_decode_time_seconds"].observe(decode)
        h["inter_token_latency_seconds"].observe(sc.decode_seconds_per_token * noise)
        h["request_prompt_tokens"].observe(n)
        h["request_generation_tokens"].observe(output)
        h["iteration_tokens_total"].observe(min(16384, uncached))
        return hit_tokens

    # --- exposition ------------------------------------------------------------------
    def render(self) -> str:
        with self.lock:
            return _render(self)


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


def _render_sglang(r: Replica) -> str:
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


def _render(r: Replica) -> str:
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


# --- serving over HTTP -----------------------------------------------------------------
def recording_lines(replicas: Sequence[Replica], start: float, duration: float, interval: float,
                    deploys: Sequence[tuple[float, str | None, str]] = ()) -> Iterator[dict]:
    """Scrape every replica every `interval` seconds of simulated time, as recording
    lines (the recording format of docs/tools.md); `deploys` are (seconds after start, target or None, version)."""
    events = sorted(deploys, key=lambda d: d[0])
    steps = int(duration // interval)
    for i in range(steps + 1):
        t = start + i * interval
        while events and start + events[0][0] <= t:
            at, target, version = events.pop(0)
            yield {"t": start + at, "event": "deploy", "target": target, "version": version}
        for r in replicas:
            r.advance(t)
            yield {"t": t, "target": r.name, "body": r.render()}


def scenario_recording(scenario: Scenario, duration: float, start: float, warm: float = 900.0, replicas: int = 2,
                       interval: float = 5.0, deploys: Sequence[tuple[float, str | None, str]] = (),
                       generation: str = "current", per_replica_events: dict[int, Sequence[Event]] | None = None) -> list[dict]:
    """A recording of `replicas` replicas that have served `warm` seconds before `start`
    (warm caches). Scenario event times count from the replica's start, `warm` before
    `start`; `deploys` are (seconds after `start`, target or None, version)."""
    reps = []
    for i in range(replicas):
        sc = scenario
        if per_replica_events and i in per_replica_events:
            sc = replace(scenario, events=tuple(scenario.events) + tuple(per_replica_events[i]))
        r = Replica(f"vllm-{i}", sc, start=start - warm, seed=100 + i, generation=generation)
        r.advance(start)
        reps.append(r)
    return list(recording_lines(reps, start, duration, interval, deploys))


def play_into(replica: Replica, history, until: float, step: float, start: float = 0.0):
    """Scrape `replica` every `step` seconds of simulated time from `start` to `until`
    into `history` (anything with `append(t, snapshot)`), as the poller would: returns the
    last snapshot and the time of the last scrape."""
    from ..parse.vllm_metrics import parse
    t, snap = start, None
    while t <= until:
        replica.advance(t)
        snap = parse(replica.render())
        history.append(t, snap)
        t += step
    return snap, t - step
