"""Where did the hit rate go: a what-if analysis of a request sample. Pure.

Requests (token ids, chat bodies or prompt text, in arrival order), or the lines of a
block-hash trace (hashtrace.py, in timestamp order), are replayed through vLLM's
block-hash cache model (cachemodel.py) under each routing policy, and the points
of token-weighted hit ratio the sample misses are split into a waterfall:

  ideal        1 replica, unlimited cache, volatile content after the static part,
               history kept between turns (text input only)
  - volatile   timestamps, ids, user names before static content (lint's detectors)
  - history    earlier turns of a session rewritten in a later one
  = ceiling    1 replica, unlimited cache, the sample as it is
  - capacity   the fleet's blocks as one cache
  - routing    N replicas under the policy, each with its own cache
  = what the sample gets

and `fixed`: volatile content moved after the static part, the best routing policy.
Tokenizers are passed in; reading files and calling servers is the caller's business.
"""
from __future__ import annotations

import ast
import re
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Sequence

from ..peers import jsonlines
from . import cachemodel, capacitycurve, hashtrace
from .divergence import render
from .lint import MIN_STATIC_AFTER, _LITERALS as VOLATILE_PATTERNS


class SampleError(ValueError):
    pass


@dataclass(frozen=True)
class Request:
    line: int
    t: float | None = None
    session: str | None = None
    replica: str | None = None
    tokens: tuple[int, ...] | None = None
    prompt: str | None = None
    body: dict | None = None
    lora: str | None = None
    salt: str | None = None
    hash_ids: tuple[int, ...] | None = None  # a block-hash trace's line (hashtrace.py)
    input_length: int | None = None

    @property
    def is_text(self) -> bool:
        return self.tokens is None and self.hash_ids is None

    @property
    def is_hashes(self) -> bool:
        return self.hash_ids is not None


# --- input -------------------------------------------------------------------------------
_LOG_REQUEST = re.compile(r"Received request (?P<id>\S+?): prompt: (?P<rest>.*)$")
_LOG_TIME = re.compile(r"^\w+\s+(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})")
_LORA_NAME = re.compile(r"lora_name='([^']*)'")


def read_requests(lines: Iterable[str]) -> Iterator[Request | SampleError]:
    """Each non-blank line: a JSON request record, or a line of vLLM's request log
    (`--enable-log-requests`); anything else is a SampleError naming the line."""
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("{"):
            yield _from_json(n, text)
        elif "Received request " in text:
            yield _from_log(n, text)
        else:
            yield SampleError(f"line {n}: neither a JSON request nor a vLLM request-log line")


def _from_json(n: int, text: str) -> Request | SampleError:
    try:
        obj = jsonlines.loads(text)
    except jsonlines.JSONInputError as exc:
        return SampleError(f"line {n}: not JSON ({exc})")
    if not isinstance(obj, dict):
        return SampleError(f"line {n}: a JSON object is required")
    t = obj.get("t")
    if t is not None and jsonlines.finite_number(t) is None:
        return SampleError(f"line {n}: `t` must be a number, and finite")
    for key in ("session", "replica", "lora", "cache_salt"):
        if obj.get(key) is not None and not isinstance(obj[key], (str, int)):
            return SampleError(f"line {n}: `{key}` must be a string")
    common = dict(line=n, t=None if t is None else float(t), session=_text(obj.get("session")), replica=_text(obj.get("replica")),
                  lora=_text(obj.get("lora")), salt=_text(obj.get("cache_salt")))
    if hashtrace.is_record(obj):
        try:
            stamp, ids, length = hashtrace.fields(obj)
        except ValueError as exc:
            return SampleError(f"line {n}: {exc}")
        if common["t"] is None and stamp is not None:
            common["t"] = stamp / 1000
        return Request(hash_ids=ids, input_length=length, **common)
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return SampleError(f"line {n}: `prompt_token_ids` must be a non-empty list of integers")
        return Request(tokens=tuple(ids), **common)
    if "body" in obj:
        body = obj["body"]
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return SampleError(f"line {n}: `body` must be a chat-completions request with a non-empty `messages` list")
        salt = common.pop("salt") or _text(body.get("cache_salt"))
        return Request(body=body, salt=salt, **common)
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            return SampleError(f"line {n}: `prompt` must be a non-empty string")
        return Request(prompt=obj["prompt"], **common)
    return SampleError(f"line {n}: one of `prompt_token_ids`, `body`, `prompt` or `hash_ids` with `input_length` is required")


