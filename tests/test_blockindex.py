"""exporter/series/blockindex.py and exporter/series/kvtext.py: what the events say of one
engine's cache, kept within bounds, and the text a person reads of it."""
from __future__ import annotations

import json

from exporter.parse.kvevents import decode
from exporter.parse.tokenjson import TokenText
from exporter.series import kvtext
from exporter.series.blockindex import OTHER, BlockIndex, Limits

from kvpub import CLEARED, frames, removed, stored

BS = 16
HEADER = list(range(100, 116))  # a prompt's first block: the template and the start of the system prompt


def feed(index: BlockIndex, t: float, *events, seq=[0]) -> None:
    seq[0] += 1
    index.apply(decode(frames(seq[0], events)), t)


def stamped(i: int) -> list[int]:
    """The first block with a clock in tokens 12-13: a value that changes per request."""
    block = HEADER.copy()
    block[12], block[13] = 900 + i, 950 + i
    return block


def test_a_static_prompt_stores_its_first_block_once_and_each_request_only_its_own_turn():
    index = BlockIndex()
    feed(index, 0.0, stored([1, 9], None, HEADER + list(range(600, 616))))  # the first request: the prompt and its turn
    for i in range(5):
        feed(index, 1.0 + i, stored([10 + i], 1, range(200 + 16 * i, 216 + 16 * i), salt=None))
    c = index.window(10.0, 60.0).counts
    assert (c.stores, c.new_first, c.volatile, c.blocks, c.tokens) == (6, 1, 0, 7, 112)
    assert index.window(10.0, 60.0).divergence is None


def test_a_timestamp_atop_the_prompt_makes_every_request_a_volatile_first_block_with_the_tokens_it_changes():
    index = BlockIndex()
    feed(index, 0.0, stored([1], None, stamped(0)))
    for i in range(1, 6):
        feed(index, float(i), stored([100 + i], None, stamped(i)))
    w = index.window(10.0, 60.0)
    assert (w.counts.stores, w.counts.new_first, w.counts.volatile) == (6, 6, 5)
    assert len(w.counts.by_group) == 1  # one prompt, not six: the groups hold prompts that differ in a short span
    d = w.divergence
    assert (d.depth, d.offset, d.same_tokens) == (0, 12, 12)
    assert d.after[12:14] == (905, 955) and d.before[12:14] == (900, 950)


def test_a_change_deep_in_the_prompt_is_found_under_the_cached_parent_and_placed_by_its_depth():
    index = BlockIndex()
    feed(index, 0.0, stored([1, 2, 20], None, HEADER + list(range(300, 316)) + stamped(7)))
    feed(index, 1.0, stored([3], 2, stamped(0)))
    feed(index, 2.0, stored([4], 2, stamped(1)))
    d = index.window(3.0, 60.0).divergence
    assert d.depth == 2 and d.same_tokens == 2 * BS + 12


def test_different_user_turns_under_one_system_prompt_are_no_change():
    index = BlockIndex()
    feed(index, 0.0, stored([1], None, HEADER))
    feed(index, 1.0, stored([2], 1, range(200, 216)))
    feed(index, 2.0, stored([3], 1, range(400, 416)))  # another question: differs all along
    assert index.window(3.0, 60.0).counts.volatile == 0


def test_a_block_stored_again_soon_after_its_removal_was_evicted_before_its_reuse():
    index = BlockIndex(Limits(reuse_window=300.0))
    feed(index, 0.0, stored([1], None, HEADER))
    feed(index, 10.0, removed([1]))
    feed(index, 20.0, stored([1], None, HEADER))
    feed(index, 30.0, removed([1]))
    feed(index, 400.0, stored([1], None, HEADER))  # long after: a cold prompt, not pressure
    assert index.window(25.0, 60.0).counts.restored == 1
    assert index.window(400.0, 60.0).counts.restored == 0


def test_a_clear_of_the_whole_cache_empties_the_index_and_is_dated():
    index = BlockIndex()
    feed(index, 0.0, stored([1], None, HEADER))
    feed(index, 5.0, CLEARED)
    assert index.window(6.0, 60.0).cleared_at == 5.0 and index.size()["blocks"] == 0


