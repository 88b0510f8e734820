"""Block-hash traces: the Qwen-Bailian format's records, its conversations, and ids made
prefix ids (Mooncake's format is read through whatif in tests/test_whatif.py)."""
import pytest

from exporter.tools import hashtrace

LINE = {"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 40, "output_length": 132,
        "type": "text", "turn": 2, "hash_ids": [1089, 1090, 1091]}


def test_a_bailian_record_keeps_its_conversation_link_type_and_turn():
    rec = hashtrace.bailian_fields(LINE)
    assert (rec.chat_id, rec.parent_chat_id, rec.request_type, rec.turn) == (159, 55, "text", 2)
    assert rec.timestamp == 61.114 and rec.hash_ids == (1089, 1090, 1091) and rec.input_length == 40
    assert hashtrace.bailian_fields({**LINE, "parent_chat_id": -1}).parent_chat_id is None  # a root
    assert hashtrace.is_bailian(LINE) and not hashtrace.is_bailian({"input_length": 40, "hash_ids": [1]})


@pytest.mark.parametrize("change, fragment", [
    pytest.param({"chat_id": None}, "needs `chat_id`", id="no-chat-id"),
    pytest.param({"chat_id": True}, "`chat_id` must be", id="bool-chat-id"),
    pytest.param({"parent_chat_id": [1]}, "`parent_chat_id` must be", id="list-parent"),
    pytest.param({"timestamp": "x"}, "`timestamp` must be a number (seconds)", id="string-timestamp"),
    pytest.param({"type": 3}, "`type` must be a string", id="numeric-type"),
    pytest.param({"turn": -1}, "`turn` must be a non-negative integer", id="negative-turn"),
    pytest.param({"turn": 1.5}, "`turn` must be a non-negative integer", id="fractional-turn"),
    pytest.param({"hash_ids": [1, True]}, "64-bit integers", id="bool-hash-id"),
    pytest.param({"hash_ids": [1 << 63]}, "64-bit integers", id="too-big-hash-id"),
    pytest.param({"input_length": 0}, "positive integer", id="zero-length"),
])
def test_a_bad_bailian_record_says_what_is_wrong(change, fragment):
    with pytest.raises(ValueError) as err:
        hashtrace.bailian_fields({k: v for k, v in {**LINE, **change}.items() if v is not None})
    assert fragment in str(err.value)


def test_a_mooncake_timestamp_is_milliseconds_and_says_so():
    with pytest.raises(ValueError, match=r"\(milliseconds\)"):
        hashtrace.fields({"timestamp": "x", "input_length": 1, "hash_ids": []})
    assert hashtrace.fields({"timestamp": 1500, "input_length": 1024, "hash_ids": [-(1 << 63), (1 << 63) - 1]}) == \
        (1500.0, (-(1 << 63), (1 << 63) - 1), 1024)


def test_a_conversation_is_the_chain_of_parents_down_to_its_root():
    links = [(1, None), (2, 1), (3, 2), (10, None), (11, 10), (4, 3)]
    assert hashtrace.conversation_roots(links) == [1, 1, 1, 10, 10, 1]


def test_a_child_listed_before_its_parent_finds_the_same_root():
    assert hashtrace.conversation_roots([(3, 2), (2, 1), (1, None)]) == [1, 1, 1]


def test_a_parent_the_trace_does_not_hold_stands_for_its_conversation():
    """A cut of a trace starts in the middle of conversations: turns whose parent came
    before the cut belong together, under the missing parent's id."""
    assert hashtrace.conversation_roots([(5, 99), (6, 5), (7, 99), (8, 42)]) == [99, 99, 99, 42]


def test_a_loop_of_parents_ends_and_keeps_its_members_together():
    roots = hashtrace.conversation_roots([(1, 2), (2, 3), (3, 1), (4, 4), (5, 1)])
    assert roots[0] == roots[1] == roots[2] == roots[4] and roots[3] == 4


def test_ids_that_chain_already_are_kept():
    prompts = [(1, 2, 3), (1, 2, 4), (1, 5), (6,)]
    assert [tuple(p) for p in hashtrace.prefix_ids(prompts)] == prompts


def test_an_id_behind_two_prefixes_becomes_two_ids_from_there_on():
    """Per-block hashes (the Qwen-Bailian README's salted SipHash of each block) give a
    block the same id behind any prefix; its KV values differ, so a prefix cache must not
    match it behind another prefix: from that id on, ids are chained to the ones before."""
    a, b, c = (1, 2, 7, 8), (3, 4, 7, 8), (1, 2, 7, 9)
    out = [tuple(p) for p in hashtrace.prefix_ids([a, b, c])]
    assert out[0][:2] == (1, 2) and out[1][:2] == (3, 4)  # before the shared block: as they were
    assert out[0][2] != out[1][2] and out[0][3] != out[1][3]  # 7 and 8 behind 1 2 are not 7 and 8 behind 3 4
    assert out[2][:3] == out[0][:3] and out[2][3] != out[0][3]  # the same prefix still matches, to where it differs
    assert len({i for p in out for i in p}) == 1 + 1 + 2 + 2 + 2 + 1  # 1 2 3 4, 7 and 8 twice over, 9
    assert hashtrace.prefix_ids([a, b, c]) == hashtrace.prefix_ids([a, b, c])  # the same in every run (routing uses them)


def test_an_id_that_opens_one_prompt_and_follows_another_is_two_blocks():
    out = [tuple(p) for p in hashtrace.prefix_ids([(5, 6), (1, 5, 6)])]
    assert out[0][0] != out[1][1] and out[0][1] != out[1][2]


def test_the_partial_last_block_is_never_a_full_block():
    assert list(hashtrace.full_blocks((1, 2, 3), 40, 16)) == [1, 2]
    assert list(hashtrace.full_blocks((1, 2), 32, 16)) == [1, 2]
    assert hashtrace.misfits([(1, (1, 2, 3), 40), (2, (1, 2), 40), (3, (1,), 40)], 16) == (1, 3)