def _text(value) -> str | None:
    return None if value is None else str(value)


def _from_log(n: int, text: str) -> Request | SampleError:
    """`Received request ID: prompt: 'text', params: ..., prompt_token_ids: [1, 2], ...
    lora_request: ...` as vLLM's request logger prints it (the params are called
    `sampling_params` in older versions, and newer ones add `prompt_embeds shape`)."""
    m = _LOG_REQUEST.search(text)
    if m is None:
        return SampleError(f"line {n}: a vLLM request-log line without `Received request ID: prompt:`")
    rest = m.group("rest")
    prompt, rest = _leading_literal(rest)
    ids = None
    at = rest.find("prompt_token_ids: ")
    if at >= 0:
        raw, _ = _leading_literal(rest[at + len("prompt_token_ids: "):])
        if isinstance(raw, list) and raw:
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
                return SampleError(f"line {n}: prompt_token_ids must be a list of integers")
            ids = tuple(raw)
    lora = _LORA_NAME.search(rest)
    if ids is None and not isinstance(prompt, str):
        return SampleError(f"line {n}: the log line has neither prompt text nor prompt_token_ids (raise --max-log-len?)")
    return Request(line=n, t=_log_time(text), session=None, tokens=ids, prompt=prompt if ids is None else None,
                   lora=lora.group(1) if lora else None)


def _leading_literal(text: str):
    """The Python literal (a repr'd string, a list, None) at the start of `text`, and the rest."""
    text = text.lstrip()
    if text.startswith("None"):
        return None, text[4:]
    if text[:1] in ("'", '"'):
        quote, i = text[0], 1
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            if text[i] == quote:
                break
            i += 1
        try:
            return ast.literal_eval(text[: i + 1]), text[i + 1:]
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            return None, text
    if text.startswith("["):
        end = text.find("]")
        try:
            return ast.literal_eval(text[: end + 1]), text[end + 1:]
        except (ValueError, SyntaxError, RecursionError, MemoryError):  # a hostile line: `[[[[...` nests deeper than the parser goes
            return None, text
    return None, text


def _log_time(text: str) -> float | None:
    m = _LOG_TIME.match(text)
    if not m:
        return None
    month, day, hh, mm, ss = (int(x) for x in m.groups())
    return float(((month * 31 + day) * 24 + hh) * 3600 + mm * 60 + ss)  # ordering only: the log has no year


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
    curve: dict | None = None  # capacitycurve.sweep, when asked for

    def to_json(self) -> dict:
        out = {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "block_size": self.block_size,
               "replicas": self.replicas, "cache_blocks": self.cache_blocks, "policies": self.policies,
               "ceiling": self.ceiling, "capacity": self.capacity, "losses": self.losses, "fixed": self.fixed,
               "best_policy": self.best_policy, "ideal": self.ideal, "policy": self.policy, "tokenizer": self.tokenizer, "exact": self.exact}
        if self.observed is not None:
            out["observed"] = self.observed
        if self.notes:
            out["notes"] = self.notes
        if self.hash_trace:
            out["input"] = "block_hashes"
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
              measure_from: float | None = None):
    out = []
    for r in requests:
        counted = measure_from is None or (r.t is not None and r.t >= measure_from)
        observed = replica_index.get(r.replica) if r.replica is not None else None
        if r.hash_ids is not None:
            out.append((hashtrace.full_blocks(r.hash_ids, r.input_length, block_size), r.input_length, r.session, observed, counted))
            continue
        ids = _encode(r, tok) if tok is not None else list(r.tokens or ())
        out.append((cachemodel.block_hashes(ids, block_size, r.lora, r.salt), len(ids), r.session, observed, counted))
    return out


def _hash_trace(requests: Sequence[Request]) -> bool:
    """Whether the sample is a block-hash trace; a sample of both kinds cannot be replayed."""
    first = requests[0].is_hashes
    odd = next((r for r in requests if r.is_hashes != first), None)
    if odd is not None:
        kinds = ("token ids or text", "block hashes")
        raise SampleError(f"line {odd.line}: {kinds[odd.is_hashes]} in a sample of {kinds[first]} (line {requests[0].line}): "
                          "a block-hash trace and requests cannot be replayed together")
    return first


