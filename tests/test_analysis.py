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
M = ("m", ())  # model "m" of replicas without scope labels (a sidecar's, static targets)
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
    kept, (judged,) = observe({}, 1060.0, {M: {"v41": 0.0, "v42": 1000.0}}, members_of, {}, GATE)
    assert kept == {M: Rollout("m", 1060.0, "v41", "v42", 0.9, 300_000.0)}  # the new replica's tokens left out
    assert judged.rollout == kept[M] and judged.members == tuple(OLD[:2] + new)
    assert judged.verdict.verdict == FAIL and judged.verdict.baseline_hit_ratio == pytest.approx(0.88)  # the old ones now
    assert judged.condition.true and "3% on v42 against 88% on v41" in judged.condition.summary
    again, _ = observe(kept, 1065.0, {M: {"v41": 0.0, "v42": 1000.0}}, members_of, {}, GATE)
    assert again[M].began == 1060.0 and members_of.asked.count(("m", 600.0)) == 1  # the ratio before is read once


def test_a_rollout_seen_from_its_middle_reads_the_ratio_before_again_until_it_has_one():
    new = [Member("new-0", "v42", ws(3_000, 100_000))]
    quiet = replicas({600.0: [Member("old-0", "v41", ws(900, 1_000))] + new, 300.0: new})
    kept, (judged,) = observe({}, 100.0, {M: {"v41": 0.0, "v42": 50.0}}, quiet, {}, GATE)
    assert kept[M].baseline_ratio is None and judged.verdict.verdict == INCONCLUSIVE
    assert judged.condition.state == INCONCLUSIVE
    busy = replicas({600.0: BEFORE + new, 300.0: OLD + new})
    kept, _ = observe(kept, 105.0, {M: {"v41": 0.0, "v42": 50.0}}, busy, {}, GATE)
    assert kept[M].baseline_ratio == pytest.approx(0.9) and kept[M].began == 100.0  # it began when first seen


def test_once_only_the_new_version_serves_it_is_judged_against_the_model_before_the_rollout():
    began = {M: Rollout("m", 1000.0, "v41", "v42", 0.9, 300_000.0)}
    members_of = replicas({300.0: [Member(f"new-{i}", "v42", ws(3_000, 100_000)) for i in range(3)]})
    kept, (judged,) = observe(began, 1500.0, {M: {"v42": 1000.0}}, members_of, {}, GATE)
    assert kept[M].completed == 1500.0
    v = judged.verdict
    assert v.verdict == FAIL and v.baseline_version == "v41" and v.baseline_hit_ratio == 0.9 and v.baseline_replicas == 0
    # the gate's API answers the same, unless a baseline is named
    members = members_of("m", 300.0)
    assert rollouts.verdict(kept[M], members, "m", "v42", None, GATE) == v
    named = rollouts.verdict(kept[M], members, "m", "v42", "v41", GATE)
    assert named.verdict == INCONCLUSIVE and "no warm replica of m runs the baseline v41" in named.reason
    assert rollouts.verdict(began[M], OLD + members, "m", "v42", None, GATE).baseline_hit_ratio == pytest.approx(0.88)


def test_a_completed_rollout_is_forgotten_after_its_look_back_unless_its_alert_is_still_active():
    done = {M: Rollout("m", 1000.0, "v41", "v42", 0.9, 300_000.0, completed=1500.0)}
    starts = {M: {"v42": 1000.0}}
    members_of = replicas({300.0: [Member("new-0", "v42", ws(77_000, 100_000))]})  # 13 points down: a pass...
    assert observe(done, 1500.0 + 1800.0, starts, members_of, {}, GATE)[0] == done  # the look-back's last second
    assert observe(done, 1500.0 + 1801.0, starts, members_of, {}, GATE) == ({}, [])
    assert observe(done, 1500.0 + 1801.0, starts, members_of, {("m", (), "v41"): FIRING}, GATE) == ({}, [])  # another version's
    kept, (judged,) = observe(done, 1500.0 + 1801.0, starts, members_of, {("m", (), "v42"): FIRING}, GATE)
    assert kept == done and judged.verdict.verdict == PASS
    # ...but an active alert ends only once the ratio is back within half the threshold, as the drop rule's does
    assert judged.condition.true
    back = replicas({300.0: [Member("new-0", "v42", ws(79_000, 100_000))]})  # 11 points down
    assert not observe(done, 3301.0, starts, back, {("m", (), "v42"): FIRING}, GATE)[1][0].condition.true
    assert not observe(done, 3000.0, starts, members_of, {("m", (), "v42"): INCONCLUSIVE}, GATE)[1][0].condition.true


