"""What one engine's prefix cache computed and dropped, from its KV cache events. Pure.

A BlockStored event is a request's blocks that missed the cache: its parent is the last
block it hit (None: even its first block was new). Two blocks stored under the same
parent whose tokens differ only in a short span are one prompt with a value that changes
per request (a timestamp, a request id, a user's name): the span is where the cache
breaks, first-hand. A block stored again soon after it was removed was evicted before
its reuse. A clear of the whole cache is a reset. Everything kept is capped: the index
evicts its oldest blocks, the token memory its least recent, the groups their quietest.
"""
from __future__ import annotations

import zlib
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ..parse.kvevents import Batch, Cleared, Removed, Stored

OTHER = "other"  # the label of everything past a table's cap
NO_SALT, UNKNOWN = "none", "unknown"  # a prompt sent without cache_salt; one whose first block we never saw
CHUNK_GAP = 5.0  # seconds within which a store hanging on the last one's tail is that prefill's next chunk


@dataclass(frozen=True)
class Limits:
    blocks: int = 200_000  # blocks indexed (hash -> parent, group, depth), the oldest evicted first
    token_memory: int = 4096  # blocks whose tokens are kept to compare a new sibling with
    groups: int = 64  # prompt groups followed (by their first block), the quietest dropped first
    labels: int = 64  # distinct cache_salt / LoRA values counted apart, the rest as "other"
    horizon: float = 900.0  # seconds of per-second counts kept: the short window and the ten before it
    reuse_window: float = 300.0  # a block stored again this soon after its removal was evicted before its reuse
    volatile_span: int = 8  # at most this many differing tokens (or a quarter block) make two siblings one prompt


@dataclass(frozen=True)
class Divergence:
    """Where the newest volatile sibling differed from the one cached before it."""

    t: float
    group: str
    depth: int | None  # blocks before the one that differs (None: its parent was not indexed)
    offset: int  # tokens the two blocks share before the first that differs
    block_size: int
    before: tuple[int, ...]  # the cached block's tokens
    after: tuple[int, ...]  # the new block's tokens

    @property
    def same_tokens(self) -> int | None:
        """Tokens of the prompt before the first that changes."""
        return None if self.depth is None else self.depth * self.block_size + self.offset


