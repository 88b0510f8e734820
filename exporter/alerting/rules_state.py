"""An alert's life: the condition a rule finds, the alert, its transitions, and `step()`,
the state machine with Prometheus's semantics. Pure.

`step()` moves an alert through inactive -> pending -> firing -> resolved with `for` and
`keep_firing_for` as Prometheus has them. A rule may also say `inconclusive` (too few
tokens to judge): exported, never firing. A firing alert holds on `inconclusive` (no new
evidence either way), but not for good: Prometheus resolves an alert whose expression has
no result, and a pod whose traffic moved away would otherwise page for ever. Once its
condition has not been seen true for `inconclusive_bound` (the rule's look-back: by then
nothing that made it fire is left in what the rule reads), it resolves, saying there was
no traffic to judge.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

INACTIVE, PENDING, FIRING, INCONCLUSIVE = "inactive", "pending", "firing", "inconclusive"
RESOLVED = "resolved"  # a transition, after which the alert is inactive
NO_TRAFFIC = "resolved_because"  # the annotation of an alert resolved for want of traffic, saying so


@dataclass(frozen=True)
class Condition:
    state: str  # "true" | "false" | INCONCLUSIVE
    value: float | None = None
    summary: str = ""
    description: str = ""
    cause: tuple[str, str] | None = None  # classified later when None
    anchor: float | None = None  # the event this condition compared against
    baseline: float | None = None  # the ratio before that event

    @property
    def true(self) -> bool:
        return self.state == "true"


FALSE = Condition("false")


# --- the state machine ----------------------------------------------------------------------
@dataclass(frozen=True)
class Alert:
    alertname: str
    target: str
    model: str
    state: str = INACTIVE
    active_at: float | None = None
    fired_at: float | None = None
    last_true: float | None = None
    false_since: float | None = None  # first false evaluation while firing: keep_firing_for counts from it
    resolved_at: float | None = None
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    value: float | None = None
    anchor: float | None = None  # the event an active alert measures against
    baseline: float | None = None  # the ratio before `anchor`, for as long as the alert is active
    version: str = ""  # a fleet alert about one version of a model (target is then "")
    scope: tuple[tuple[str, str], ...] = ()  # and the scope its replicas are in ((label, value) of analysis.scope_labels)

    @property
    def key(self) -> tuple[str, str, str, str, tuple[tuple[str, str], ...]]:
        return (self.alertname, self.target, self.model, self.version, self.scope)


@dataclass(frozen=True)
class Transition:
    t: float
    alert: Alert
    state: str  # pending | firing | resolved; inactive: a pending alert ended without firing

    def to_json(self) -> dict:
        return {"t": self.t, "alertname": self.alert.alertname, "state": self.state,
                "labels": dict(self.alert.labels), "annotations": dict(self.alert.annotations)}


def step(alert: Alert, cond: Condition, now: float, s,
         describe: Callable[[Alert, Condition], Alert], *, inconclusive_bound: float) -> tuple[Alert, Transition | None]:
    """One evaluation, with Prometheus's semantics: pending needs the condition true at
    every evaluation; labels follow the evidence while pending and are fixed from the
    moment the alert fires; `keep_firing_for` counts from the first false evaluation.
    `describe` fills labels and annotations from the evidence of this evaluation; `s`
    holds the rule's `for_` and `keep_firing_for` (its RuleSettings). A firing alert
    whose condition is inconclusive resolves once it was last true `inconclusive_bound`
    seconds ago (or `keep_firing_for`, when longer)."""
    state = alert.state
    if cond.true:
        if state in (INACTIVE, INCONCLUSIVE):
            new = describe(replace(alert, state=PENDING, active_at=now, last_true=now, false_since=None,
                                   resolved_at=None, value=cond.value), cond)
            if s.for_ <= 0:
                new = replace(new, state=FIRING, fired_at=now)
                return new, Transition(now, new, FIRING)
            return new, Transition(now, new, PENDING)
        if state == PENDING:
            new = describe(replace(alert, last_true=now, value=cond.value), cond)
            if now - alert.active_at >= s.for_:
                new = replace(new, state=FIRING, fired_at=now)
                return new, Transition(now, new, FIRING)
            return new, None
        # firing: labels (the cause) stay as they were when it began; annotations follow
        described = describe(alert, cond)
        return replace(alert, last_true=now, false_since=None, value=cond.value, annotations=described.annotations), None
    if state == FIRING:
        if cond.state == INCONCLUSIVE:
            last_true = alert.last_true if alert.last_true is not None else alert.fired_at
            if last_true is None or now - last_true < max(inconclusive_bound, s.keep_firing_for):
                return alert, None  # no new information: a firing alert holds, for a while
            why = (f"no traffic to judge: the condition was last true {now - last_true:.0f}s ago and has been "
                   f"inconclusive since ({cond.summary or 'too few query tokens'})")
            new = replace(alert, state=INACTIVE, resolved_at=now,
                          annotations=tuple(sorted({**dict(alert.annotations), NO_TRAFFIC: why}.items())))
            return new, Transition(now, new, RESOLVED)
        false_since = alert.false_since if alert.false_since is not None else now
        if now - false_since < s.keep_firing_for:
            return replace(alert, false_since=false_since), None
        new = replace(alert, state=INACTIVE, resolved_at=now)
        return new, Transition(now, new, RESOLVED)
    if state == PENDING:
        # not true at this evaluation (false, or too little traffic to tell): pending ends
        new = replace(alert, state=INACTIVE, active_at=None)
        return new, Transition(now, new, INACTIVE)
    if cond.state == INCONCLUSIVE:
        return describe(replace(alert, state=INCONCLUSIVE, value=None), cond), None
    if state == INCONCLUSIVE:
        return replace(alert, state=INACTIVE, active_at=None), None
    return alert, None
