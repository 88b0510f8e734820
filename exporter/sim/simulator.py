"""Simulated vLLM replicas: the demo's fleet, the tests' targets, the benchmarks' load.

A replica runs a seeded stream of chat requests through a model of vLLM's automatic
prefix caching: prompts are real token sequences cut into full blocks, each block's
hash chains its parent's hash, tokens and extra keys, and a request hits the longest
run of leading blocks already in its pool (capped at num_tokens - 1, whole blocks only).
The pool is vLLM's cache model, the one `whatif` replays (exporter/tools/cachemodel.py):
LRU over the KV memory running requests leave, a request's blocks freed tail first. TTFT grows with the uncached tokens. The replica renders what it counted
as vLLM /metrics text of a chosen generation.

Time is whatever the caller passes to `advance()`, so the same replica runs on the wall
clock behind HTTP and on a simulated clock when writing recordings.
"""
from __future__ import annotations

import bisect
import json
import math
import random
import threading
import zlib
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Iterator, Sequence

from ..tools.cachemodel import BlockPool
from . import metrics_text
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
    "counter_bug" (None, or one of COUNTER_BUGS: vLLM's known bookkeeping bugs),
    "connector" (False: the KV connector's store is gone; True: back), "sleep" (the
    sleep level, 1 or 2: vLLM's sleep mode, the KV cache discarded), "wake" (value ignored),
    "route" (a Route: which conversations the router sends this replica, or None: any)."""

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
    # a KV connector's store (LMCache and the like) of this many blocks, matched by the same
    # hash chain after the GPU's own cache: it holds what the GPU cache has no room for
    external_kv_blocks: int = 0
    # conversation turns: each request carries this many tokens of its session's context
    # after the system prompt (Conversations, shared by the replicas); 0: single requests
    conversation_tokens: int = 0
    counter_bug: str | None = None  # see COUNTER_BUGS
    route: "Route | None" = None  # which conversations this replica is sent; None: any (round robin)
    prompt: str = "static"
    events: tuple[Event, ...] = ()
    # TTFT model: seconds = base + per_uncached * uncached + per_cached * cached, x noise
    ttft_base: float = 0.06
    ttft_per_uncached: float = 0.00018
    ttft_per_cached: float = 0.000004
    ttft_per_external: float = 0.00006  # a token a connector loads: far cheaper than prefill, dearer than a GPU hit
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


class Conversations:
    """Chat sessions whose turns a router without prefix or session affinity (round robin)
    spreads over the replicas that share this object. Each request continues a random
    session: the system prompt of its tenant, then `context_tokens` of the session's
    context, then the new user turn. The context a turn extends is cached where the
    previous turn was served (its prompt and its reply are that replica's blocks); an
    older, shorter copy elsewhere is modelled as none, so a replica hits the context with
    probability 1/N among N replicas: the ceiling of caches that are not shared. The
    replicas must advance side by side (a recording's scrapes do, every few seconds): one
    run ahead alone would serve a session's turns in a row."""

    def __init__(self, sessions: int, context_tokens: int):
        self.sessions, self.context_tokens = sessions, context_tokens
        self.turns = [0] * sessions
        self.lock = threading.Lock()
        self._chains: dict[int, dict[int, tuple[int, ...]]] = {}  # session -> turn -> block hashes to its context's end

    def chain(self, session: int, turn: int, system: tuple[int, ...], block_size: int) -> tuple[int, ...]:
        """The block hashes of the system prompt (`system`, its chain) and the context at
        `turn`, computed once for every replica (ints hash alike in every process)."""
        with self.lock:
            known = self._chains.setdefault(session, {})
            found = known.get(turn)
            if found is None:
                found = known[turn] = tuple(_chain(self.context(session, turn), system, block_size, offset=len(system)))
                for old in [k for k in known if k < turn - 1]:
                    del known[old]
            return found

    def context(self, session: int, turn: int) -> list[int]:
        """The session's context at `turn`: token ids no other session or turn shares."""
        base = (1 << 50) + (session * 1_000_003 + turn) * 8192
        return list(range(base, base + self.context_tokens))

    def next_turn(self, session: int) -> int:
        with self.lock:
            turn = self.turns[session]
            self.turns[session] = turn + 1
            return turn


@dataclass(frozen=True)
class Route:
    """How a router with affinity sends conversations (Conversations' sessions) over the
    replicas `members`, as `me` sees it: "hash_mod", a hash of the session modulo the
    replica count (most sessions move when the count changes), or "consistent", rendezvous
    hashing (only the sessions of a replica that came or went move)."""

    kind: str
    me: str
    members: tuple[str, ...]

    def owner(self, session: int) -> str:
        key = _mix(session)
        if self.kind == "hash_mod":
            return self.members[key % len(self.members)]
        if self.kind == "consistent":
            return max(self.members, key=lambda m: _mix(key ^ zlib.crc32(m.encode())))
        raise ValueError(f"unknown routing {self.kind!r}")

    def sessions(self, n: int) -> list[int]:
        return [s for s in range(n) if self.owner(s) == self.me]


def _mix(x: int) -> int:
    """A 64-bit mix (splitmix64's finalizer): the same in every process, unlike hash()."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


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
        # vLLM's cache model (exporter/tools/cachemodel.py), the one whatif replays: its capacity is
        # what KV memory running requests leave, set before each request; blocks freed tail first
        self.pool = BlockPool(0, chained=True)
        self.store = BlockPool(0, chained=True)  # the KV connector's (Scenario.external_kv_blocks), LRU the same way
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
                 engines: int = 1, tokenizer: Tokenizer | None = None, conversations: Conversations | None = None):
        if generation not in GENERATIONS:
            raise ValueError(f"unknown generation {generation!r}; one of {GENERATIONS}")
        self.name = name
        self.scenario = scenario
        self.generation = generation
        self.model_names = tuple(model_names)
        self.n_engines = 1 if generation in ("v0", "sglang") else engines  # V0 has no engine label; SGLang none we read
        self.tokenizer = tokenizer or Tokenizer()
        self.conversations = conversations if scenario.conversation_tokens else None
        if scenario.conversation_tokens and self.conversations is None:
            self.conversations = Conversations(scenario.tenants * 4, scenario.conversation_tokens)
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
            "counter_bug": scenario.counter_bug, "connector": True, "sleep": 0, "route": None,
        }
        self._routed: list[int] | None = None  # the sessions the route sends here (None: any)
        self._route(scenario.route)
        self._system = [self._system_prompt(k) for k in range(scenario.tenants)]
        self._chains: list[tuple[int, ...] | None] = [None] * scenario.tenants  # each tenant's block hashes, once
        self.sample: list[dict] | None = None  # set to a list to record the traffic as a whatif sample
        self.sample_bodies = False  # record chat bodies (text) instead of token ids
        # set to a deque to keep what vLLM's KV events would publish (the blocks each request
        # computed and stored); the server publishes and empties it
        self.kv_events: deque | None = None
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
                    if not self._state["sleep"]:  # asleep, vLLM answers 503: the request is not served here
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
        elif event.what == "wake":
            self._state["sleep"] = 0
        elif event.what == "sleep":
            self._state["sleep"] = int(event.value or 1)
            for engine in self.engines:  # both levels discard the KV cache; counters and the process live on
                engine.pool.clear()
                engine.kv_usage = 0.0
        elif event.what == "route":
            self._route(event.value)
        elif event.what in self._state:
            self._state[event.what] = event.value
        else:
            raise ValueError(f"unknown event {event.what!r}")

    def _route(self, route: Route | None) -> None:
        self._state["route"] = route
        self._routed = route.sessions(self.conversations.sessions) if route is not None and self.conversations else None

    def _prompt_tokens(self, tenant: int, t: float, context: Sequence[int] = ()) -> list[int]:
        system = self._system[tenant]
        mode = self._state["prompt"]
        if mode == "timestamp":
            stamp = datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
            cut = self.scenario.preamble_tokens
            system = system[:cut] + self.tokenizer.encode(f" Current date and time: {stamp}.") + system[cut:]
        elif mode == "tail_edit":
            system = system[:-24] + self.tokenizer.encode(" Release notes v2: answer in the customer's language.")
        low, high = self.scenario.user_tokens
        n_user = self._last_user = self._rng.randint(low, high)
        unique = self._rng.getrandbits(40) << 12
        return system + list(context) + list(range(unique, unique + n_user))

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
        follows = None  # a conversation's next context: cached here once this turn is served
        if tokens is None:
            conv = self.conversations
            session = 0 if conv is None else self._rng.choice(self._routed) if self._routed else self._rng.randrange(conv.sessions)
            tenant = self._rng.randrange(sc.tenants) if conv is None else session % sc.tenants
            context: list[int] = []
            if conv is not None:
                turn = conv.next_turn(session)
                context = conv.context(session, turn)
            tokens = self._prompt_tokens(tenant, t, context)
            if self._state["prompt"] == "static":
                shared = self._chains[tenant]
                if shared is None:
                    shared = self._chains[tenant] = block_hash_chain(tuple(self._system[tenant]), sc.block_size)
            if conv is not None:
                prefix = len(tokens) - len(context) - self._last_user
                if shared and prefix % sc.block_size == 0 and len(context) % sc.block_size == 0:
                    shared = conv.chain(session, turn, shared, sc.block_size)
                    follows = conv.chain(session, turn + 1, self._chains[tenant], sc.block_size)
                else:
                    follows = _chain(tokens[:prefix] + conv.context(session, turn + 1), shared, sc.block_size)
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
            pool = engine.pool
            hashes = _chain(tokens, shared, bs)
            matched = pool.matched(hashes)
            pool.capacity = free_for_cache
            pool.store(hashes, matched)
            if self.kv_events is not None and len(hashes) > matched:
                self.kv_events.append({"type": "BlockStored", "block_hashes": hashes[matched:],
                                       "parent_block_hash": hashes[matched - 1] if matched else None,
                                       "token_ids": list(tokens[matched * bs:len(hashes) * bs]), "block_size": bs,
                                       "lora_id": None, "medium": "GPU", "lora_name": None,
                                       # each tenant sends its cache_salt; vLLM keys a prompt's first block by it
                                       "extra_keys": [[f"tenant-{tenant}"] if i == 0 and tenant is not None else None
                                                      for i in range(matched, len(hashes))]})
            if follows is not None:  # the reply made this replica the one holding the session's context
                pool.store(follows)
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
            engine.hit_blocks += 0 if bug == HITS_NOT_WIRED else hit_tokens // bs
        external = 0
        if sc.external_kv_blocks and self._state["prefix_caching"]:
            # the connector is asked for what the GPU cache missed (vLLM PR 30522) and loads
            # the run of blocks its store holds after the GPU's; it stores every block
            engine.external_queries += n - hit_tokens
            store = engine.store
            if self._state["connector"]:
                held = store.matched(hashes)  # its run of blocks, of which those after the GPU's hit load
                external = max(0, min(held, (n - 1) // bs) * bs - hit_tokens)
                store.capacity = sc.external_kv_blocks
                store.store(hashes, held)
            engine.external_hits += external
        elif sc.external_cache_fraction > 0:
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
        uncached = n - hit_tokens - external
        # bounded noise keeps TTFT out of the lowest buckets, as real prefill does
        noise = min(1.5, max(0.7, math.exp(self._rng.gauss(0.0, 0.15))))
        ttft = (sc.ttft_base + sc.ttft_per_uncached * uncached + sc.ttft_per_cached * hit_tokens
                + sc.ttft_per_external * external) * noise
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
            return metrics_text.render(self)


def _chain(tokens: Sequence[int], shared: Sequence[int], bs: int, offset: int = 0) -> list[int]:
    """The block hashes of the prompt's full blocks, each chaining its parent's, the
    first ones taken from `shared` (a system prompt's chain, computed once). `tokens`
    may start `offset` blocks in, after `shared`."""
    full = offset + len(tokens) // bs
    hashes = list(shared[:full])
    parent = hashes[-1] if hashes else 0
    for start in range((len(hashes) - offset) * bs, (full - offset) * bs, bs):
        parent = hash((parent, tuple(tokens[start:start + bs])))
        hashes.append(parent)
    return hashes


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