def test_a_rollback_ends_the_rollout_and_a_model_gone_takes_its_rollout_along():
    rolling = {M: Rollout("m", 1000.0, "v41", "v42", 0.9, 300_000.0)}
    back = replicas({300.0: OLD})
    assert observe(rolling, 2000.0, {M: {"v41": 1900.0}}, back, {("m", (), "v42"): FIRING}, GATE) == ({}, [])
    assert observe(rolling, 2000.0, {}, back, {}, GATE) == ({}, [])


def test_one_version_and_no_rollout_is_the_steady_state_and_reads_nothing():
    def members_of(model, window):
        raise AssertionError("no replica needs reading")
    assert observe({}, 2000.0, {M: {"v41": 0.0}, ("n", ()): {"v7": 5.0}}, members_of, {}, GATE) == ({}, [])


def test_the_gate_weighs_a_block_counting_target_in_tokens():
    """A 0.8.x target counts 16-token blocks: 2,000 of them are 32,000 tokens, over the
    gate's 20,000-token floor (it compared the block count and stayed inconclusive)."""
    def blocks(hits, queries):
        return ws(hits, queries)._replace(unit="blocks", block_size=16)
    old = [Member("old-0", "v41", blocks(1_800, 2_000))]
    v = analyze(old + [Member("new-0", "v42", blocks(60, 2_000))], "m", "v42", min_query_tokens=20_000)
    assert v.verdict == FAIL and (v.query_tokens, v.baseline_query_tokens) == (32_000, 32_000)
    assert (v.hit_ratio, v.baseline_hit_ratio) == (0.03, 0.9)


# --- scopes: versions are compared within what owns the replicas, never across namespaces --------------
PROD = (("namespace", "prod"), ("owner", "vllm"))
STAGING = (("namespace", "staging"), ("owner", "vllm"))
SCOPED = Settings(window=300.0, before=600.0, look_back=1800.0, min_query_tokens=20_000.0, drop_points=0.25,
                  scope_labels=("namespace", "owner"))
# issue 54: staging's pod-template hash against prod's, "49% on q4pbsphzf against 89% on ngq2cd9wf"
TWO_NAMESPACES = ([Member(f"vllm-ngq2cd9wf-{i}", "ngq2cd9wf", ws(89_000, 100_000), scope=PROD) for i in range(3)]
                  + [Member("vllm-q4pbsphzf-0", "q4pbsphzf", ws(49_000, 100_000), scope=STAGING)])


def test_the_scope_of_a_target_is_its_scope_labels_it_has_in_their_order():
    assert rollouts.scope_of({"owner": "vllm", "namespace": "prod", "pod": "p"}, ("namespace", "owner")) == PROD
    assert rollouts.scope_of({"namespace": "prod", "owner": ""}, ("namespace", "owner")) == (("namespace", "prod"),)
    assert rollouts.scope_of({"pod": "p"}, ("namespace", "owner")) == ()  # a sidecar's own target: the empty scope
    assert rollouts.scope_text(PROD) == "namespace=prod,owner=vllm" and rollouts.scope_text(()) == ""


def test_staging_and_prod_of_one_model_are_no_rollout():
    """One version in each namespace: two Deployments in their steady state, nothing to judge
    (it was one model with two versions: staging's 49% judged against prod's 89%, critical)."""
    def members_of(model, window):
        raise AssertionError("nothing to judge: no replica needs reading")
    starts = {("m", PROD): {"ngq2cd9wf": 0.0}, ("m", STAGING): {"q4pbsphzf": 5_000.0}}
    assert observe({}, 6_000.0, starts, members_of, {}, SCOPED) == ({}, [])


def test_the_gate_without_a_baseline_says_no_baseline_when_no_other_version_runs_in_the_scope():
    v = rollouts.gate({}, TWO_NAMESPACES, "m", "q4pbsphzf", None, SCOPED)
    assert v.verdict == INCONCLUSIVE and v.error is None  # evidence may come: another version in staging
    assert "no baseline" in v.reason and "namespace=staging,owner=vllm" in v.reason and v.scope == STAGING
    assert v.hit_ratio == pytest.approx(0.49) and v.baseline_hit_ratio is None
    assert rollouts.gate({}, TWO_NAMESPACES, "m", "ngq2cd9wf", None, SCOPED).verdict == INCONCLUSIVE
    # named, prod's version is no baseline of staging's either: it runs in no replica of that scope
    named = rollouts.gate({}, TWO_NAMESPACES, "m", "q4pbsphzf", "ngq2cd9wf", SCOPED)
    assert named.verdict == INCONCLUSIVE and "no warm replica of m runs the baseline ngq2cd9wf" in named.reason
    assert analyze(TWO_NAMESPACES, "m", "q4pbsphzf").verdict == FAIL  # what comparing across namespaces said


