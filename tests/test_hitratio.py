"""The ratio policy and the units, in one place: every module that judges, pools or shows
a hit ratio, or weighs a count against a token floor, asks exporter/series/hitratio.py."""
import ast
from pathlib import Path

import pytest

from exporter.series import hitratio
from exporter.series.hitratio import (DEFAULT_BLOCK_SIZE, judged_counts, judged_ratio, judged_tokens, lookup_ratio, ratio,
                               shown_ratio, tokens)
from exporter.series.window import WindowStats, _WindowValues

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"


def window(**values) -> WindowStats:
    base = dict.fromkeys(f for f in _WindowValues._fields if f != "lazy_ttft")
    base.update(window="5m", seconds=300.0, samples=61)
    base.update(values)
    return WindowStats(**base)


@pytest.mark.parametrize("part, whole, expected", [(1500.0, 1000.0, 1.0), (-5.0, 1000.0, 0.0), (250.0, 1000.0, 0.25)])
def test_a_ratio_stays_within_0_and_1(part, whole, expected):
    assert ratio(part, whole) == expected


def test_the_ratio_the_rules_judge_stays_within_0_and_1_when_hits_run_ahead_of_queries():
    """Hits and queries are read at different moments: a window may see more hits than
    queries; the rules judge at most 100%, as the windows and the gate do."""
    ws = window(query_increase=1000.0, hit_increase=1500.0, unit="tokens")
    assert lookup_ratio(ws) == 1.0 == judged_ratio(ws)
    assert judged_ratio(window(query_increase=1000.0, hit_increase=1500.0, unit="tokens",
                               admitted_hit_increase=-5.0, admitted_prompt_increase=1000.0)) == 0.0


def test_the_admitted_ratio_is_judged_where_the_target_has_it_else_the_lookup_one():
    both = window(query_increase=1000.0, hit_increase=900.0, unit="tokens",
                  admitted_hit_increase=300.0, admitted_prompt_increase=1000.0)
    assert judged_ratio(both) == 0.3 and judged_counts(both) == (300.0, 1000.0)
    lookup_only = window(query_increase=1000.0, hit_increase=900.0, unit="tokens")
    assert judged_ratio(lookup_only) == 0.9 and judged_counts(lookup_only) == (900.0, 1000.0)
    # admitted counters that saw no prompt token say nothing: the lookup ratio stands
    idle = window(query_increase=1000.0, hit_increase=900.0, unit="tokens", admitted_hit_increase=0.0, admitted_prompt_increase=0.0)
    assert judged_ratio(idle) == 0.9
    assert judged_ratio(window()) is None and judged_counts(window()) == (0.0, 0.0) == judged_counts(None)


@pytest.mark.parametrize("unit, block_size, expected", [
    ("tokens", 32, 1000.0),
    ("blocks", 32, 32000.0),  # the target's own block size (vllm:cache_config_info)
    ("blocks", None, 1000.0 * DEFAULT_BLOCK_SIZE),  # a target that never said its block size
    (None, 32, 1000.0),  # engines of one model counting in different units: as it is
])
def test_a_count_in_tokens(unit, block_size, expected):
    assert tokens(1000.0, unit, block_size) == expected


def test_the_judged_tokens_are_admitted_prompt_tokens_else_lookups_in_tokens_of_the_block_size():
    assert judged_tokens(window(query_increase=1000.0, hit_increase=900.0, unit="blocks"), 32) == 32000.0
    assert judged_tokens(window(query_increase=1000.0, hit_increase=900.0, unit="blocks",
                                admitted_hit_increase=10.0, admitted_prompt_increase=5000.0), 32) == 5000.0
    assert judged_tokens(window(), 32) == 0.0


def test_the_shown_ratio_is_the_judged_one_where_the_window_passed_its_floor():
    assert shown_ratio(window(hit_ratio=0.9, admitted_hit_ratio=0.3)) == 0.3
    assert shown_ratio(window(hit_ratio=0.9)) == 0.9
    assert shown_ratio(window()) is None and shown_ratio(None) is None


