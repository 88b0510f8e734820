"""The alert state machine, transition by transition, with an injected clock."""
import pytest

from exporter.rules import (FIRING, INACTIVE, INCONCLUSIVE, PENDING, RESOLVED, Alert, Condition, RuleSettings, step)

TRUE, FALSE, INCON = Condition("true", 0.1, "s", "d"), Condition("false"), Condition(INCONCLUSIVE, None, "s", "d")


def settings(for_=10.0, keep=0.0):
    return RuleSettings(enabled=True, severity="warning", for_=for_, keep_firing_for=keep)


def describe(alert, cond):
    from dataclasses import replace
    return replace(alert, labels=alert.labels or (("alertname", alert.alertname),), annotations=(("summary", cond.summary),))


def run(conds, for_=10.0, keep=0.0, step_s=5.0):
    """Feed conditions at t=0, 5, 10, ...; returns [(t, state, transition or None)]."""
    alert = Alert("A", "t", "m")
    out = []
    for i, cond in enumerate(conds):
        t = i * step_s
        alert, tr = step(alert, cond, t, settings(for_, keep), describe)
        out.append((t, alert.state, tr.state if tr else None))
    return out


@pytest.mark.parametrize("conds, for_, keep, expected", [
    pytest.param([FALSE, FALSE], 10, 0, [INACTIVE, INACTIVE], id="stays-inactive"),
    pytest.param([TRUE, TRUE, TRUE], 10, 0, [PENDING, PENDING, FIRING], id="pending-then-firing-after-for"),
    pytest.param([TRUE], 0, 0, [FIRING], id="for-zero-fires-at-once"),
    pytest.param([TRUE, FALSE], 10, 0, [PENDING, INACTIVE], id="pending-drops-silently"),
    pytest.param([TRUE, TRUE, TRUE, FALSE], 10, 0, [PENDING, PENDING, FIRING, INACTIVE], id="firing-resolves"),
    pytest.param([TRUE, TRUE, TRUE, FALSE, FALSE, FALSE], 10, 10, [PENDING, PENDING, FIRING, FIRING, FIRING, INACTIVE],
                 id="keep-firing-for-counts-from-the-first-false-evaluation"),
    pytest.param([TRUE, INCON, TRUE, TRUE], 10, 0, [PENDING, INACTIVE, PENDING, PENDING], id="inconclusive-ends-pending"),
    pytest.param([TRUE, TRUE, TRUE, FALSE, TRUE], 10, 10, [PENDING, PENDING, FIRING, FIRING, FIRING], id="keep-firing-bridges-a-gap"),
    pytest.param([INCON, INCON], 10, 0, [INCONCLUSIVE, INCONCLUSIVE], id="inconclusive-never-fires"),
    pytest.param([INCON, TRUE, TRUE, TRUE], 10, 0, [INCONCLUSIVE, PENDING, PENDING, FIRING], id="inconclusive-then-data"),
    pytest.param([TRUE, TRUE, TRUE, INCON, INCON], 10, 0, [PENDING, PENDING, FIRING, FIRING, FIRING], id="firing-holds-when-inconclusive"),
    pytest.param([INCON, FALSE], 10, 0, [INCONCLUSIVE, INACTIVE], id="inconclusive-to-inactive"),
])
def test_state_machine(conds, for_, keep, expected):
    assert [s for _, s, _ in run(conds, for_, keep)] == expected


def test_transitions_are_pending_firing_resolved_only():
    out = run([TRUE, TRUE, TRUE, FALSE])
    assert [tr for _, _, tr in out] == [PENDING, None, FIRING, RESOLVED]


def test_labels_stay_while_annotations_follow():
    alert = Alert("A", "t", "m")
    alert, _ = step(alert, Condition("true", 1.0, "first"), 0.0, settings(0), describe)
    alert, _ = step(alert, Condition("true", 2.0, "second"), 5.0, settings(0), describe)
    assert alert.labels == (("alertname", "A"),) and dict(alert.annotations)["summary"] == "second"
    assert alert.value == 2.0 and alert.fired_at == 0.0


def test_a_pending_alert_that_ends_says_so():
    out = run([TRUE, FALSE])
    assert [tr for _, _, tr in out] == [PENDING, INACTIVE]


def test_labels_follow_the_evidence_while_pending_and_freeze_when_firing():
    from dataclasses import replace

    def by_cause(alert, cond):
        return replace(alert, labels=(("cause", cond.summary),), annotations=(("summary", cond.summary),))

    s = settings(for_=10.0)
    alert = Alert("A", "t", "m")
    for t, cause in ((0.0, "prompt_prefix_change"), (5.0, "eviction_pressure"), (10.0, "eviction_pressure"), (15.0, "unknown")):
        alert, _ = step(alert, Condition("true", 1.0, cause), t, s, by_cause)
        if t == 5.0:
            assert dict(alert.labels)["cause"] == "eviction_pressure" and alert.state == PENDING
    assert alert.state == FIRING and dict(alert.labels)["cause"] == "eviction_pressure"
    assert dict(alert.annotations)["summary"] == "unknown"