NOT_AVAILABLE = "needs prompt text, which a block-hash trace does not have"


def _ratio(prepared, block_size: int, policy: str, replicas: int, cache_blocks: int | None) -> float:
    hits, total = cachemodel.replay(prepared, block_size, policy, replicas, cache_blocks)
    return hits / total if total else 0.0


def analyze(requests: Sequence[Request], replicas: int = 1, policies: Sequence[str] = (cachemodel.ROUND_ROBIN,),
            cache_blocks: int | None = None, block_size: int | None = 16, tokenizer: Tokenizer | None = None,
            measure_from: float | None = None, cache_tokens: int | None = None, curve: bool = False) -> Analysis:
    """`measure_from`: requests before this `t` only warm the caches, as the traffic
    before a sample warms a live server's. `block_size` None: 16 for requests, while a
    block-hash trace must be told. `cache_tokens`: per replica, instead of `cache_blocks`.
    `curve`: sweep the cache size per replica (capacitycurve.py)."""
    if not requests:
        raise SampleError("no requests to analyse")
    hashes = _hash_trace(requests)
    if block_size is None:
        if hashes:
            raise SampleError("a block-hash trace needs --block-size, the tokens each hash id stands for "
                              f"(Mooncake's FAST'25 traces use {hashtrace.MOONCAKE_BLOCK_SIZE})")
        block_size = 16
    if block_size <= 0:
        raise SampleError("the block size must be positive")
    if cache_tokens is not None:
        if cache_blocks is not None:
            raise SampleError("give the cache size in tokens or in blocks, not both")
        if cache_tokens < block_size:
            raise SampleError(f"a cache of {cache_tokens} tokens holds no block of {block_size}")
        cache_blocks = cache_tokens // block_size
    notes: list[str] = []
    if hashes:
        if all(r.t is not None for r in requests):
            requests = sorted(requests, key=lambda r: r.t)  # the trace's timestamps order the replay
        misfit, first_misfit = hashtrace.misfits([(r.line, r.hash_ids, r.input_length) for r in requests], block_size)
        if misfit:
            notes.append(f"warning: {misfit} line(s) (the first: line {first_misfit}) hold a number of hash ids that does not "
                         f"fit input_length at {block_size} tokens a hash id: is --block-size right?")
        if not all(r.session for r in requests):
            if cachemodel.SESSION in policies:
                raise SampleError("session routing needs a session key, which a block-hash trace does not have")
            notes.append("session routing left out: a block-hash trace has no session key")
    if any(r.is_text for r in requests) and tokenizer is None:
        raise SampleError("the sample holds text: a tokenizer is needed (--target, --tokenizer, or the approximation)")
    names = sorted({r.replica for r in requests if r.replica is not None})
    replica_index = {name: i for i, name in enumerate(names)}
    observable = bool(names) and all(r.replica is not None for r in requests)
    _prep = lambda reqs: _prepared(reqs, tokenizer, block_size, replica_index, measure_from)
    as_is = _prep(requests)
    prompt_tokens = sum(p[1] for p in as_is if p[4])
    ceiling = _ratio(as_is, block_size, cachemodel.ROUND_ROBIN, 1, None)
    capacity = _ratio(as_is, block_size, cachemodel.ROUND_ROBIN, 1, cache_blocks * replicas) if cache_blocks else ceiling
    if cachemodel.OBSERVED in policies and not observable:
        raise SampleError("observed routing needs a `replica` on every request")
    observed = _ratio(as_is, block_size, cachemodel.OBSERVED, len(names), cache_blocks) if observable else None
    results = {p: (observed if p == cachemodel.OBSERVED else _ratio(as_is, block_size, p, replicas, cache_blocks)) for p in policies}
    main = policies[0]
    analysis = Analysis(sum(1 for p in as_is if p[4]), prompt_tokens, block_size, replicas, cache_blocks, results, ceiling, capacity,
                        observed=observed, tokenizer=tokenizer.name if tokenizer else "token ids",
                        exact=tokenizer.exact if tokenizer and any(r.is_text for r in requests) else True)
    analysis.notes = notes
    losses = []
    candidates = [p for p in cachemodel.POLICIES if p != cachemodel.OBSERVED
                  and not (p == cachemodel.SESSION and hashes and not all(r.session for r in requests))]
    volatile_fixed_reqs = requests
    if hashes:
        analysis.hash_trace = True
        analysis.tokenizer = f"block hashes, {block_size} tokens a hash id (--block-size; Mooncake's FAST'25 traces use {hashtrace.MOONCAKE_BLOCK_SIZE})"
        # the text fixes cannot be measured without text: unknown, which is not zero
        losses.append({"kind": "volatile_content", "points": None, "available": False, "example": None, "why": NOT_AVAILABLE})
        losses.append({"kind": "history_rewritten", "points": None, "available": False, "example": None, "why": NOT_AVAILABLE})
    if any(r.is_text for r in requests):
        kept, history_examples = _with_history_kept(requests)
        moved_all = [_with_volatile_moved(r) for r in kept]
        moved_as_is = [_with_volatile_moved(r) for r in requests]
        ideal = _ratio(_prep([r for r, _ in moved_all]), block_size, cachemodel.ROUND_ROBIN, 1, None)
        history_only = _ratio(_prep(kept), block_size, cachemodel.ROUND_ROBIN, 1, None)
        volatile_examples = [f"{kind} {span!r} (line {r.line})" for (r, spans) in zip(requests, (s for _, s in moved_as_is)) for kind, span in spans[:1]]
        losses.append({"kind": "volatile_content", "points": round((ideal - history_only) * 100, 2),
                       "example": volatile_examples[0] if volatile_examples else None})
        losses.append({"kind": "history_rewritten", "points": round((history_only - ceiling) * 100, 2),
                       "example": history_examples[0] if history_examples else None})
        analysis.ideal = ideal
        volatile_fixed_reqs = [r for r, _ in moved_as_is]
    losses.append({"kind": "capacity", "points": round((ceiling - capacity) * 100, 2),
                   "example": f"{replicas} x {cache_blocks} blocks as one cache" if cache_blocks else "unlimited cache"})
    spread = len(names) if main == cachemodel.OBSERVED else replicas
    losses.append({"kind": "routing", "points": round((capacity - results[main]) * 100, 2),
                   "example": f"{main} over {spread} replica(s), each with its own cache"})
    analysis.policy = main
    analysis.losses = losses
    fixed_prepared = _prep(volatile_fixed_reqs) if volatile_fixed_reqs is not requests else as_is
    fixed = {p: (results[p] if fixed_prepared is as_is and p in results else _ratio(fixed_prepared, block_size, p, replicas, cache_blocks))
             for p in candidates}
    analysis.best_policy = max(fixed, key=lambda p: (fixed[p], p == main))
    analysis.fixed = fixed[analysis.best_policy]
    if curve:
        swept = [p for p in policies if p != cachemodel.OBSERVED] or [cachemodel.ROUND_ROBIN]
        analysis.curve = capacitycurve.sweep(as_is, block_size, swept, replicas, cache_blocks)
    return analysis