def test_a_rollout_within_one_namespace_is_still_judged_and_fails():
    new = [Member("vllm-x7k2m9pqr-0", "x7k2m9pqr", ws(30_000, 100_000), scope=PROD)]
    members_of = replicas({600.0: TWO_NAMESPACES, 300.0: TWO_NAMESPACES + new})
    starts = {("m", PROD): {"ngq2cd9wf": 0.0, "x7k2m9pqr": 5_000.0}, ("m", STAGING): {"q4pbsphzf": 4_000.0}}
    kept, (judged,) = observe({}, 6_000.0, starts, members_of, {}, SCOPED)
    assert set(kept) == {("m", PROD)} and kept[("m", PROD)].scope == PROD
    assert kept[("m", PROD)].baseline_ratio == pytest.approx(0.89)  # prod's replicas before, staging's left out
    v = judged.verdict
    assert v.verdict == FAIL and (v.version, v.baseline_version, v.scope) == ("x7k2m9pqr", "ngq2cd9wf", PROD)
    assert v.baseline_hit_ratio == pytest.approx(0.89) and v.baseline_replicas == 3 and judged.condition.true
    assert {m.scope for m in judged.members} == {PROD}
    assert members_of.asked.count(("m", 300.0)) == 1  # each model's replicas read once per window, whatever its scopes
    gate = rollouts.gate(kept, TWO_NAMESPACES + new, "m", "x7k2m9pqr", None, SCOPED)
    assert gate.verdict == FAIL and gate.scope == PROD


def test_one_version_in_two_scopes_is_judged_in_each_and_the_worst_answers_unless_a_scope_is_named():
    """One pod template applied to staging and prod has one hash in both: each namespace's
    rollout of it is judged on its own; asked without a scope, a fail anywhere fails and
    a pass needs every scope to pass."""
    members = [Member("s-old", "v41", ws(60_000, 100_000), scope=STAGING), Member("s-new", "v42", ws(58_000, 100_000), scope=STAGING),
               Member("p-old", "v41", ws(89_000, 100_000), scope=PROD), Member("p-new", "v42", ws(20_000, 100_000), scope=PROD)]
    worst = rollouts.gate({}, members, "m", "v42", None, SCOPED)
    assert worst.verdict == FAIL and worst.scope == PROD and "pass in namespace=staging,owner=vllm" in worst.reason
    staging = rollouts.gate({}, members, "m", "v42", None, SCOPED, {"namespace": "staging"})
    assert staging.verdict == PASS and staging.baseline_hit_ratio == pytest.approx(0.6)  # 2 points: never prod's 89%
    assert rollouts.gate({}, members, "m", "v42", None, SCOPED, {"namespace": "prod", "owner": "vllm"}).verdict == FAIL
    assert rollouts.gate({}, members, "m", "v42", None, SCOPED, {"pod": "s-new"}).verdict == FAIL  # no scope label: no narrowing
    nowhere = rollouts.gate({}, members, "m", "v42", None, SCOPED, {"namespace": "dev"})
    assert nowhere.verdict == INCONCLUSIVE and nowhere.error and "where namespace=dev" in nowhere.reason
    # a pass needs every scope's: prod without a baseline of its own is no pass
    lone = [m for m in members if m.target != "p-old"]
    assert rollouts.gate({}, lone, "m", "v42", None, SCOPED).verdict == INCONCLUSIVE


def test_replicas_without_scope_labels_are_compared_as_before():
    """A sidecar's own target, static targets: the empty scope, one model's versions side by
    side as they always were; a scope asked for does not tell them apart."""
    members = OLD + [Member("new-0", "v42", ws(3_000, 100_000))]
    assert rollouts.gate({}, members, "m", "v42", None, SCOPED).verdict == FAIL
    assert rollouts.gate({}, members, "m", "v42", None, SCOPED, {"namespace": "llm"}).verdict == FAIL
