"""exporter/parse/kvevents.py: vLLM's KV event batches, both encodings, and what a hostile publisher sends."""
from __future__ import annotations

import msgpack
import pytest

from exporter.parse.kvevents import MAX_ITEMS, MAX_PAYLOAD, Cleared, KVEventError, Removed, Stored, decode

from kvpub import CLEARED, frames, removed, stored


def test_a_batch_of_vllm_0_32_tagged_maps_decodes_every_event_kind():
    batch = decode(frames(7, [stored([11, 12], None, range(32), salt="tenant-a"), removed([5]), CLEARED], ts=1.5))
    assert (batch.seq, batch.ts, batch.rank) == (7, 1.5, 0)
    first, gone, cleared = batch.events
    assert isinstance(first, Stored) and first.hashes == (11, 12) and first.parent is None
    assert first.tokens_of(1) == tuple(range(16, 32)) and first.salts == ("tenant-a", "tenant-a")
    assert isinstance(gone, Removed) and gone.hashes == (5,)
    assert isinstance(cleared, Cleared)


def test_the_salt_is_told_from_the_lora_name_in_extra_keys():
    [ev] = decode(frames(0, [stored([1], 9, range(16), salt="t1", lora="support-bot")])).events
    assert ev.lora == "support-bot" and ev.salts == ("t1",)
    [ev] = decode(frames(0, [stored([1], 9, range(16), lora="support-bot")])).events
    assert ev.salts == (None,)


def test_the_positional_arrays_of_releases_before_0_10_decode_the_same():
    raw = [b"kv", (3).to_bytes(8, "big"), msgpack.packb([2.0, [["BlockStored", [1, 2], None, list(range(32)), 16, None, "GPU"],
                                                          ["BlockRemoved", [1], "GPU"], ["AllBlocksCleared"]]])]
    stored_, removed_, cleared = decode(raw).events
    assert stored_.hashes == (1, 2) and stored_.block_size == 16 and removed_.hashes == (1,) and isinstance(cleared, Cleared)


def test_bytes_block_hashes_are_hashes_too():
    [ev] = decode(frames(0, [stored([b"\x01" * 32], b"\x02" * 32, range(16))])).events
    assert ev.hashes == (b"\x01" * 32,) and ev.parent == b"\x02" * 32


@pytest.mark.parametrize("bad, why", [
    ([b"kv", b"x", b""], "sequence number of 1 bytes"),
    ([b"kv", bytes(8)], "2 frames"),
    ([b"kv", bytes(8), b"\xc1garbage"], "not msgpack"),
    ([b"kv", bytes(8), msgpack.packb({"a": 1})], "not an EventBatch"),
    ([b"kv", bytes(8), msgpack.packb(["now", []])], "without a timestamp"),
    ([b"kv", bytes(8), msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": ["x"]}]])], "not a list of block hashes"),
    ([b"kv", bytes(8), msgpack.packb([1.0, [{"type": "Evil"}]])], "unknown type"),
    ([b"kv", bytes(8), msgpack.packb([1.0, [stored([1], None, range(40))]])], "block_size 16 for 40 tokens"),
    ([b"kv", bytes(8), msgpack.packb([1.0, [stored([1], None, ["a"] * 16)]])], "integer token_ids"),
    ([b"kv", bytes(8), msgpack.packb([1.0, [7]])], "neither a map"),
])
def test_anything_off_the_format_is_an_error_that_says_what(bad, why):
    with pytest.raises(KVEventError, match=why):
        decode(bad)


def test_a_batch_over_the_size_cap_is_refused_before_it_is_read():
    with pytest.raises(KVEventError, match="over the"):
        decode([b"kv", bytes(8), b"\x00" * (MAX_PAYLOAD + 1)])


def test_an_array_past_the_item_cap_is_refused_by_the_decoder_not_built():
    # ten million hashes would not fit the size cap; a million and one of 1 byte each do
    payload = msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1] * (MAX_ITEMS + 1), "medium": None}]])
    assert len(payload) <= MAX_PAYLOAD
    with pytest.raises(KVEventError, match="not msgpack"):
        decode([b"kv", bytes(8), payload])
