"""Where did the hit rate go: a what-if analysis of a request sample. Pure.

Requests (token ids, chat bodies or prompt text, in arrival order), or the lines of a
block-hash trace (hashtrace.py: Mooncake's or Qwen-Bailian's, in timestamp order), are
replayed through vLLM's block-hash cache model (cachemodel.py) under each routing
policy, and the points of token-weighted hit ratio the sample misses are split into a
waterfall:

  ideal        1 replica, unlimited cache, volatile content after the static part,
               history kept between turns (text input only)
  - volatile   timestamps, ids, user names before static content (lint's detectors)
  - history    earlier turns of a session rewritten in a later one
  = ceiling    1 replica, unlimited cache, the sample as it is
  - capacity   the fleet's blocks as one cache
  - routing    N replicas under the policy, each with its own cache
  - stampede   blocks still in another request's prefill (with a prefill rate)
  = what the sample gets

and `fixed`: volatile content moved after the static part, the best routing policy; then
the requests by their first block, and by type and turn where a trace says them
(whatif_groups.py).
Tokenizers are passed in; reading files and calling servers is the caller's business.
"""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from . import cachemodel, capacitycurve, hashtrace, whatif_groups
from .divergence import render
from .lint import MIN_STATIC_AFTER, _LITERALS as VOLATILE_PATTERNS
from .whatif_input import Request, SampleError, read_requests  # noqa: F401 - callers read samples through this module


# --- tokenizers ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Tokenizer:
    """text -> ids and chat body -> ids; `exact` says whether they are the model's."""

    text: Callable[[str], list[int]]
    chat: Callable[[dict], list[int]]
    exact: bool
    name: str


_PIECE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


def approximate_tokenizer() -> Tokenizer:
    """Word pieces stand in for tokens (ids from a checksum of the piece): block
    boundaries are approximate, so the ratios are too. Labelled in every report."""
    def text(s: str) -> list[int]:
        return [zlib.crc32(p.encode()) for p in _PIECE.findall(s)]
    return Tokenizer(text, lambda body: text(render(body)), False, "approximate (word pieces, ~the offline diagnose)")


