"""vLLM's automatic prefix cache as a pure model, for replaying a request sample.

Blocks are full runs of `block_size` tokens; each block's hash chains its parent's hash,
its tokens and the request's extra keys (a LoRA adapter name; a `cache_salt`, which vLLM
mixes into the first block), so one changed token invalidates every block after it and
two tenants with different salts never share a block. The partial last block is never
cached, and a hit never covers the whole prompt: the last token is always computed, so
at most (n - 1) // block_size blocks hit. Each replica has its own pool; with a
capacity, the least recently used blocks are evicted (requests are replayed one after
the other, so every block is unreferenced between requests). A finished request gives
its blocks back tail first, as vLLM's KV-cache manager frees them, so its last block is
evicted before its first: a prompt's cached blocks stay a prefix of it.

Prefill takes time: with a prefill rate, a request's blocks become reusable only when its
prefill ends, at its arrival plus its uncached tokens over the rate (no queueing), so
requests that arrive meanwhile with the same new prefix all miss it (a cache stampede).
With an infinite rate a request's blocks are reusable the moment it arrives.
"""
from __future__ import annotations

import heapq
import math
import random
import zlib
from bisect import bisect_left
from collections import OrderedDict
from itertools import groupby, repeat
from typing import Sequence

ROUND_ROBIN, RANDOM, SESSION, PREFIX_HASH, OBSERVED = "round_robin", "random", "session", "prefix_hash", "observed"
POLICIES = (ROUND_ROBIN, RANDOM, SESSION, PREFIX_HASH, OBSERVED)
PREFIX_HASH_BLOCKS = 4  # prefix-aware routers hash the first few blocks of a prompt


def block_hashes(tokens: Sequence[int], block_size: int, lora: str | None = None, salt: str | None = None) -> list[int]:
    """The chained hashes of the prompt's full blocks."""
    parent = hash(("salt", salt)) if salt else 0
    out = []
    full = len(tokens) - len(tokens) % block_size
    if lora is None:
        for start in range(0, full, block_size):
            parent = hash((parent, tuple(tokens[start:start + block_size])))
            out.append(parent)
    else:
        for start in range(0, full, block_size):
            parent = hash((parent, tuple(tokens[start:start + block_size]), lora))
            out.append(parent)
    return out