def report(a: Analysis) -> str:
    pct = lambda v: f"{v * 100:5.1f}%"
    cache = f"{a.cache_blocks} blocks ({capacitycurve.human(a.cache_blocks * a.block_size)} tokens)" if a.cache_blocks else "unlimited cache"
    lines = [f"whatif: {a.requests} requests, {a.prompt_tokens} prompt tokens, block size {a.block_size}, "
             f"{a.replicas} replica(s), {cache} per replica; tokens: {a.tokenizer}"]
    if not a.exact:
        lines.append("APPROXIMATION: text was tokenized without the model's tokenizer; give --target or --tokenizer for exact ids")
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
    lines.append(f"  = this sample gets ({a.policy}){'':<24} {pct(a.policies[a.policy])}")
    if a.observed is not None:
        lines.append(f"observed routing (the replicas in the sample): {pct(a.observed)}")
    if not a.hash_trace:
        lines.append(f"fixed (volatile content moved after the static part, routing {a.best_policy}): {pct(a.fixed)}")
    else:
        lines.append(f"best routing ({a.best_policy}): {pct(a.fixed)}; moving volatile content {NOT_AVAILABLE.replace('needs', 'needs the')}")
    if a.curve is not None:
        lines += capacitycurve.report_lines(a.curve)
    return "\n".join(lines)
