"""KV cache event batches as vLLM 0.32.0 encodes them (exporter/parse/kvevents.py reads
them), and a publisher of them on 127.0.0.1 for the tests of the reader."""
from __future__ import annotations

import time

import msgpack


def stored(hashes, parent, tokens, block_size=16, salt=None, lora=None) -> dict:
    keys = [([lora] if lora else []) + ([salt] if salt else []) or None for _ in hashes]
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent, "token_ids": list(tokens),
            "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": lora, "extra_keys": keys,
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def removed(hashes) -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}


CLEARED = {"type": "AllBlocksCleared"}


def frames(seq: int, events, topic: bytes = b"kv", ts: float | None = None) -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), msgpack.packb([time.time() if ts is None else ts, list(events), 0])]