# --- the fixes the waterfall measures --------------------------------------------------------
def move_volatile(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Volatile spans followed by enough static text move to the end. -> (text, [(kind, span)])."""
    rest, spans = extract_volatile(text)
    return (rest + " " + " ".join(s for _, s in spans), spans) if spans else (text, [])


def extract_volatile(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The text without its volatile spans that stand before static content, and the spans."""
    found = []
    for kind, pattern in VOLATILE_PATTERNS.items():
        for m in pattern.finditer(text):
            if len(text) - m.end() >= MIN_STATIC_AFTER:
                # a team moves the value with its label ("Current date and time: ...")
                start, end = _sentence(text, m.start(), m.end())
                found.append((start, end, kind))
    if not found:
        return text, []
    found.sort()
    kept, spans, pos = [], [], 0
    for start, end, kind in found:
        if start < pos:
            continue  # overlapping matches: the first wins
        kept.append(text[pos:start])
        spans.append((kind, text[start:end]))
        pos = end
    kept.append(text[pos:])
    return "".join(kept), spans


_LABEL_BEFORE = re.compile(r"\s?(?:[A-Z][\w-]*(?: [\w-]+){0,5}):\s*$")


def _sentence(text: str, start: int, end: int) -> tuple[int, int]:
    """The volatile value with its label ("Current date and time: ") and the period after it."""
    m = _LABEL_BEFORE.search(text, max(0, start - 60), start)
    if m is not None:
        start = m.start()
    if text[end:end + 1] in (".", ","):
        end += 1
    return start, end


def _body_with_volatile_moved(body: dict) -> tuple[dict, list[tuple[str, str]]]:
    messages = [dict(m) if isinstance(m, dict) else m for m in body.get("messages", [])]
    moved: list[tuple[str, str]] = []
    for m in messages[:-1]:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            m["content"], spans = extract_volatile(m["content"])
            moved += spans
    if moved and isinstance(messages[-1], dict) and isinstance(messages[-1].get("content"), str):
        messages[-1]["content"] = messages[-1]["content"] + " " + " ".join(s for _, s in moved)
    return {**body, "messages": messages}, moved


def _with_volatile_moved(r: Request) -> tuple[Request, list[tuple[str, str]]]:
    if r.body is not None:
        body, moved = _body_with_volatile_moved(r.body)
        return replace(r, body=body), moved
    if r.prompt is not None:
        prompt, moved = move_volatile(r.prompt)
        return replace(r, prompt=prompt), moved
    return r, []


def _with_history_kept(requests: Sequence[Request]) -> tuple[list[Request], list[str]]:
    """Each turn of a session extends the messages of the turn before, as a cache-friendly
    client does; a rewritten earlier message is put back. -> (requests, examples)."""
    last: dict[str, list] = {}
    out, examples = [], []
    for r in requests:
        if r.body is None or r.session is None:
            out.append(r)
            continue
        messages = r.body["messages"]
        prev = last.get(r.session)
        # a later turn has more messages than the one before; fewer or as many is a new
        # conversation in the same session (or a deliberate truncation), not a rewrite
        if prev is not None and len(messages) > len(prev) and messages[: len(prev)] != prev:
            at = next((i for i, (a, b) in enumerate(zip(prev, messages)) if a != b), min(len(prev), len(messages)))
            role = prev[at].get("role", "?") if at < len(prev) and isinstance(prev[at], dict) else "?"
            examples.append(f"session {r.session}: line {r.line} rewrote message {at} ({role}) of the turn before")
            messages = prev + (messages[len(prev):] or messages[-1:])
            r = replace(r, body={**r.body, "messages": messages})
        last[r.session] = messages
        out.append(r)
    return out, examples


# --- the analysis ----------------------------------------------------------------------------
# The command's default prefill rate: the order of what one data-centre GPU prefills for a
# model of about 8B parameters. Measure yours from a replica's prefill time of long prompts
# that miss the cache (uncached prompt tokens / prefill seconds) and give it.
DEFAULT_PREFILL_TOKENS_PER_S = 8000.0
STAMPEDE_FIX = ("a gateway that holds the followers of an in-flight prefix until its prefill ends, "
                "or a warm-up request of each new prefix before its traffic")
NOT_AVAILABLE = "needs prompt text, which a block-hash trace does not have"
NO_ARRIVALS = "needs the arrival time of every request (`t`, or a trace's `timestamp`)"


@dataclass
class Analysis:
    requests: int
    prompt_tokens: int
    block_size: int
    replicas: int
    cache_blocks: int | None
    policies: dict[str, float]
    ceiling: float
    capacity: float
    losses: list[dict] = field(default_factory=list)
    observed: float | None = None
    fixed: float | None = None
    best_policy: str | None = None
    ideal: float | None = None
    policy: str = cachemodel.ROUND_ROBIN  # the routing the waterfall ends with
    tokenizer: str = "token ids"
    exact: bool = True
    notes: list[str] = field(default_factory=list)
    hash_trace: bool = False
    trace_format: str | None = None  # hashtrace.MOONCAKE or hashtrace.BAILIAN
    curve: dict | None = None  # capacitycurve.sweep, when asked for
    prefill_tokens_per_s: float = math.inf
    prefix_groups: dict | None = None  # whatif_groups.groups by first block
    by_type: dict | None = None  # by the request type a trace gives
    by_turn: dict | None = None

    def to_json(self) -> dict:
        out = {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "block_size": self.block_size,
               "replicas": self.replicas, "cache_blocks": self.cache_blocks, "policies": self.policies,
               "ceiling": self.ceiling, "capacity": self.capacity, "losses": self.losses, "fixed": self.fixed,
               "best_policy": self.best_policy, "ideal": self.ideal, "policy": self.policy, "tokenizer": self.tokenizer, "exact": self.exact,
               # JSON has no infinity: null is a prefill that is not timed (blocks reusable on arrival)
               "prefill_tokens_per_s": None if self.prefill_tokens_per_s == math.inf else self.prefill_tokens_per_s}
        if self.prefix_groups is not None:
            out["prefix_groups"] = self.prefix_groups["groups"]
            out["prefix_groups_rest"] = self.prefix_groups["rest"]
            out["prefix_groups_count"] = self.prefix_groups["count"]
        for key, grouped in (("by_type", self.by_type), ("by_turn", self.by_turn)):
            if grouped is not None:
                out[key] = grouped["groups"]
        if self.observed is not None:
            out["observed"] = self.observed
        if self.notes:
            out["notes"] = self.notes
        if self.hash_trace:
            out["input"] = "block_hashes"
            out["trace_format"] = self.trace_format
        if self.curve is not None:
            out["capacity_curve"] = self.curve
        return out


def _encode(r: Request, tok: Tokenizer) -> list[int]:
    if r.tokens is not None:
        return list(r.tokens)
    if r.body is not None:
        return tok.chat(r.body)
    return tok.text(r.prompt or "")


def _prepared(requests: Sequence[Request], tok: Tokenizer | None, block_size: int, replica_index: dict[str, int],
              measure_from: float | None, sessions: Sequence[str | None]):
    """(chained block hashes, prompt tokens, session, observed replica, counted) per request."""
    if requests and requests[0].is_hashes:
        blocks = hashtrace.prefix_ids([hashtrace.full_blocks(r.hash_ids, r.input_length, block_size) for r in requests])
        lengths = [r.input_length for r in requests]
    else:
        encoded = [_encode(r, tok) if tok is not None else list(r.tokens or ()) for r in requests]
        blocks = [cachemodel.block_hashes(ids, block_size, r.lora, r.salt) for r, ids in zip(requests, encoded)]
        lengths = [len(ids) for ids in encoded]
    return [(b, n, session, replica_index.get(r.replica) if r.replica is not None else None,
             measure_from is None or (r.t is not None and r.t >= measure_from))
            for r, b, n, session in zip(requests, blocks, lengths, sessions)]


def _hash_trace(requests: Sequence[Request]) -> bool:
    """Whether the sample is a block-hash trace; a sample of both kinds, or of two trace
    formats (their time units and block sizes differ), cannot be replayed."""
    first = requests[0]
    odd = next((r for r in requests if r.is_hashes != first.is_hashes), None)
    if odd is not None:
        kinds = ("token ids or text", "block hashes")
        raise SampleError(f"line {odd.line}: {kinds[odd.is_hashes]} in a sample of {kinds[first.is_hashes]} (line {first.line}): "
                          "a block-hash trace and requests cannot be replayed together")
    odd = next((r for r in requests if r.trace != first.trace), None)
    if odd is not None:
        raise SampleError(f"line {odd.line}: a line in {hashtrace.FORMAT_NAMES[odd.trace]} in a trace in "
                          f"{hashtrace.FORMAT_NAMES[first.trace]} (line {first.line}): one trace, one format")
    return first.is_hashes


def _conversations(requests: Sequence[Request]) -> tuple[list[str], int]:
    """A Qwen-Bailian request's session key is its conversation: the root of its chat_id chain."""
    roots = hashtrace.conversation_roots([(r.chat_id, r.parent_chat_id) for r in requests])
    return [r.session or str(root) for r, root in zip(requests, roots)], len(set(roots))


def _arrivals(requests: Sequence[Request], prefill_tokens_per_s: float) -> list[float] | None:
    """Arrival times for a timed prefill; None when it is not timed or a request has no time."""
    if prefill_tokens_per_s == math.inf or any(r.t is None for r in requests):
        return None
    out, last = [], -math.inf
    for r in requests:
        last = max(last, r.t)  # the sample is in arrival order: a clock stepping back does not make a request earlier
        out.append(last)
    return out


def _share(prepared, hits: Sequence[int]) -> float:
    """Token-weighted hit ratio of the counted requests."""
    hit = total = 0
    for p, h in zip(prepared, hits):
        if p[4]:
            hit += h
            total += p[1]
    return hit / total if total else 0.0


NAME_CHARS, NAME_BEFORE = 40, 12  # a group's name: this long, from this far before where it differs from the others


def _text(r: Request) -> str:
    return " ".join((r.prompt if r.prompt is not None else render(r.body)).split())


def _first_block(r: Request, shorter: bool, differs_at: int = 0) -> str:
    """A group's name: its first request's first block, as the user can find it; a text
    from where it differs from the other groups' (`differs_at`)."""
    if shorter:
        return "prompts shorter than one block"
    if r.hash_ids is not None:
        return f"hash id {r.hash_ids[0]}"
    if r.tokens is not None:
        name = "tokens " + " ".join(map(str, r.tokens[:6])) + " ..."
    else:
        start = max(0, differs_at - NAME_BEFORE)
        name = ("…" if start else "") + repr(_text(r)[start:start + NAME_CHARS])
    return name + "".join(f" ({key} {value})" for key, value in (("lora", r.lora), ("cache_salt", r.salt)) if value)


def _stampede_example(requests: Sequence[Request], prepared, instant: Sequence[int], timed: Sequence[int]) -> str:
    lost = [(i - t, k) for k, (i, t, p) in enumerate(zip(instant, timed, prepared)) if p[4] and i > t]
    if not lost:
        return "no request arrived while blocks it would reuse were still in prefill"
    worst, k = max(lost, key=lambda x: (x[0], -x[1]))
    return (f"{len(lost)} request(s) arrived while blocks they would reuse were still in another request's prefill; "
            f"the most: line {requests[k].line}, {worst} tokens")


def analyze(requests: Sequence[Request], replicas: int = 1, policies: Sequence[str] = (cachemodel.ROUND_ROBIN,),
            cache_blocks: int | None = None, block_size: int | None = 16, tokenizer: Tokenizer | None = None,
            measure_from: float | None = None, cache_tokens: int | None = None, curve: bool = False,
            prefill_tokens_per_s: float = math.inf) -> Analysis:
    """`measure_from`: requests before this `t` only warm the caches, as the traffic
    before a sample warms a live server's. `block_size` None: 16 for requests and the
    Qwen-Bailian format, while a Mooncake trace must be told. `cache_tokens`: per replica,
    instead of `cache_blocks`. `curve`: sweep the cache size per replica
    (capacitycurve.py). `prefill_tokens_per_s`: a request's blocks become reusable when
    its prefill ends (infinite: when it arrives; the command's default is
    DEFAULT_PREFILL_TOKENS_PER_S)."""
    if not requests:
        raise SampleError("no requests to analyse")
    rate = prefill_tokens_per_s
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or math.isnan(rate) or rate <= 0:
        raise SampleError(f"the prefill rate must be a positive number of tokens a second, or inf (not {rate!r})")
    hashes = _hash_trace(requests)
    trace = requests[0].trace
    if block_size is None:
        if hashes and trace == hashtrace.MOONCAKE:
            raise SampleError("a block-hash trace needs --block-size, the tokens each hash id stands for "
                              f"(Mooncake's FAST'25 traces use {hashtrace.MOONCAKE_BLOCK_SIZE})")
        block_size = hashtrace.BAILIAN_BLOCK_SIZE if hashes else 16
    if block_size <= 0:
        raise SampleError("the block size must be positive")
    if cache_tokens is not None:
        if cache_blocks is not None:
            raise SampleError("give the cache size in tokens or in blocks, not both")
        if cache_tokens < block_size:
            raise SampleError(f"a cache of {cache_tokens} tokens holds no block of {block_size}")
        cache_blocks = cache_tokens // block_size
    notes: list[str] = []
    if hashes and all(r.t is not None for r in requests):
        requests = sorted(requests, key=lambda r: r.t)  # the trace's timestamps order the replay
    sessions = [r.session for r in requests]
    if hashes:
        if trace == hashtrace.BAILIAN:
            sessions, conversations = _conversations(requests)
            notes.append(f"sessions: {conversations} conversation(s), each the root of its chat_id chain")
        misfit, first_misfit = hashtrace.misfits([(r.line, r.hash_ids, r.input_length) for r in requests], block_size)
        if misfit:
            notes.append(f"warning: {misfit} line(s) (the first: line {first_misfit}) hold a number of hash ids that does not "
                         f"fit input_length at {block_size} tokens a hash id: is --block-size right?")
        if not all(sessions):
            if cachemodel.SESSION in policies:
                raise SampleError("session routing needs a session key, which a block-hash trace does not have")
            notes.append("session routing left out: a block-hash trace has no session key")
    if any(r.is_text for r in requests) and tokenizer is None:
        raise SampleError("the sample holds text: a tokenizer is needed (--target, --tokenizer, or the approximation)")
    arrivals = _arrivals(requests, rate)
    if rate != math.inf and arrivals is None:
        notes.append(f"stampede not measured: it {NO_ARRIVALS}; blocks are reusable on arrival")
    names = sorted({r.replica for r in requests if r.replica is not None})
    replica_index = {name: i for i, name in enumerate(names)}
    observable = bool(names) and all(r.replica is not None for r in requests)
    if cachemodel.OBSERVED in policies and not observable:
        raise SampleError("observed routing needs a `replica` on every request")
    # the text fixes keep the requests' order, and so their sessions
    _prep = lambda reqs: _prepared(reqs, tokenizer, block_size, replica_index, measure_from, sessions)
    spread = lambda policy: len(names) if policy == cachemodel.OBSERVED else replicas

    def hits(prepared, policy: str, n_replicas: int, blocks: int | None, timed: bool = True) -> list[int]:
        return cachemodel.replay_each(prepared, block_size, policy, n_replicas, blocks, arrivals=arrivals if timed else None,
                                      prefill_tokens_per_s=rate, chained=True)  # _prepared's hashes chain

    as_is = _prep(requests)
    prompt_tokens = sum(p[1] for p in as_is if p[4])
    ceiling_hits = hits(as_is, cachemodel.ROUND_ROBIN, 1, None, timed=False)
    ceiling = _share(as_is, ceiling_hits)
    capacity = _share(as_is, hits(as_is, cachemodel.ROUND_ROBIN, 1, cache_blocks * replicas, timed=False)) if cache_blocks else ceiling
    by_policy = {p: hits(as_is, p, spread(p), cache_blocks) for p in policies}
    results = {p: _share(as_is, h) for p, h in by_policy.items()}
    observed = results.get(cachemodel.OBSERVED)
    if observed is None and observable:
        observed = _share(as_is, hits(as_is, cachemodel.OBSERVED, len(names), cache_blocks))
    main = policies[0]
    instant_main = by_policy[main] if arrivals is None else hits(as_is, main, spread(main), cache_blocks, timed=False)
    analysis = Analysis(sum(1 for p in as_is if p[4]), prompt_tokens, block_size, replicas, cache_blocks, results, ceiling, capacity,
                        observed=observed, tokenizer=tokenizer.name if tokenizer else "token ids",
                        exact=tokenizer.exact if tokenizer and any(r.is_text for r in requests) else True,
                        prefill_tokens_per_s=rate)
    analysis.notes = notes
    losses = []
    candidates = [p for p in cachemodel.POLICIES if p != cachemodel.OBSERVED
                  and not (p == cachemodel.SESSION and hashes and not all(sessions))]
    volatile_fixed_reqs = requests
    if hashes:
        analysis.hash_trace, analysis.trace_format = True, trace
        stated = "the format's" if trace == hashtrace.BAILIAN and block_size == hashtrace.BAILIAN_BLOCK_SIZE else "--block-size"
        analysis.tokenizer = (f"block hashes in {hashtrace.FORMAT_NAMES[trace]}, {block_size} tokens a hash id ({stated}; "
                              f"Mooncake's FAST'25 traces use {hashtrace.MOONCAKE_BLOCK_SIZE}, Qwen-Bailian's {hashtrace.BAILIAN_BLOCK_SIZE})")
        # the text fixes cannot be measured without text: unknown, which is not zero
        losses.append({"kind": "volatile_content", "points": None, "available": False, "example": None, "why": NOT_AVAILABLE})
        losses.append({"kind": "history_rewritten", "points": None, "available": False, "example": None, "why": NOT_AVAILABLE})
    if any(r.is_text for r in requests):
        kept, history_examples = _with_history_kept(requests)
        moved_all = [_with_volatile_moved(r) for r in kept]
        moved_as_is = [_with_volatile_moved(r) for r in requests]
        ideal_prepared, kept_prepared = _prep([r for r, _ in moved_all]), _prep(kept)
        ideal = _share(ideal_prepared, hits(ideal_prepared, cachemodel.ROUND_ROBIN, 1, None, timed=False))
        history_only = _share(kept_prepared, hits(kept_prepared, cachemodel.ROUND_ROBIN, 1, None, timed=False))
        volatile_examples = [f"{kind} {span!r} (line {r.line})" for (r, spans) in zip(requests, (s for _, s in moved_as_is)) for kind, span in spans[:1]]
        losses.append({"kind": "volatile_content", "points": round((ideal - history_only) * 100, 2),
                       "example": volatile_examples[0] if volatile_examples else None})
        losses.append({"kind": "history_rewritten", "points": round((history_only - ceiling) * 100, 2),
                       "example": history_examples[0] if history_examples else None})
        analysis.ideal = ideal
        volatile_fixed_reqs = [r for r, _ in moved_as_is]
    losses.append({"kind": "capacity", "points": round((ceiling - capacity) * 100, 2),
                   "example": f"{replicas} x {cache_blocks} blocks as one cache" if cache_blocks else "unlimited cache"})
    losses.append({"kind": "routing", "points": round((capacity - _share(as_is, instant_main)) * 100, 2),
                   "example": f"{main} over {spread(main)} replica(s), each with its own cache"})
    if rate == math.inf:
        losses.append({"kind": "stampede", "points": 0.0, "fix": None,
                       "example": "prefill not timed (--prefill-tokens-per-s inf): a request's blocks are reusable the moment it arrives"})
    elif arrivals is None:
        losses.append({"kind": "stampede", "points": None, "available": False, "example": None, "fix": STAMPEDE_FIX, "why": NO_ARRIVALS})
    else:
        losses.append({"kind": "stampede", "points": round((_share(as_is, instant_main) - results[main]) * 100, 2), "fix": STAMPEDE_FIX,
                       "example": _stampede_example(requests, as_is, instant_main, by_policy[main])})
    analysis.policy = main
    analysis.losses = losses
    fixed_prepared = _prep(volatile_fixed_reqs) if volatile_fixed_reqs is not requests else as_is
    fixed = {p: (results[p] if fixed_prepared is as_is and p in results else _share(fixed_prepared, hits(fixed_prepared, p, replicas, cache_blocks)))
             for p in candidates}
    analysis.best_policy = max(fixed, key=lambda p: (fixed[p], p == main))
    analysis.fixed = fixed[analysis.best_policy]
    _group(analysis, requests, as_is, ceiling_hits, by_policy)
    if curve:
        swept = [p for p in policies if p != cachemodel.OBSERVED] or [cachemodel.ROUND_ROBIN]
        analysis.curve = capacitycurve.sweep(as_is, block_size, swept, replicas, cache_blocks, chained=True)
        analysis.curve["stampede_included"] = False  # blocks reusable on arrival: the stampede's fix is not cache
    return analysis


def _group(a: Analysis, requests: Sequence[Request], prepared, ceiling_hits: Sequence[int], by_policy: dict[str, list[int]]) -> None:
    """The requests by first block, and by the type and turn a trace gives."""
    tokens, counted = [p[1] for p in prepared], [p[4] for p in prepared]
    keys = [p[0][0] if p[0] else None for p in prepared]
    # a trace's types: the format's four, any other "other", so a hostile trace cannot make a table of thousands
    kinds = [None if r.request_type is None else r.request_type if r.request_type in hashtrace.REQUEST_TYPES else "other"
             for r in requests]
    tagged = any(k is not None for k in kinds)
    firsts: dict = {}
    for i, key in enumerate(keys):
        if counted[i] and key is not None and requests[i].is_text:
            firsts.setdefault(key, i)
    differs = whatif_groups.distinct_starts({key: _text(requests[i]) for key, i in firsts.items()})
    a.prefix_groups = whatif_groups.groups(
        keys, tokens, counted, ceiling_hits, by_policy,
        lambda i: {"first_block": _first_block(requests[i], keys[i] is None, differs.get(keys[i], 0)),
                   "example_line": requests[i].line},
        tags=kinds if tagged else None)
    if tagged:
        named = [k or "unknown" for k in kinds]
        a.by_type = whatif_groups.groups(named, tokens, counted, ceiling_hits, by_policy, lambda i: {"type": named[i]}, top=None)
    if any(r.turn is not None for r in requests):
        turns = [whatif_groups.turn_bucket(r.turn) or "unknown" for r in requests]
        a.by_turn = whatif_groups.groups(turns, tokens, counted, ceiling_hits, by_policy, lambda i: {"turns": turns[i]}, top=None)


def report(a: Analysis) -> str:
    pct = lambda v: f"{v * 100:5.1f}%"
    cache = f"{a.cache_blocks} blocks ({capacitycurve.human(a.cache_blocks * a.block_size)} tokens)" if a.cache_blocks else "unlimited cache"
    lines = [f"whatif: {a.requests} requests, {a.prompt_tokens} prompt tokens, block size {a.block_size}, "
             f"{a.replicas} replica(s), {cache} per replica; tokens: {a.tokenizer}"]
    if not a.exact:
        lines.append("APPROXIMATION: text was tokenized without the model's tokenizer; give --target or --tokenizer for exact ids")
    lines.append("prefill: not timed, a request's blocks are reusable the moment it arrives" if a.prefill_tokens_per_s == math.inf else
                 f"prefill: {a.prefill_tokens_per_s:g} tokens/s, a request's blocks are reusable when its prefill ends (no queueing)")
    lines += a.notes
    lines.append("hit ratio by routing policy: " + "  ".join(f"{p} {pct(v)}" for p, v in a.policies.items()))
    lines.append("waterfall (points of token-weighted hit ratio):")
    losses = {l["kind"]: l for l in a.losses}
    if a.ideal is not None:
        lines.append(f"  ideal (volatile content after the static part, history kept, 1 replica, unlimited cache) {pct(a.ideal)}")
        for kind, label in (("volatile_content", "volatile content before static content"), ("history_rewritten", "history rewritten between turns")):
            l = losses[kind]
            lines.append(f"  - {label:<44} {-l['points']:+6.1f}" + (f"  e.g. {l['example']}" if l["example"] else ""))
    for kind, label in (("volatile_content", "volatile content before static content"), ("history_rewritten", "history rewritten between turns")):
        if kind in losses and losses[kind]["points"] is None:
            lines.append(f"  - {label:<44} not available: {losses[kind]['why']}")
    lines.append(f"  = ceiling (1 replica, unlimited cache){'':<17} {pct(a.ceiling)}")
    for kind, label in (("capacity", "capacity"), ("routing", "routing")):
        l = losses[kind]
        lines.append(f"  - {label:<44} {-l['points']:+6.1f}  {l['example']}")
    l, label = losses["stampede"], "stampede (blocks still in another's prefill)"
    if l["points"] is None:
        lines.append(f"  - {label:<44} not available: {l['why']}")
    else:
        lines.append(f"  - {label:<44} {-l['points']:+6.1f}  {l['example']}" + (f"; fix: {l['fix']}" if l["fix"] and l["points"] else ""))
    lines.append(f"  = this sample gets ({a.policy}){'':<24} {pct(a.policies[a.policy])}")
    if a.observed is not None:
        lines.append(f"observed routing (the replicas in the sample): {pct(a.observed)}")
    if not a.hash_trace:
        lines.append(f"fixed (volatile content moved after the static part, routing {a.best_policy}): {pct(a.fixed)}")
    else:
        lines.append(f"best routing ({a.best_policy}): {pct(a.fixed)}; moving volatile content {NOT_AVAILABLE.replace('needs', 'needs the')}")
    if a.prefix_groups is not None:
        count = a.prefix_groups["count"]
        lines += whatif_groups.report_lines(
            f"prefix groups: the requests by their first block ({count} group(s), the top {min(count, whatif_groups.TOP_GROUPS)} by "
            "prompt tokens); hit ratio and points lost from the group's own ceiling:", a.prefix_groups,
            lambda g: f"line {g['example_line']}: {g['first_block']}", a.policy)
    for title, grouped, key in (("by request type:", a.by_type, "type"), ("by turn:", a.by_turn, "turns")):
        if grouped is not None:
            lines += whatif_groups.report_lines(title, grouped, lambda g, key=key: str(g[key]), a.policy)
    if a.curve is not None:
        lines += capacitycurve.report_lines(a.curve)
        if a.prefill_tokens_per_s != math.inf:
            lines.append("  (the curve replays blocks reusable on arrival: the stampede is left out, its fix is not cache)")
    return "\n".join(lines)
