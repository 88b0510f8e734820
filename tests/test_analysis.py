"""Versions of one model side by side: the verdict a rollout controller gets, and a model's
rollouts over time (exporter/alerting/rollouts.py)."""
import pytest

from exporter.alerting import rollouts
from exporter.alerting.rollouts import Rollout, Settings, observe
from exporter.alerting.analysis import FAIL, INCONCLUSIVE, PASS, Member, analyze
from exporter.alerting.rules_state import FIRING
from exporter.series.window import WindowStats


def ws(hits, queries, admitted=None):
    a_hits, a_prompt = admitted if admitted else (None, None)
    return WindowStats(window="5m", seconds=300.0, query_increase=queries, hit_increase=hits, unit="tokens",
                       hit_ratio=hits / queries if queries else None, query_rate=None, hit_rate=None, external_hit_ratio=None,
                       ttft_mean=None, ttft_count_increase=None, correlation=None, ttft_per_10_points=None,
                       prompt_token_increase=None, preemption_increase=None, kv_cache_usage_max=None, samples=60,
                       admitted_hit_increase=a_hits, admitted_prompt_increase=a_prompt,
                       admitted_hit_ratio=a_hits / a_prompt if a_prompt else None)


OLD = [Member(f"old-{i}", "v41", ws(88_000, 100_000)) for i in range(3)]


@pytest.mark.parametrize("new, verdict, fragment", [
    pytest.param([Member("new-0", "v42", ws(3_000, 100_000))], FAIL, "85.0 points lower", id="timestamp-in-the-new-image"),
    pytest.param([Member("new-0", "v42", ws(85_000, 100_000))], PASS, "hits 85.0% against 88.0%", id="harmless-version"),
    pytest.param([Member("new-0", "v42", ws(100, 5_000))], INCONCLUSIVE, "too little traffic", id="under-the-floor"),
    pytest.param([Member("new-0", "v42", ws(3_000, 100_000), cold=True)], INCONCLUSIVE, "cold start", id="still-cold"),
    pytest.param([], INCONCLUSIVE, "no replica", id="version-not-running"),
    pytest.param([Member("new-0", "v42", ws(0, 0))], INCONCLUSIVE, "too little traffic", id="zero-over-zero-is-no-nan"),
])
def test_verdicts(new, verdict, fragment):
    v = analyze(OLD + new, "m", "v42")
    assert v.verdict == verdict and fragment in v.reason, v.reason
    assert v.baseline_version == "v41" and v.baseline_query_tokens == 300_000
    for value in (v.hit_ratio, v.baseline_hit_ratio):
        assert value is None or value == value  # never NaN


def test_a_new_version_with_no_traffic_yet_under_a_zero_floor_is_inconclusive_not_a_crash():
    """analysis.min_query_tokens may be 0: 0 hits over 0 queries raised a TypeError, on every evaluation."""
    v = analyze(OLD + [Member("new-0", "v42", ws(0, 0))], "m", "v42", min_query_tokens=0.0)
    assert v.verdict == INCONCLUSIVE and v.hit_ratio is None and "too little traffic" in v.reason


def test_replicas_are_pooled_token_weighted_and_admitted_counters_win():
    new = [Member("new-0", "v42", ws(50_000, 100_000, admitted=(10_000, 100_000))),  # lookups over-count
           Member("new-1", "v42", ws(20_000, 300_000))]
    v = analyze(OLD + new, "m", "v42")
    assert v.query_tokens == 400_000 and v.hit_ratio == pytest.approx(30_000 / 400_000)
    assert v.verdict == FAIL and v.replicas == 2 and v.baseline_replicas == 3


def test_the_baseline_can_be_named_and_a_missing_one_is_inconclusive():
    members = OLD + [Member("x", "v40", ws(10_000, 100_000)), Member("new-0", "v42", ws(85_000, 100_000))]
    assert analyze(members, "m", "v42", baseline="v40").verdict == PASS
    assert analyze(members, "m", "v42").baseline_version == "v41"  # the most traffic
    lone = analyze([Member("new-0", "v42", ws(85_000, 100_000))], "m", "v42")
    assert lone.verdict == INCONCLUSIVE and "no baseline" in lone.reason


