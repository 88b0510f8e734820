"""Block-hash traces: what teams can share instead of prompts, and what KV-cache research
publishes. Pure.

A line is one request, `{"timestamp": ms, "input_length": N, "hash_ids": [...]}` (the
format of Mooncake's FAST'25 traces, which add `output_length`): `hash_ids` are the
prompt's chained prefix-block hashes, remapped to small integers, `block_size` tokens a
block, the last one for a partial block when N is not a multiple of the block size. Two
requests with the same id at the same place share that block and every one before it.
The trace does not say its block size: the user gives it.
"""
from __future__ import annotations

from typing import Sequence

MOONCAKE_BLOCK_SIZE = 512  # the FAST'25 release's README: "The block size is 512 tokens"
KEYS = ("hash_ids", "input_length")
_INT64 = 1 << 63  # routing packs a hash into 8 bytes


def is_record(obj: dict) -> bool:
    """A line that means to be a block-hash record (one of its keys is enough to say so)."""
    return any(key in obj for key in KEYS)


def fields(obj: dict) -> tuple[float | None, tuple[int, ...], int]:
    """(timestamp in ms or None, hash ids, input length) of a record; ValueError says what is wrong."""
    missing = [key for key in KEYS if key not in obj]
    if missing:
        raise ValueError(f"a block-hash record needs both `hash_ids` and `input_length` (`{missing[0]}` is missing)")
    length = obj["input_length"]
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise ValueError("`input_length` must be a positive integer")
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and -_INT64 <= i < _INT64 for i in ids):
        raise ValueError("`hash_ids` must be a list of 64-bit integers")
    stamp = obj.get("timestamp")
    if stamp is not None and (isinstance(stamp, bool) or not isinstance(stamp, (int, float))):
        raise ValueError("`timestamp` must be a number (milliseconds)")
    return (None if stamp is None else float(stamp)), tuple(ids), length


def full_blocks(ids: Sequence[int], input_length: int, block_size: int) -> list[int]:
    """The ids of the prompt's full blocks: the partial last block is never cached."""
    return list(ids[: input_length // block_size])


def misfits(records: Sequence[tuple[int, Sequence[int], int]], block_size: int) -> tuple[int, int | None]:
    """(count, first line) of records whose number of ids is neither the full blocks nor
    the full blocks and a partial one at `block_size`: a wrong --block-size shows here."""
    count, first = 0, None
    for line, ids, length in records:
        if len(ids) not in (length // block_size, -(-length // block_size)):
            count += 1
            first = line if first is None else first
    return count, first