def test_no_other_module_converts_blocks_or_states_the_policy_again():
    """`block_size or 16`, `16 if ... blocks` or the admitted-else-lookup test written
    out anew: each was a copy of this module that could drift (deploys.py took every block
    for 16 tokens while the windows took the target's own size)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "hitratio.py" or "tools" in path.parts or "sim" in path.parts:
            continue  # the offline tools take --block-size; the simulator is a vLLM, it has its own
        source = path.read_text(encoding="utf-8")
        assert "admitted_hit_increase is not None and ws.admitted_prompt_increase" not in source, \
            f"{path.name}: the admitted-else-lookup policy: use hitratio.judged_ratio / judged_counts"
        assert "ws.admitted_hit_ratio if ws.admitted_hit_ratio is not None" not in source, f"{path.name}: use hitratio.shown_ratio"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and \
                    any(isinstance(v, ast.Constant) and v.value == 16 for v in node.values):
                pytest.fail(f"{path.name}:{node.lineno}: `... or 16`: use hitratio.tokens_per_block")
            if isinstance(node, ast.IfExp) and isinstance(node.body, ast.Constant) and node.body.value == 16:
                pytest.fail(f"{path.name}:{node.lineno}: `16 if ... blocks`: use hitratio.tokens")
    assert hitratio.tokens_per_block(None) == DEFAULT_BLOCK_SIZE == 16


def test_the_judged_ratio_counts_every_tier_a_connector_included():
    """A GPU-local 30% beside 55% from the connector is a healthy 85%: judging the local
    ratio alone raised alarms on a healthy fleet and none when the connector went away."""
    lookup = window(query_increase=1000.0, hit_increase=300.0, external_hit_increase=550.0, unit="tokens")
    assert judged_ratio(lookup) == pytest.approx(0.85) and lookup_ratio(lookup) == 0.3
    assert hitratio.tier_shares(lookup) == pytest.approx({"device": 0.3, "external": 0.55})
    admitted = window(query_increase=1000.0, hit_increase=300.0, unit="tokens", admitted_hit_increase=280.0,
                      admitted_prompt_increase=1000.0, external_transfer_increase=560.0)
    assert judged_counts(admitted) == (840.0, 1000.0) and hitratio.tier_tokens(admitted) == {"device": 280.0, "external": 560.0}
    named = window(query_increase=1000.0, hit_increase=700.0, unit="tokens", tier_increases=(("device", 400.0), ("host", 300.0)))
    assert judged_ratio(named) == 0.7 and hitratio.tier_shares(named) == pytest.approx({"device": 0.4, "host": 0.3})
    assert hitratio.tiers_in_use([lookup, window(query_increase=1000.0, hit_increase=1.0, external_hit_increase=0.0, unit="tokens")]) \
        == {"device", "external"}
    assert hitratio.tiers_in_use([window(query_increase=1000.0, hit_increase=1.0, external_hit_increase=0.0, unit="tokens")]) \
        == {"device"}  # vLLM declares its connector's counters at 0 without one: no second tier


def test_every_count_for_a_floor_or_a_pool_is_in_tokens_also_of_a_target_counting_blocks():
    """HitsStuckAtZero, CountersDisagree and the gate compared min_query_tokens with a
    0.8.x target's block counts, 16-32x too few (issue 30)."""
    blocks = window(query_increase=1000.0, hit_increase=250.0, unit="blocks", block_size=32)
    assert hitratio.query_tokens(blocks) == 32000.0 and hitratio.hit_tokens(blocks) == 8000.0
    assert judged_counts(blocks) == (8000.0, 32000.0) and judged_tokens(blocks) == 32000.0
    assert judged_ratio(blocks) == 0.25
    assert hitratio.query_tokens(window(query_increase=1000.0, hit_increase=250.0, unit="blocks")) == 16000.0
    assert hitratio.query_tokens(None) == 0.0
