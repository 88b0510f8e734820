"""The what-if analysis by group: which prefixes (system prompts, tenants) lose the most,
and the grouping by a trace's request type and turn."""
import json
import random

import pytest

from exporter.tools import whatif, whatif_groups

BS = 16
PROMPTS = {"a": 60, "b": 30, "c": 10}  # requests per system prompt: three tenants of different popularity


def three_tenants():
    """Each tenant's system prompt is 20 full blocks of its own; every request adds 40
    tokens of its own. The tenants' requests arrive shuffled (seeded)."""
    order = [name for name, count in PROMPTS.items() for _ in range(count)]
    random.Random(5).shuffle(order)
    base = {"a": 10_000, "b": 20_000, "c": 30_000}
    rows = [{"t": i, "prompt_token_ids": list(range(base[name], base[name] + 20 * BS)) + [10 ** 6 + 40 * i + k for k in range(40)]}
            for i, name in enumerate(order)]
    return order, list(whatif.read_requests(json.dumps(r) for r in rows))


def expected(order, replicas):
    """By hand: a request hits its tenant's 320 tokens when its replica served the tenant before."""
    seen, hits = set(), {name: 0 for name in PROMPTS}
    for i, name in enumerate(order):
        if (name, i % replicas) in seen:
            hits[name] += 20 * BS
        seen.add((name, i % replicas))
    return {name: hits[name] / (PROMPTS[name] * (20 * BS + 40)) for name in PROMPTS}


def test_three_system_prompts_are_three_groups_with_their_own_ratios():
    order, requests = three_tenants()
    a = whatif.analyze(requests, 4, ("round_robin", "prefix_hash"), None, BS)
    groups = a.prefix_groups["groups"]
    assert a.prefix_groups["count"] == 3 and a.prefix_groups["rest"] is None
    first = {name: order.index(name) for name in PROMPTS}
    by_name = {name: next(g for g in groups if g["example_line"] == first[name] + 1) for name in PROMPTS}
    assert [g["requests"] for g in groups] == [60, 30, 10]  # the most prompt tokens first
    rr = expected(order, 4)
    one = expected(order, 1)
    for name, g in by_name.items():
        assert g["prompt_tokens"] == PROMPTS[name] * (20 * BS + 40)
        assert g["ceiling"] == one[name]
        assert g["policies"]["round_robin"] == rr[name]
        assert g["points_lost"]["round_robin"] == round((one[name] - rr[name]) * 100, 2)
        assert g["first_block"].startswith(f"tokens {10_000 * ('abc'.index(name) + 1)} ")
    # under prefix-hash routing a tenant stays on one replica: only its first request misses
    for name, g in by_name.items():
        assert g["policies"]["prefix_hash"] == g["ceiling"] and g["points_lost"]["prefix_hash"] == 0
    # round robin makes each tenant miss once on every replica: the rarest loses the most of its own ratio
    assert all({i % 4 for i, n in enumerate(order) if n == name} == {0, 1, 2, 3} for name in PROMPTS)
    assert by_name["c"]["points_lost"]["round_robin"] > by_name["b"]["points_lost"]["round_robin"] > by_name["a"]["points_lost"]["round_robin"]
    shares = [g["share_of_lost"]["round_robin"] for g in groups]
    assert sum(shares) == pytest.approx(1) and all(g["share_of_lost"]["prefix_hash"] is None for g in groups)


def test_the_groups_are_in_the_json_and_the_report():
    _, requests = three_tenants()
    a = whatif.analyze(requests, 4, ("round_robin",), None, BS)
    out = a.to_json()
    assert [g["requests"] for g in out["prefix_groups"]] == [60, 30, 10] and out["prefix_groups_count"] == 3
    report = whatif.report(a)
    assert "prefix groups: the requests by their first block (3 group(s)" in report
    g = out["prefix_groups"][2]
    line = next(l for l in report.splitlines() if l.strip().startswith(f"line {g['example_line']}: tokens 30000 "))
    assert f"{g['policies']['round_robin'] * 100:.1f}%" in line and f"{-g['points_lost']['round_robin']:+5.1f}" in line


