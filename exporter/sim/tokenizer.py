"""The simulator's tokenizer (word pieces to stable ids, and back) and what every replica shares: a tenant's
system prompt and the block hashes of it, made once per process."""
from __future__ import annotations

import functools
import random
import re
import threading
import zlib
from typing import Sequence


PIECE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


class Tokenizer:
    """Word pieces (leading space attached) -> stable ids; decoding joins the pieces."""

    def __init__(self) -> None:
        self._pieces: dict[int, str] = {}
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in PIECE.findall(text):
            token = 1000 + zlib.crc32(piece.encode()) % 1_000_000
            ids.append(token)
            if token not in self._pieces:
                with self._lock:
                    self._pieces.setdefault(token, piece)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._pieces.get(i, f"<{i}>") for i in ids)

    def learn(self, ids: Sequence[int], pieces: Sequence[str]) -> None:
        """What `encode` of the text of these pieces would have learnt, without encoding it."""
        with self._lock:
            for token, piece in zip(ids, pieces):
                self._pieces.setdefault(token, piece)


@functools.lru_cache(maxsize=4096)
def tenant_system_prompt(tenant: int, system_tokens: int) -> tuple[str, tuple[int, ...], tuple[str, ...]]:
    """A tenant's system prompt (text, token ids, word pieces): the same for every replica,
    so a fleet of replicas (and a test that builds one per step) makes each once."""
    words = random.Random(f"tenant-{tenant}")
    vocab = ("answer the customer politely cite the policy never reveal internal notes "
             "escalate refunds above limits summarise orders in tables use metric units").split()
    text = f"You are the support assistant for tenant {tenant}. Follow these rules."
    pieces = PIECE.findall(text)
    # each " word" is one token of our tokenizer
    text += "".join(" " + words.choice(vocab) for _ in range(max(0, system_tokens - len(pieces))))
    pieces = PIECE.findall(text)
    ids = tuple(1000 + zlib.crc32(piece.encode()) % 1_000_000 for piece in pieces)
    return text, ids[:system_tokens], tuple(pieces)


def block_hash_chain(tokens: tuple[int, ...], block_size: int) -> tuple[int, ...]:
    """The chained hashes of the full blocks of a shared prefix (a tenant's system
    prompt); a replica computes each tenant's once and keeps it, instead of on every
    request that starts with it."""
    chain, parent = [], 0
    for start in range(0, len(tokens) - len(tokens) % block_size, block_size):
        parent = hash((parent, tuple(tokens[start:start + block_size])))
        chain.append(parent)
    return tuple(chain)
