"""Block-hash traces: what teams can share instead of prompts, and what KV-cache research
publishes. Pure. Two formats, told apart by their keys:

- Mooncake's FAST'25 traces: `{"timestamp": ms, "input_length": N, "output_length": M,
  "hash_ids": [...]}`. `hash_ids` are the prompt's chained prefix-block hashes, remapped
  to small integers, the last one for a partial block when N is not a multiple of the
  block size. Two requests with the same id at the same place share that block and every
  one before it. The trace does not say its block size: the user gives it.
- Alibaba's Qwen-Bailian traces (the data of "KVCache Cache in the Wild", USENIX ATC'25):
  `{"chat_id", "parent_chat_id" (-1 for a root), "timestamp" (seconds from the trace's
  start), "input_length", "output_length", "type" (text/search/image/file), "turn",
  "hash_ids"}`, 16 tokens a hash id (the format says so). Its README describes the ids as a
  salted SipHash of each 16-token block, remapped to integers: nothing says an id stands
  for the blocks before it, so `prefix_ids` chains them as a prefix cache does. A
  conversation is the chain of parents down to its root (`conversation_roots`).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Hashable, Sequence

from ..peers.jsonlines import finite_number

MOONCAKE_BLOCK_SIZE = 512  # the FAST'25 release's README: "The block size is 512 tokens"
BAILIAN_BLOCK_SIZE = 16  # the Qwen-Bailian README: "Salted SipHash blocks (16 tokens per block)"
MOONCAKE, BAILIAN = "mooncake", "qwen_bailian"
FORMAT_NAMES = {MOONCAKE: "Mooncake's FAST'25 format", BAILIAN: "the Qwen-Bailian format"}
KEYS = ("hash_ids", "input_length")
BAILIAN_KEYS = ("chat_id", "parent_chat_id")
_INT64 = 1 << 63  # routing packs a hash into 8 bytes
# A prompt of 10^400 tokens (an OverflowError in the report's arithmetic) or a line of ten
# million ids (some 100 bytes each in the replay: a few such lines went past 4 GB) is no
# trace: a line holds at most a 16M-token prompt at 16 tokens a hash id, a file (whatif
# keeps the whole sample) some 20 million ids, about 2 GB; Qwen-Bailian's 100,000
# requests hold some 12 million.
MAX_INPUT_LENGTH = 10 ** 12
MAX_IDS_PER_LINE = 1 << 20
MAX_IDS_PER_FILE = 20_000_000
_ROOT = 1 << 64  # the parent of a first block: no id (they are 64-bit) is, and hash() of it is the same in every run


def is_record(obj: dict) -> bool:
    """A line that means to be a block-hash record (one of its keys is enough to say so)."""
    return any(key in obj for key in KEYS)


def fields(obj: dict, unit: str = "milliseconds") -> tuple[float | None, tuple[int, ...], int]:
    """(timestamp or None, hash ids, input length) of a record; ValueError says what is wrong."""
    missing = [key for key in KEYS if key not in obj]
    if missing:
        raise ValueError(f"a block-hash record needs both `hash_ids` and `input_length` (`{missing[0]}` is missing)")
    length = obj["input_length"]
    if isinstance(length, bool) or not isinstance(length, int) or not 0 < length <= MAX_INPUT_LENGTH:
        raise ValueError(f"`input_length` must be a positive integer of at most {MAX_INPUT_LENGTH:.0e} tokens")
    ids = obj["hash_ids"]
    if isinstance(ids, list) and len(ids) > MAX_IDS_PER_LINE:
        raise ValueError(f"`hash_ids` holds {len(ids):,} ids, more than the {MAX_IDS_PER_LINE:,} a prompt can have")
    # type() is int for no bool; the set, min and max run in C, over ~100 ids a line
    if not isinstance(ids, list) or (ids and (set(map(type, ids)) != {int} or min(ids) < -_INT64 or max(ids) >= _INT64)):
        raise ValueError("`hash_ids` must be a list of 64-bit integers")
    stamp = obj.get("timestamp")
    if stamp is not None and finite_number(stamp) is None:
        raise ValueError(f"`timestamp` must be a number ({unit}), and finite")
    return (None if stamp is None else float(stamp)), tuple(ids), length


# --- the Qwen-Bailian format ---------------------------------------------------------------------
REQUEST_TYPES = ("text", "search", "image", "file")


@dataclass(frozen=True)
class BailianRecord:
    timestamp: float | None  # seconds from the trace's start
    hash_ids: tuple[int, ...]
    input_length: int
    chat_id: int | str
    parent_chat_id: int | str | None  # None for a root (-1 in the file)
    request_type: str | None
    turn: int | None


def is_bailian(obj: dict) -> bool:
    """A line that means to be a Qwen-Bailian record: one of its conversation keys says so."""
    return any(key in obj for key in BAILIAN_KEYS)


def bailian_fields(obj: dict) -> BailianRecord:
    """The record of a Qwen-Bailian line; ValueError says what is wrong."""
    stamp, ids, length = fields(obj, unit="seconds")
    chat, parent = obj.get("chat_id"), obj.get("parent_chat_id", -1)
    if chat is None:
        raise ValueError("a Qwen-Bailian record needs `chat_id`")
    for key, value in (("chat_id", chat), ("parent_chat_id", parent)):
        if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, int) and not -_INT64 <= value < _INT64):
            raise ValueError(f"`{key}` must be an integer or a string")
    kind, turn = obj.get("type"), obj.get("turn")
    if kind is not None and not isinstance(kind, str):
        raise ValueError("`type` must be a string (text, search, image or file)")
    if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 0):
        raise ValueError("`turn` must be a non-negative integer")
    return BailianRecord(stamp, ids, length, chat, None if parent in (-1, "-1") else parent, kind, turn)


def conversation_roots(links: Sequence[tuple[Hashable, Hashable | None]]) -> list[Hashable]:
    """The root of each (chat id, parent chat id or None) in `links`: the chain of parents
    followed down to a chat without a parent, or to a parent the trace does not hold (the
    conversation began before the trace did, and that parent's id stands for it). A chain
    that loops (a broken trace) ends where it comes back."""
    parent_of: dict = {}
    for chat, parent in links:
        parent_of.setdefault(chat, parent)  # a chat id seen twice keeps its first parent
    root_of: dict = {}
    roots = []
    for chat, _ in links:
        path, seen, node = [], set(), chat
        while node not in root_of:
            if node not in parent_of or parent_of[node] is None or node in seen:
                root_of[node] = node
                break
            seen.add(node)
            path.append(node)
            node = parent_of[node]
        root = root_of[node]
        for member in path:
            root_of[member] = root
        roots.append(root)
    return roots


def prefix_ids(prompts: Sequence[Sequence[int]]) -> list[Sequence[int]]:
    """Each prompt's block ids made prefix ids: an id stands for its block behind the ids
    before it, as a block's KV values do. Ids that chain already (every id behind one and
    the same parent in every prompt: Mooncake's) are kept; from the first id that stands
    behind two parents somewhere in the trace, a prompt's ids are chained to the ids before
    them. Only those are rewritten: an id before it, with a single parent all the way
    back, already names its whole prefix."""
    # every id's parent, the last seen winning; an id seen behind another parent elsewhere
    # then differs from it there (map, zip and the list comparison run in C: ~100 ids a prompt)
    parent_of: dict = {}
    for ids in prompts:
        parent_of.update(zip(ids, chain((_ROOT,), ids)))
    ambiguous: set = set()
    for ids in prompts:
        parents = [_ROOT, *ids[:-1]] if ids else []
        if list(map(parent_of.__getitem__, ids)) != parents:
            ambiguous.update(i for i, p, q in zip(ids, map(parent_of.__getitem__, ids), parents) if p != q)
    if not ambiguous:
        return list(prompts)
    out = []
    for ids in prompts:
        if ambiguous.isdisjoint(ids):
            out.append(ids)
            continue
        at = next(k for k, i in enumerate(ids) if i in ambiguous)
        # hash() of a tuple of ints is the same in every run: routing on these ids is too
        parent, chained_ids = (ids[at - 1] if at else _ROOT), list(ids[:at])
        for i in ids[at:]:
            parent = hash((parent, i))
            chained_ids.append(parent)
        out.append(chained_ids)
    return out


def full_blocks(ids: Sequence[int], input_length: int, block_size: int) -> Sequence[int]:
    """The ids of the prompt's full blocks: the partial last block is never cached."""
    return ids[: input_length // block_size]


def misfits(records: Sequence[tuple[int, Sequence[int], int]], block_size: int) -> tuple[int, int | None]:
    """(count, first line) of records whose number of ids is neither the full blocks nor
    the full blocks and a partial one at `block_size`: a wrong --block-size shows here."""
    count, first = 0, None
    for line, ids, length in records:
        if len(ids) not in (length // block_size, -(-length // block_size)):
            count += 1
            first = line if first is None else first
    return count, first
