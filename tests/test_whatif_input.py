"""Reading a `whatif` sample: JSON request records, vLLM's request log, and the lines of
block-hash traces in Mooncake's and Qwen-Bailian's formats; a bad line is an error naming it."""
import json

import pytest

from exporter.tools import hashtrace
from exporter.tools.whatif_input import Request, SampleError, read_requests

from conftest import FIXTURES


def test_vllm_request_log_lines_of_each_version():
    items = list(read_requests((FIXTURES / "whatif" / "vllm-request-log.txt").read_text().splitlines()))
    a, b, c, bad = items
    assert a.tokens == tuple(range(1, 19)) and a.lora is None and a.t is not None
    assert b.tokens[-2:] == (99, 98) and b.lora == "sql-adapter"
    assert c.tokens is None and c.prompt == "Only text here"
    assert isinstance(bad, SampleError) and "line 4" in str(bad)


@pytest.mark.parametrize("line, fragment", [
    pytest.param("not json at all", "neither a JSON request", id="garbage"),
    pytest.param("{bad json", "not JSON", id="broken-json"),
    pytest.param("[1, 2]", "neither", id="a-list"),
    pytest.param('{"t": "x", "prompt": "a"}', "`t` must be a number", id="bad-t"),
    pytest.param('{"prompt_token_ids": []}', "non-empty list of integers", id="empty-ids"),
    pytest.param('{"prompt_token_ids": [1, "2"]}', "non-empty list of integers", id="string-id"),
    pytest.param('{"body": {"messages": []}}', "non-empty `messages`", id="empty-messages"),
    pytest.param('{"session": "x"}', "one of `prompt_token_ids`", id="no-prompt"),
    pytest.param('{"hash_ids": [1, 2]}', "`input_length` is missing", id="no-length"),
    pytest.param('{"input_length": 600}', "`hash_ids` is missing", id="no-ids"),
    pytest.param('{"input_length": 0, "hash_ids": []}', "positive integer", id="zero-length"),
    pytest.param('{"input_length": 600, "hash_ids": [1, "2"]}', "64-bit integers", id="string-hash-id"),
    pytest.param('{"input_length": 600, "hash_ids": [18446744073709551616]}', "64-bit integers", id="too-big"),
    pytest.param('{"input_length": 600, "hash_ids": [1], "timestamp": "x"}', "`timestamp` must be a number", id="bad-timestamp"),
    pytest.param('{"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.5, "input_length": 40}', "`hash_ids` is missing", id="bailian-no-ids"),
    pytest.param('{"chat_id": 1.5, "input_length": 40, "hash_ids": [1]}', "`chat_id` must be", id="bailian-float-chat-id"),
    pytest.param('{"parent_chat_id": -1, "input_length": 40, "hash_ids": [1]}', "needs `chat_id`", id="bailian-no-chat-id"),
    pytest.param('{"chat_id": 1, "input_length": 40, "hash_ids": [1], "timestamp": NaN}', "not JSON", id="bailian-nan-timestamp"),
])
def test_bad_lines_are_errors_with_their_line_number(line, fragment):
    (item,) = list(read_requests(["", line]))
    assert isinstance(item, SampleError) and str(item).startswith("line 2:") and fragment in str(item)


def test_a_bailian_timestamp_is_seconds_and_a_mooncake_timestamp_milliseconds():
    bailian = {"chat_id": 7, "parent_chat_id": 3, "timestamp": 61.114, "input_length": 40, "output_length": 9,
               "type": "search", "turn": 2, "hash_ids": [5, 6, 7]}
    mooncake = {"timestamp": 61114, "input_length": 1024, "output_length": 9, "hash_ids": [5, 6]}
    a, b = read_requests([json.dumps(bailian), json.dumps(mooncake)])
    assert a.t == 61.114 and b.t == 61.114
    assert (a.trace, b.trace) == (hashtrace.BAILIAN, hashtrace.MOONCAKE)
    assert (a.chat_id, a.parent_chat_id, a.request_type, a.turn) == (7, 3, "search", 2)
    assert a.hash_ids == (5, 6, 7) and a.input_length == 40 and a.is_hashes and a.has_session_key
    assert not b.has_session_key and b.chat_id is None


def test_a_bailian_root_has_no_parent_and_its_own_session_key():
    (root,) = read_requests(['{"chat_id": "c-1", "parent_chat_id": -1, "input_length": 16, "hash_ids": [1]}'])
    assert isinstance(root, Request) and root.parent_chat_id is None and root.chat_id == "c-1" and root.t is None
    assert root.has_session_key and root.session is None  # the analysis gives it its conversation