def cacheable_blocks(n_tokens: int, block_size: int) -> int:
    """At most this many leading blocks can hit: the last token is always computed."""
    return max(0, (n_tokens - 1) // block_size)


class BlockPool:
    """One replica's cached blocks: unlimited (a set) or LRU with `capacity` blocks.

    `chained`: the hashes chain (each stands for its block and every one before it), so
    the pool holds a prefix of any prompt's blocks (blocks are stored a whole prompt at a
    time and given back tail first) and the matched run is found by bisection."""

    __slots__ = ("capacity", "chained", "_lru", "_set")

    def __init__(self, capacity: int | None = None, chained: bool = False):
        self.capacity = capacity
        self.chained = chained
        self._lru: OrderedDict[int, None] | None = OrderedDict() if capacity is not None else None
        self._set: set[int] | None = set() if capacity is None else None

    def serve(self, hashes: Sequence[int], n_tokens: int, block_size: int) -> int:
        """Look the request up, cache its blocks, and return its hit tokens."""
        matched = self.matched(hashes)
        self.store(hashes, matched)
        return min(matched, cacheable_blocks(n_tokens, block_size)) * block_size

    def lookup(self, hashes: Sequence[int], n_tokens: int, block_size: int) -> int:
        """The request's hit tokens: its leading blocks held, never its last token."""
        return min(self.matched(hashes), cacheable_blocks(n_tokens, block_size)) * block_size

    def matched(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of the prompt the pool holds."""
        pool = self._set if self._set is not None else self._lru
        if self.chained:
            # held blocks are a prefix: bisect it (a pool of millions misses the CPU cache on every
            # look-up), after the two commonest answers, nothing and everything
            if not hashes or hashes[0] not in pool:
                return 0
            if hashes[-1] in pool:
                return len(hashes)
            low, high = 1, len(hashes) - 1
            while low < high:
                mid = (low + high) // 2
                if hashes[mid] in pool:
                    low = mid + 1
                else:
                    high = mid
            return low
        matched = 0
        for h in hashes:
            if h not in pool:
                break
            matched += 1
        return matched

    def store(self, hashes: Sequence[int], held: int = 0) -> None:
        """The request's blocks, computed or reused, given back to the pool; `held`: its
        leading blocks the pool held at its look-up (an unlimited pool still holds them)."""
        if self._set is not None:
            self._set.update(hashes[held:] if held else hashes)
            return
        lru = self._lru
        # vLLM frees a request's blocks in reverse so that the tail goes first: the
        # first block ends up the most recently used (a block cached before but not
        # in the matched run is computed again and counts as used now)
        for h in reversed(hashes):
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def clear(self) -> None:
        """Every block gone at once: vLLM's sleep mode discards the KV cache."""
        (self._set if self._set is not None else self._lru).clear()

    def __len__(self) -> int:
        return len(self._set) if self._set is not None else len(self._lru)


def route(policy: str, index: int, replicas: int, session: str | None, hashes: Sequence[int], rng: random.Random,
          observed: int | None = None) -> int:
    """Which replica serves request `index`."""
    if policy == ROUND_ROBIN:
        return index % replicas
    if policy == RANDOM:
        return rng.randrange(replicas)
    if policy == SESSION:
        # requests without a session have nothing to stick to: round robin
        return zlib.crc32(session.encode()) % replicas if session else index % replicas
    if policy == PREFIX_HASH:
        head = hashes[min(len(hashes), PREFIX_HASH_BLOCKS) - 1] if hashes else 0
        return zlib.crc32(head.to_bytes(8, "little", signed=True)) % replicas
    if policy == OBSERVED:
        if observed is None:
            raise ValueError("observed routing needs the replica of every request")
        return observed
    raise ValueError(f"unknown routing policy {policy!r}")


def replay(requests: Sequence[tuple], block_size: int, policy: str,
           replicas: int, cache_blocks: int | None, seed: int = 0) -> tuple[float, float]:
    """(hit tokens, prompt tokens) of the requests, in order, through `replicas` pools
    of `cache_blocks` each under `policy`. A request is (block hashes, prompt tokens,
    session, observed replica index[, counted]): one not counted only warms the caches."""
    hits = replay_each(requests, block_size, policy, replicas, cache_blocks, seed)
    hit = total = 0
    for request, h in zip(requests, hits):
        if len(request) < 5 or request[4]:
            hit += h
            total += request[1]
    return float(hit), float(total)


def replay_each(requests: Sequence[tuple], block_size: int, policy: str, replicas: int, cache_blocks: int | None,
                seed: int = 0, arrivals: Sequence[float] | None = None, prefill_tokens_per_s: float = math.inf,
                chained: bool = False) -> list[int]:
    """The hit tokens of each request (counted or not), as `replay` serves them. With
    `arrivals` (seconds, in the requests' order) and a finite `prefill_tokens_per_s`, a
    request's blocks become reusable when its prefill ends: arrival + uncached tokens / rate.
    `chained`: the hashes chain (BlockPool), which makes look-ups faster."""
    pools = [BlockPool(cache_blocks, chained) for _ in range(replicas)]
    rng = random.Random(seed)
    hits = [0] * len(requests)
    if arrivals is None or prefill_tokens_per_s == math.inf:
        for i, request in enumerate(requests):
            hashes, n, session, observed = request[:4]
            hits[i] = pools[route(policy, i, replicas, session, hashes, rng, observed)].serve(hashes, n, block_size)
        return hits
    # per replica, the requests still in prefill: (when it ends, index, blocks, blocks held at
    # its look-up); a pool only changes when its own requests end, so each replica catches up
    # before its next look-up
    in_prefill: list[list[tuple[float, int, Sequence[int], int]]] = [[] for _ in range(replicas)]
    for i, request in enumerate(requests):
        hashes, n, session, observed = request[:4]
        replica = route(policy, i, replicas, session, hashes, rng, observed)
        pool, pending, now = pools[replica], in_prefill[replica], arrivals[i]
        while pending and pending[0][0] <= now:
            _, _, done, held = heapq.heappop(pending)
            pool.store(done, held)
        matched = pool.matched(hashes)
        hit = min(matched, cacheable_blocks(n, block_size)) * block_size
        hits[i] = hit
        heapq.heappush(pending, (now + (n - hit) / prefill_tokens_per_s, i, hashes, matched))
    return hits


def chained(requests: Sequence[tuple]) -> bool:
    """Whether every block hash stands behind one and the same parent in every prompt,
    as chained hashes do (vLLM's, and the hash ids of Mooncake's traces)."""
    parent: dict[int, object] = {}
    root = object()
    setdefault = parent.setdefault
    for request in requests:
        hashes = request[0]
        prev = root
        for h in hashes:
            if setdefault(h, prev) != prev:
                return False
            prev = h
    return True


def hits_by_capacity(requests: Sequence[tuple], block_size: int, policy: str, replicas: int,
                     capacities: Sequence[int | None], seed: int = 0) -> list[float]:
    """Hit tokens of `replay` at every capacity (blocks per replica, None unlimited) in
    one pass. The hashes must chain (`chained`); otherwise replay each size.

    LRU with a fixed access order is a stack algorithm (Mattson et al., 1970): a pool
    of C blocks holds the C most recent blocks whatever C is, so one pass that finds
    each looked-up block's depth in its replica's recency stack answers every size. With
    chained hashes a block stands at the same position in every prompt that holds it
    and is used whenever a later block of its chain is; given back tail first, a
    request's blocks still held form a run from one position to its end, and a
    block's depth is the blocks held by later requests plus those before it in its own
    request's run. Depths of a prompt's leading blocks rise, so a pool of C blocks hits
    the leading blocks of depth below C."""
    routes = []
    rng = random.Random(seed)
    for i, request in enumerate(requests):
        routes.append(route(policy, i, replicas, request[2], request[0], rng, request[3]))
    served = [0] * replicas
    for r in routes:
        served[r] += 1
    # per replica: a Fenwick tree of the blocks each request (by local index) still
    # holds, each request's first position still held, every block's newest request,
    # and the blocks held in all
    trees = [[0] * (n + 1) for n in served]
    starts = [[0] * n for n in served]
    newest: list[dict[int, int]] = [{} for _ in range(replicas)]
    held = [0] * replicas
    local = [0] * replicas
    finite = sorted((c, k) for k, c in enumerate(capacities) if c is not None)
    unlimited = [k for k, c in enumerate(capacities) if c is None]
    hits = [0] * len(capacities)
    from_here = [0] * len(finite)  # hit tokens of every size from the j-th smallest up
    for request, replica in zip(requests, routes):
        hashes, n = request[0], request[1]
        tree, start, last = trees[replica], starts[replica], newest[replica]
        size = len(tree) - 1
        me = local[replica]
        local[replica] += 1
        owners = list(map(last.get, hashes))
        matched = owners.index(None) if None in owners else len(owners)
        depths: list[int] = []
        i = 0
        # the matched blocks in runs of one owner: a prompt's blocks come from a few requests, so
        # the runs are few and are found in C (a prompt of a real trace has a hundred blocks)
        for owner, run in groupby(owners[:matched]):
            c = len(list(run))
            s, k = 0, owner + 1
            while k > 0:
                s += tree[k]
                k -= k & -k
            first = held[replica] - s + i - start[owner]  # blocks of later requests, then of its own run
            depths.extend(range(first, first + c))
            start[owner] += c
            k = owner + 1
            while k <= size:
                tree[k] -= c
                k += k & -k
            i += c
        k = me + 1
        while k <= size:
            tree[k] += len(hashes)
            k += k & -k
        held[replica] += len(hashes) - matched
        last.update(zip(hashes, repeat(me)))
        if matched and (len(request) < 5 or request[4]):
            top = min(matched, cacheable_blocks(n, block_size))
            for j, (cap, k) in enumerate(finite):
                reach = bisect_left(depths, cap)
                if reach >= top:  # this size and every larger one hit all they can: added once, below
                    from_here[j] += top * block_size
                    break
                hits[k] += reach * block_size
            for k in unlimited:
                hits[k] += top * block_size
    running = 0
    for j, (_, k) in enumerate(finite):
        running += from_here[j]
        hits[k] += running
    return [float(h) for h in hits]