def test_tenants_apart_by_cache_salt_which_only_a_prompts_first_block_carries():
    index = BlockIndex()
    feed(index, 0.0, stored([1, 2], None, HEADER * 2, salt="tenant-a"))
    feed(index, 1.0, stored([3], 2, range(200, 216)))  # its turn: no salt on the event, the first block's
    feed(index, 2.0, stored([5], None, HEADER, salt="tenant-b", lora="support-bot"))
    c = index.window(3.0, 60.0).counts
    assert c.by_salt == {"tenant-a": 48, "tenant-b": 16} and c.by_lora == {"support-bot": 16}


def test_every_table_stays_under_its_cap_whatever_the_stream():
    limits = Limits(blocks=100, token_memory=10, groups=4, labels=3, horizon=60.0)
    index = BlockIndex(limits)
    for i in range(1000):
        feed(index, float(i), stored([10_000 + i], None, [i] * BS, salt=f"tenant-{i}"), removed([i]))
    sizes = index.size()
    assert sizes["blocks"] <= 100 and sizes["token_memory"] <= 10 and sizes["groups"] <= 4 and sizes["removed"] <= 100
    assert sizes["buckets"] <= 61 and index.evicted == 900
    c = index.window(999.0, 60.0).counts
    assert len(c.by_salt) <= 4 and OTHER in c.by_salt and len(c.by_group) <= 5


def test_the_window_counts_only_its_own_seconds():
    index = BlockIndex()
    feed(index, 0.0, stored([1], None, HEADER))
    feed(index, 100.0, stored([2], None, list(range(500, 516))))
    assert index.window(100.0, 60.0).counts.stores == 1
    assert index.window(40.0, 60.0).counts.stores == 1  # the earlier window: up to its own end only


def test_the_change_reads_as_the_line_it_is_in_with_a_tokenizer_and_as_ids_without(tiny_tokenizer):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(tiny_tokenizer))
    decoder = TokenText(json.loads(tiny_tokenizer.read_text())).decode
    a = hf.encode("<s>system\nCurrent date and time: 2026-12-07 17:42:13\nYou are a helpful assistant.").ids
    b = hf.encode("<s>system\nCurrent date and time: 2026-12-07 17:43:58\nYou are a helpful assistant.").ids
    index = BlockIndex()
    size = max(len(a), len(b))
    feed(index, 0.0, stored([1], None, a, block_size=size))
    feed(index, 1.0, stored([2], None, b, block_size=size))
    d = index.window(2.0, 60.0).divergence
    text = kvtext.divergence(d, decoder)
    assert f"token {d.same_tokens + 1} changes" in text
    assert "`Current date and time: 2026-12-07 17:" in text and "43:58`" in text and "42:13`" in text, text
    assert "[" in kvtext.divergence(d, None)


def test_groups_are_named_by_where_they_differ_not_by_the_template_they_share_and_keep_their_name():
    index = BlockIndex()
    template = list(range(1, 11))
    feed(index, 0.0, stored([1], None, template + list(range(50, 72)), block_size=32))
    feed(index, 1.0, stored([2], None, template + list(range(60, 82)), block_size=32))
    labels = kvtext.group_labels(index.window(2.0, 60.0).groups, None)
    first, second = labels.values()
    assert first.startswith("[1 2 3") and second.startswith("…") and "60 61 62" in second
    for i in range(3, 10):  # a third prompt later changes neither name
        feed(index, float(i), stored([i], None, [99] * 32, block_size=32))
    assert list(kvtext.group_labels(index.window(10.0, 60.0).groups, None).values())[:2] == [first, second]


def test_one_prompt_with_a_timestamp_stays_one_group_however_many_requests_come():
    index = BlockIndex(Limits(token_memory=10))
    for i in range(5000):
        feed(index, i / 100, stored([10_000 + i], None, stamped(i)))
    assert len(index.groups) == 1 and index.window(50.0, 60.0).counts.volatile == 4999


def test_the_chunks_of_one_prefill_are_one_request_and_a_salt_less_prompt_counts_as_none():
    index = BlockIndex()
    feed(index, 0.0, stored([1, 2], None, HEADER * 2))  # one request's prefill in two chunks
    feed(index, 0.1, stored([3, 4], 2, HEADER * 2))
    feed(index, 9.0, stored([5], 4, HEADER))  # long after: another request
    feed(index, 9.5, stored([7], 999, HEADER))  # under a block we never saw
    c = index.window(10.0, 60.0).counts
    assert (c.stores, c.new_first, c.blocks) == (3, 1, 6)
    assert c.by_salt == {"none": 80, "unknown": 16}