def test_beyond_the_top_groups_the_rest_are_summed():
    keys = [k % 13 for k in range(130)]
    tokens = [100 + k for k in range(130)]
    ceiling = [50] * 130
    hits = {"round_robin": [10] * 130}
    grouped = whatif_groups.groups(keys, tokens, [True] * 130, ceiling, hits, lambda i: {"first": i}, top=10)
    assert grouped["count"] == 13 and len(grouped["groups"]) == 10 and grouped["rest"]["groups"] == 3
    shown = sum(g["prompt_tokens"] for g in grouped["groups"])
    assert shown + grouped["rest"]["prompt_tokens"] == sum(tokens)
    assert [g["first"] for g in grouped["groups"]] == [12, 11, 10, 9, 8, 7, 6, 5, 4, 3]  # most tokens first
    assert sum(g["share_of_lost"]["round_robin"] for g in grouped["groups"]) + grouped["rest"]["share_of_lost"]["round_robin"] == pytest.approx(1)
    assert grouped["rest"]["share_of_lost"]["round_robin"] == pytest.approx(3 * 10 * 40 / (130 * 40))


def test_requests_that_only_warm_the_caches_are_not_counted():
    grouped = whatif_groups.groups(["x", "x", "y"], [100, 100, 100], [False, True, True], [0, 60, 0],
                                   {"session": [0, 60, 0]}, lambda i: {"first": i}, tags=["text", None, "image"])
    assert [(g["first"], g["requests"]) for g in grouped["groups"]] == [(1, 1), (2, 1)]
    assert grouped["groups"][0]["ceiling"] == 0.6 and "types" not in grouped["groups"][0]
    assert grouped["groups"][1]["types"] == {"image": 1}


@pytest.mark.parametrize("turn, bucket", [(None, None), (0, "1"), (1, "1"), (2, "2"), (3, "3-4"), (4, "3-4"), (8, "5-8"), (9, "9+")])
def test_turns_are_grouped_in_buckets(turn, bucket):
    assert whatif_groups.turn_bucket(turn) == bucket


def test_a_trace_is_grouped_by_its_request_types_and_any_other_type_is_other():
    lines = [json.dumps({"chat_id": i, "parent_chat_id": -1, "timestamp": i, "input_length": 33, "type": kind, "turn": 1,
                         "hash_ids": [1, 2, 3]}) for i, kind in enumerate(["text", "text", "image", "made-up", "another"])]
    lines.append(json.dumps({"chat_id": 9, "parent_chat_id": -1, "timestamp": 9, "input_length": 33, "hash_ids": [1, 2, 3]}))
    a = whatif.analyze(list(whatif.read_requests(lines)), 1, ("round_robin",), None, None)
    assert {g["type"]: g["requests"] for g in a.to_json()["by_type"]} == {"text": 2, "image": 1, "other": 2, "unknown": 1}
    (group,) = a.prefix_groups["groups"]  # one first block
    assert group["first_block"] == "hash id 1" and group["types"] == {"text": 2, "other": 2, "image": 1}
    assert group["ceiling"] == 5 * 32 / (6 * 33)


def test_groups_whose_prompts_differ_only_in_a_timestamp_are_named_by_the_timestamp():
    """Two deploys' prompts share a long template; the first 30 characters named them all alike."""
    template = "You are the support bot of an online store. Answer briefly and politely. "
    rows = [{"t": i, "prompt": f"Current date and time: 2026-12-07 17:4{i % 3}:1{i}\n{template}Where is my order {i}?"}
            for i in range(9)]
    requests = list(whatif.read_requests(json.dumps(r) for r in rows))
    a = whatif.analyze(requests, tokenizer=whatif.approximate_tokenizer(), block_size=16)
    names = [g["first_block"] for g in a.prefix_groups["groups"]]
    assert len(set(names)) == len(names) > 1, names
    assert all(n.startswith("…") and "17:4" in n for n in names), names


def test_where_texts_first_differ_is_found_among_sorted_neighbours():
    starts = whatif_groups.distinct_starts({"a": "same start, then A", "b": "same start, then B", "c": "other"})
    assert starts == {"a": 17, "b": 17, "c": 0}
