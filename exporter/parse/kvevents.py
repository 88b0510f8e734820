"""vLLM's KV cache events, decoded from the frames of one ZeroMQ message. Pure.

With `--kv-events-config` vLLM publishes what its prefix cache computes and drops: a
message is [topic, 8-byte big-endian sequence number, msgpack EventBatch], the batch
`[ts, events, data_parallel_rank]`. Releases since 0.10 tag each event as a map
(`{"type": "BlockStored", ...}`); earlier ones sent tagged positional arrays
(`["BlockStored", hashes, parent, token_ids, block_size, lora_id, ...]`): both decode here.
A block hash is an integer or bytes, by release. A publisher is a peer: every length is
capped before it is trusted, and anything off the format is an error, never a guess.
"""
from __future__ import annotations

from dataclasses import dataclass


MAX_PAYLOAD = 8 * 1024 * 1024  # bytes of one batch: a long prompt's blocks are well under 1 MiB
MAX_ITEMS = 1_000_000  # entries of any one msgpack array (hashes, token ids) or map
END_OF_REPLAY = (1 << 64) - 1  # the replay socket's last frame: sequence -1 as an unsigned 8-byte number


class KVEventError(ValueError):
    """A message that is not a KV event batch of a known shape."""


@dataclass(frozen=True)
class Stored:
    """Blocks vLLM computed and cached, in prompt order: each hash's parent is the one before it."""

    hashes: tuple
    parent: object | None  # the block before the first: None for a prompt's first block
    token_ids: tuple[int, ...]  # every block's tokens, one block after the other
    block_size: int
    lora: str | None = None
    salts: tuple[str | None, ...] = ()  # per block: the request's cache_salt, from extra_keys
    medium: str | None = None

    def tokens_of(self, i: int) -> tuple[int, ...]:
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]


@dataclass(frozen=True)
class Removed:
    hashes: tuple
    medium: str | None = None


@dataclass(frozen=True)
class Cleared:
    """The whole cache dropped at once (sleep mode, reset_prefix_cache)."""


@dataclass(frozen=True)
class Batch:
    seq: int
    ts: float
    events: tuple
    rank: int | None = None


def decode(frames: list[bytes]) -> Batch:
    """One message [topic, seq, payload] (a replay's reply drops its empty delimiter first)."""
    if len(frames) != 3:
        raise KVEventError(f"{len(frames)} frames, expected topic, sequence and payload")
    _, seq_bytes, payload = frames
    if len(seq_bytes) != 8:
        raise KVEventError(f"a sequence number of {len(seq_bytes)} bytes, expected 8")
    if len(payload) > MAX_PAYLOAD:
        raise KVEventError(f"a batch of {len(payload)} bytes, over the {MAX_PAYLOAD} cap")
    import msgpack  # here, not at the top: a sidecar without kv_events never loads it

    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False, max_array_len=MAX_ITEMS,
                                max_map_len=MAX_ITEMS, max_str_len=MAX_PAYLOAD, max_bin_len=MAX_PAYLOAD)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise KVEventError(f"not msgpack: {type(exc).__name__}: {str(exc)[:120]}") from None
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], (list, tuple)):
        raise KVEventError("not an EventBatch [ts, events, rank]")
    ts, events = batch[0], batch[1]
    rank = batch[2] if len(batch) > 2 and isinstance(batch[2], int) else None
    if not isinstance(ts, (int, float)):
        raise KVEventError("a batch without a timestamp")
    return Batch(int.from_bytes(seq_bytes, "big"), float(ts), tuple(_event(e) for e in events), rank)


def _event(raw) -> Stored | Removed | Cleared:
    if isinstance(raw, dict):
        kind, get = raw.get("type"), raw.get
    elif isinstance(raw, (list, tuple)) and raw:
        kind = raw[0]
        fields = POSITIONAL.get(kind, ())
        values = dict(zip(fields, raw[1:]))
        get = values.get
    else:
        raise KVEventError("an event that is neither a map nor a tagged array")
    if kind == "BlockStored":
        hashes, tokens, size = _hashes(get("block_hashes")), get("token_ids"), get("block_size")
        if not isinstance(tokens, (list, tuple)) or not all(type(t) is int for t in tokens):
            raise KVEventError("BlockStored without integer token_ids")
        if type(size) is not int or size <= 0 or len(tokens) > len(hashes) * size:
            raise KVEventError(f"BlockStored with block_size {size!r} for {len(tokens)} tokens in {len(hashes)} blocks")
        parent = get("parent_block_hash")
        if parent is not None and not _is_hash(parent):
            raise KVEventError("BlockStored with a parent that is not a block hash")
        lora = get("lora_name")
        return Stored(hashes, parent, tuple(tokens), size, lora if isinstance(lora, str) else None,
                      _salts(get("extra_keys"), len(hashes), lora), _text(get("medium")))
    if kind == "BlockRemoved":
        return Removed(_hashes(get("block_hashes")), _text(get("medium")))
    if kind == "AllBlocksCleared":
        return Cleared()
    raise KVEventError(f"an event of unknown type {str(kind)[:40]!r}")


# tagged positional arrays of releases before 0.10, fields in order after the tag
POSITIONAL = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                              "lora_name", "extra_keys"),
              "BlockRemoved": ("block_hashes", "medium"), "AllBlocksCleared": ()}


def _is_hash(value) -> bool:
    return (type(value) is int) or (isinstance(value, bytes) and 0 < len(value) <= 64)


def _hashes(raw) -> tuple:
    if not isinstance(raw, (list, tuple)) or not all(_is_hash(h) for h in raw):
        raise KVEventError("block_hashes is not a list of block hashes")
    return tuple(raw)


def _text(raw) -> str | None:
    return raw[:64] if isinstance(raw, str) else None


def _salts(extra, blocks: int, lora) -> tuple[str | None, ...]:
    """Each block's cache_salt. extra_keys holds, per block, the LoRA name first (when the
    block has one), then (mm id, offset) pairs, the salt, and prompt-embedding digests:
    the salt is the one string that is not the LoRA's name."""
    if not isinstance(extra, (list, tuple)) or len(extra) != blocks:
        return ()
    salts = []
    for keys in extra:
        strings = [k for k in keys if isinstance(k, str)] if isinstance(keys, (list, tuple)) else []
        if isinstance(lora, str) and strings and strings[0] == lora:
            strings = strings[1:]
        salts.append(strings[0][:128] if strings else None)
    return tuple(salts)