@pytest.mark.parametrize("new, old", [
    pytest.param(ws(150_000, 100_000), ws(88_000, 100_000), id="new-version-hits-150-percent"),
    pytest.param(ws(85_000, 100_000), ws(150_000, 100_000), id="baseline-hits-150-percent"),
])
def test_hits_above_queries_are_no_pass_and_no_ratio_above_one(new, old):
    """It said "v42 hits 150.0%" and passed."""
    v = analyze([Member("old-0", "v41", old), Member("new-0", "v42", new)], "m", "v42")
    assert v.verdict == INCONCLUSIVE and "more hits than queries" in v.reason
    assert 0.0 <= v.hit_ratio <= 1.0 and 0.0 <= v.baseline_hit_ratio <= 1.0


# --- a model's rollouts over time (exporter/alerting/rollouts.py), driven with plain data ----------------
GATE = Settings(window=300.0, before=600.0, look_back=1800.0, min_query_tokens=20_000.0, drop_points=0.25)
BEFORE = [Member(f"old-{i}", "v41", ws(90_000, 100_000)) for i in range(3)]  # over the drop rule's baseline window


def replicas(by_window):
    """members_of for model "m": the replicas over each window asked for, and a record of the asks."""
    asked = []

    def members_of(model, window):
        asked.append((model, window))
        return by_window[window] if model == "m" else []
    members_of.asked = asked
    return members_of


def test_a_second_version_begins_a_rollout_with_the_model_s_ratio_before_it():
    new = [Member("new-0", "v42", ws(3_000, 100_000))]
    members_of = replicas({600.0: BEFORE + new, 300.0: OLD[:2] + new})
    kept, (judged,) = observe({}, 1060.0, {"m": {"v41": 0.0, "v42": 1000.0}}, members_of, {}, GATE)
    assert kept == {"m": Rollout("m", 1060.0, "v41", "v42", 0.9, 300_000.0)}  # the new replica's tokens left out
    assert judged.rollout == kept["m"] and judged.members == tuple(OLD[:2] + new)
    assert judged.verdict.verdict == FAIL and judged.verdict.baseline_hit_ratio == pytest.approx(0.88)  # the old ones now
    assert judged.condition.true and "3% on v42 against 88% on v41" in judged.condition.summary
    again, _ = observe(kept, 1065.0, {"m": {"v41": 0.0, "v42": 1000.0}}, members_of, {}, GATE)
    assert again["m"].began == 1060.0 and members_of.asked.count(("m", 600.0)) == 1  # the ratio before is read once


def test_a_rollout_seen_from_its_middle_reads_the_ratio_before_again_until_it_has_one():
    new = [Member("new-0", "v42", ws(3_000, 100_000))]
    quiet = replicas({600.0: [Member("old-0", "v41", ws(900, 1_000))] + new, 300.0: new})
    kept, (judged,) = observe({}, 100.0, {"m": {"v41": 0.0, "v42": 50.0}}, quiet, {}, GATE)
    assert kept["m"].baseline_ratio is None and judged.verdict.verdict == INCONCLUSIVE
    assert judged.condition.state == INCONCLUSIVE
    busy = replicas({600.0: BEFORE + new, 300.0: OLD + new})
    kept, _ = observe(kept, 105.0, {"m": {"v41": 0.0, "v42": 50.0}}, busy, {}, GATE)
    assert kept["m"].baseline_ratio == pytest.approx(0.9) and kept["m"].began == 100.0  # it began when first seen


