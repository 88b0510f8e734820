"""Versions of one model side by side: the verdict a rollout controller gets."""
import pytest

from exporter.analysis import FAIL, INCONCLUSIVE, PASS, Member, analyze
from exporter.window import WindowStats


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