@dataclass
class Counts:
    stores: int = 0  # BlockStored events: about one per request that missed something
    new_first: int = 0  # ... whose first block was new
    volatile: int = 0  # ... whose first new block differs from a cached sibling in a short span
    blocks: int = 0
    tokens: int = 0
    restored: int = 0  # blocks stored again within reuse_window of their removal
    removed: int = 0
    clears: int = 0
    by_group: dict = field(default_factory=dict)  # tokens computed, by prompt group
    by_salt: dict = field(default_factory=dict)
    by_lora: dict = field(default_factory=dict)

    def add(self, other: Counts) -> None:
        for name in ("stores", "new_first", "volatile", "blocks", "tokens", "restored", "removed", "clears"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("by_group", "by_salt", "by_lora"):
            mine = getattr(self, name)
            for key, value in getattr(other, name).items():
                mine[key] = mine.get(key, 0) + value


@dataclass(frozen=True)
class Window:
    since: float
    seconds: float
    counts: Counts
    cleared_at: float | None  # the newest clear of the whole cache in the window
    divergence: Divergence | None  # the newest in the window
    groups: dict  # group -> (its first block's tokens, where they differ from the other groups'), for the groups counted


def _span(a, b) -> tuple[int, int]:
    """(tokens shared before the first difference, tokens that differ between the shared start and end)."""
    n = min(len(a), len(b))
    start = 0
    while start < n and a[start] == b[start]:
        start += 1
    end = 0
    while end < n - start and a[len(a) - 1 - end] == b[len(b) - 1 - end]:
        end += 1
    return start, max(len(a), len(b)) - start - end


def top_and_other(counts: dict, top: int) -> list[tuple[str, float]]:
    """The `top` keys by value, then the rest summed as "other" (with any "other" already counted)."""
    ranked = sorted(((k, v) for k, v in counts.items() if k != OTHER), key=lambda kv: (-kv[1], kv[0]))
    rest = sum(v for _, v in ranked[top:]) + counts.get(OTHER, 0)
    return ranked[:top] + ([(OTHER, rest)] if rest else [])


class BlockIndex:
    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.blocks: OrderedDict = OrderedDict()  # hash -> (parent, group, depth, cache_salt)
        self.tokens: OrderedDict = OrderedDict()  # hash -> array of its tokens (least recent first)
        self.first_child: OrderedDict = OrderedDict()  # parent hash (None: the roots) -> the first block stored under it
        self.groups: OrderedDict = OrderedDict()  # group -> (its first block's tokens, where they differ from the others')
        self.tails: OrderedDict = OrderedDict()  # the last block of each store -> when: the next chunk of one prefill hangs there
        self.removed_at: OrderedDict = OrderedDict()  # hash -> when it was removed
        self.buckets: deque = deque()  # (second, Counts)
        self.clears: deque = deque(maxlen=64)  # times
        self.divergences: deque = deque(maxlen=16)
        self.labelled: dict[str, OrderedDict] = {}  # "salt", "lora" -> the values counted apart, when last seen
        self.evicted = 0  # index entries dropped for the cap
        self.last_seq: int | None = None

    def apply(self, batch: Batch, now: float) -> None:
        for event in batch.events:
            if isinstance(event, Stored):
                self._stored(event, now)
            elif isinstance(event, Removed):
                self._bucket(now).removed += len(event.hashes)
                for h in event.hashes:
                    if self.blocks.pop(h, None) is not None:
                        self.removed_at[h] = now
                        self.removed_at.move_to_end(h)
                self._cap(self.removed_at, self.limits.blocks)
            elif isinstance(event, Cleared):
                self.reset(now, cleared=True)

    def reset(self, now: float, cleared: bool) -> None:
        """The cache is empty: a clear of it, or a new publisher (its sequence started again)."""
        for table in (self.blocks, self.tokens, self.first_child, self.removed_at, self.tails):
            table.clear()
        if cleared:
            self._bucket(now).clears += 1
            self.clears.append(now)

    def _stored(self, ev: Stored, now: float) -> None:
        known = self.blocks.get(ev.parent) if ev.parent is not None else None
        depth = 0 if ev.parent is None else (known[2] + 1 if known is not None and known[2] is not None else None)
        # chunked prefill stores one request's blocks in several events, each hanging on the last one's tail
        tail = self.tails.pop(ev.parent, None) if ev.parent is not None else None
        chunk = tail is not None and now - tail <= CHUNK_GAP and ev.parent not in self.first_child
        if chunk:
            group, volatile = (known[1] if known is not None else OTHER), False
            self.first_child[ev.parent] = ev.hashes[0]
        else:
            group, volatile = self._place(ev.parent, ev.hashes[0], array("q", ev.tokens_of(0)), known, depth, ev.block_size, now)
        counts = self._bucket(now)
        if not chunk:
            counts.stores += 1
            counts.new_first += ev.parent is None
            counts.volatile += volatile
        n_tokens = len(ev.token_ids)
        counts.blocks += len(ev.hashes)
        counts.tokens += n_tokens
        self._count(counts.by_group, group, n_tokens)
        # vLLM keys only a prompt's first block by its cache_salt: the blocks after it inherit it
        salt = next((s for s in ev.salts if s is not None), NO_SALT if ev.parent is None else known[3] if known is not None else UNKNOWN)
        self._count(counts.by_salt, self._admit("salt", salt, now), n_tokens)
        if ev.lora is not None:
            self._count(counts.by_lora, self._admit("lora", ev.lora, now), n_tokens)
        parent = ev.parent
        for i, h in enumerate(ev.hashes):
            removed = self.removed_at.pop(h, None)
            if removed is not None and now - removed <= self.limits.reuse_window:
                counts.restored += 1
            self.blocks[h] = (parent, group, None if depth is None else depth + i, salt)
            self.blocks.move_to_end(h)
            parent = h
        self.tails[parent] = now
        self._cap(self.tails, 4096)
        self.evicted += self._cap(self.blocks, self.limits.blocks)

    def _place(self, parent, head, tokens: array, known, depth, block_size: int, now: float) -> tuple[str, bool]:
        """(the prompt group of a new block, whether it is a volatile sibling of a cached one)."""
        short = max(self.limits.volatile_span, block_size // 4)
        if parent is None:
            for group, (rep_tokens, _) in reversed(self.groups.items()):
                offset, span = _span(rep_tokens, tokens)
                if span <= short:
                    self.groups.move_to_end(group)
                    if span:
                        self.divergences.append(Divergence(now, group, 0, offset, block_size, tuple(rep_tokens), tuple(tokens)))
                    return group, span > 0
            # named by its tokens: the same prompt is the same group after our restart too
            group = f"{zlib.crc32(tokens.tobytes()):08x}"
            start = max((_span(rep, tokens)[0] for rep, _ in self.groups.values()), default=0)
            self.groups[group] = (tokens, start)
            while len(self.groups) > self.limits.groups:
                self.groups.popitem(last=False)
            return group, False
        group = known[1] if known is not None else OTHER
        sibling = self.first_child.get(parent)
        if sibling is None or sibling == head:
            self.first_child[parent] = head
            self._cap(self.first_child, self.limits.blocks)
            self._remember(head, tokens)
            return group, False
        before = self.tokens.get(sibling)
        if before is None:
            return group, False
        offset, span = _span(before, tokens)
        if 0 < span <= short:
            self.divergences.append(Divergence(now, group, depth, offset, block_size, tuple(before), tuple(tokens)))
            return group, True
        return group, False

    def _remember(self, h, tokens: array) -> None:
        self.tokens[h] = tokens
        self.tokens.move_to_end(h)
        self._cap(self.tokens, self.limits.token_memory)

    @staticmethod
    def _count(table: dict, key: str, n: int) -> None:
        table[key] = table.get(key, 0) + n

    def _admit(self, kind: str, value: str, now: float) -> str:
        """`value` counted apart while at most `labels` values of its kind were seen within
        the horizon; past that, as "other": a tenant per request cannot grow the tables."""
        seen = self.labelled.setdefault(kind, OrderedDict())
        if value not in seen:
            while seen and now - next(iter(seen.values())) > self.limits.horizon:
                seen.popitem(last=False)
            if len(seen) >= self.limits.labels:
                return OTHER
        seen[value] = now
        seen.move_to_end(value)
        return value

    @staticmethod
    def _cap(table: OrderedDict, cap: int) -> int:
        dropped = 0
        while len(table) > cap:
            table.popitem(last=False)
            dropped += 1
        return dropped

    def _bucket(self, now: float) -> Counts:
        second = int(now)
        if not self.buckets or self.buckets[-1][0] != second:
            self.buckets.append((second, Counts()))
            while self.buckets and self.buckets[0][0] < now - self.limits.horizon:
                self.buckets.popleft()
        return self.buckets[-1][1]

    def window(self, now: float, seconds: float) -> Window:
        """What happened in the `seconds` up to `now`."""
        since = now - seconds
        total = Counts()
        for second, counts in reversed(self.buckets):
            if second > now:
                continue
            if second < since:
                break
            total.add(counts)
        total.by_group = dict(top_and_other(total.by_group, self.limits.groups))
        cleared = next((t for t in reversed(self.clears) if since <= t <= now), None)
        divergence = next((d for d in reversed(self.divergences) if since <= d.t <= now), None)
        reps = {g: (tuple(tokens), start) for g, (tokens, start) in self.groups.items() if g in total.by_group}
        return Window(since, seconds, total, cleared, divergence, reps)

    def size(self) -> dict[str, int]:
        return {"blocks": len(self.blocks), "token_memory": len(self.tokens), "groups": len(self.groups),
                "removed": len(self.removed_at), "buckets": len(self.buckets)}


@dataclass(frozen=True)
class KVView:
    """One engine's event stream as the rules, the collector and the status page read it."""

    endpoint: str
    connected: bool = False
    last_message: float | None = None  # when the newest batch arrived
    received: int = 0  # batches decoded and applied
    dropped: int = 0  # batches the sequence numbers say never arrived (or arrived after a replay gave up)
    errors: int = 0  # messages that did not decode, or broke a cap
    shed: int = 0  # batches dropped unread over the processing budget of a flood
    restarts: int = 0  # publishers that started their sequence again: their cache is new
    replayed: int = 0  # batches a replay gave back
    evicted: int = 0  # index entries dropped for its cap
    size: tuple[tuple[str, int], ...] = ()
    last_error: str | None = None
    recent: Window | None = None  # the rules' short window
    earlier: Window | None = None  # the ten short windows before it: what was usual
    divergence_text: str | None = None  # where the newest volatile block differs, decoded
    group_labels: tuple[tuple[str, str], ...] = ()  # group -> its text where it differs from the others

    def live(self, since: float) -> bool:
        """Events arrived since `since`: what they do not show did not happen."""
        return self.connected and self.last_message is not None and self.last_message >= since