def test_once_only_the_new_version_serves_it_is_judged_against_the_model_before_the_rollout():
    began = {"m": Rollout("m", 1000.0, "v41", "v42", 0.9, 300_000.0)}
    members_of = replicas({300.0: [Member(f"new-{i}", "v42", ws(3_000, 100_000)) for i in range(3)]})
    kept, (judged,) = observe(began, 1500.0, {"m": {"v42": 1000.0}}, members_of, {}, GATE)
    assert kept["m"].completed == 1500.0
    v = judged.verdict
    assert v.verdict == FAIL and v.baseline_version == "v41" and v.baseline_hit_ratio == 0.9 and v.baseline_replicas == 0
    # the gate's API answers the same, unless a baseline is named
    members = members_of("m", 300.0)
    assert rollouts.verdict(kept["m"], members, "m", "v42", None, GATE) == v
    named = rollouts.verdict(kept["m"], members, "m", "v42", "v41", GATE)
    assert named.verdict == INCONCLUSIVE and "no warm replica of m runs the baseline v41" in named.reason
    assert rollouts.verdict(began["m"], OLD + members, "m", "v42", None, GATE).baseline_hit_ratio == pytest.approx(0.88)


def test_a_completed_rollout_is_forgotten_after_its_look_back_unless_its_alert_is_still_active():
    done = {"m": Rollout("m", 1000.0, "v41", "v42", 0.9, 300_000.0, completed=1500.0)}
    starts = {"m": {"v42": 1000.0}}
    members_of = replicas({300.0: [Member("new-0", "v42", ws(77_000, 100_000))]})  # 13 points down: a pass...
    assert observe(done, 1500.0 + 1800.0, starts, members_of, {}, GATE)[0] == done  # the look-back's last second
    assert observe(done, 1500.0 + 1801.0, starts, members_of, {}, GATE) == ({}, [])
    assert observe(done, 1500.0 + 1801.0, starts, members_of, {("m", "v41"): FIRING}, GATE) == ({}, [])  # another version's
    kept, (judged,) = observe(done, 1500.0 + 1801.0, starts, members_of, {("m", "v42"): FIRING}, GATE)
    assert kept == done and judged.verdict.verdict == PASS
    # ...but an active alert ends only once the ratio is back within half the threshold, as the drop rule's does
    assert judged.condition.true
    back = replicas({300.0: [Member("new-0", "v42", ws(79_000, 100_000))]})  # 11 points down
    assert not observe(done, 3301.0, starts, back, {("m", "v42"): FIRING}, GATE)[1][0].condition.true
    assert not observe(done, 3000.0, starts, members_of, {("m", "v42"): INCONCLUSIVE}, GATE)[1][0].condition.true


def test_a_rollback_ends_the_rollout_and_a_model_gone_takes_its_rollout_along():
    rolling = {"m": Rollout("m", 1000.0, "v41", "v42", 0.9, 300_000.0)}
    back = replicas({300.0: OLD})
    assert observe(rolling, 2000.0, {"m": {"v41": 1900.0}}, back, {("m", "v42"): FIRING}, GATE) == ({}, [])
    assert observe(rolling, 2000.0, {}, back, {}, GATE) == ({}, [])


def test_one_version_and_no_rollout_is_the_steady_state_and_reads_nothing():
    def members_of(model, window):
        raise AssertionError("no replica needs reading")
    assert observe({}, 2000.0, {"m": {"v41": 0.0}, "n": {"v7": 5.0}}, members_of, {}, GATE) == ({}, [])


def test_the_gate_weighs_a_block_counting_target_in_tokens():
    """A 0.8.x target counts 16-token blocks: 2,000 of them are 32,000 tokens, over the
    gate's 20,000-token floor (it compared the block count and stayed inconclusive)."""
    def blocks(hits, queries):
        return ws(hits, queries)._replace(unit="blocks", block_size=16)
    old = [Member("old-0", "v41", blocks(1_800, 2_000))]
    v = analyze(old + [Member("new-0", "v42", blocks(60, 2_000))], "m", "v42", min_query_tokens=20_000)
    assert v.verdict == FAIL and (v.query_tokens, v.baseline_query_tokens) == (32_000, 32_000)
    assert (v.hit_ratio, v.baseline_hit_ratio) == (0.03, 0.9)
