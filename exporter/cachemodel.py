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
"""
from __future__ import annotations

import random
import zlib
from collections import OrderedDict
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
    """One replica's cached blocks: unlimited (a set) or LRU with `capacity` blocks."""

    __slots__ = ("capacity", "_lru", "_set")

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self._lru: OrderedDict[int, None] | None = OrderedDict() if capacity is not None else None
        self._set: set[int] | None = set() if capacity is None else None

    def serve(self, hashes: Sequence[int], n_tokens: int, block_size: int) -> int:
        """Look the request up, cache its blocks, and return its hit tokens."""
        limit = cacheable_blocks(n_tokens, block_size)
        matched = 0
        if self._set is not None:
            pool = self._set
            for h in hashes:
                if h not in pool:
                    break
                matched += 1
            pool.update(hashes[matched:])
        else:
            lru = self._lru
            for h in hashes:
                if h not in lru:
                    break
                matched += 1
            # vLLM frees a request's blocks in reverse so that the tail goes first: the
            # first block ends up the most recently used (a block cached before but not
            # in the matched run is computed again and counts as used now)
            for h in reversed(hashes):
                lru[h] = None
                lru.move_to_end(h)
            while len(lru) > self.capacity:
                lru.popitem(last=False)
        return min(matched, limit) * block_size

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
    pools = [BlockPool(cache_blocks) for _ in range(replicas)]
    rng = random.Random(seed)
    hits = total = 0
    for i, request in enumerate(requests):
        hashes, n, session, observed = request[:4]
        pool = pools[route(policy, i, replicas, session, hashes, rng, observed)]
        hit = pool.serve(hashes, n, block_size)
        if len(request) < 5 or request[4]:
            hits += hit
            total += n
    return float(hits), float(total)
