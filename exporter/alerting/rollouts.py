"""A model's rollouts over time: when one began, what the model hit before it, when it
completed, and the verdict and alert condition of each evaluation. Pure: when each
version's first replica started, the replicas' windows and `now` in; the rollouts to
keep and what to judge out.

A rollout begins when a second version serves a model; the model's ratio before it (the
other versions' replicas over the drop rule's baseline window) is kept. While two versions
serve, the newest is judged against the one it replaces (exporter/alerting/analysis.py); once it is
the only one, against the model before the rollout, until the look-back after it completed
has passed and its alert is over. The old version alone again (a rollback) ends it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from . import analysis
from .analysis import Member, Verdict
from .rules import recovered
from .rules_state import FIRING, INCONCLUSIVE, PENDING, Condition


@dataclass(frozen=True)
class Rollout:
    """A model's rollout: from the moment a second version served it, until the new one
    has been judged against the model's ratio before it began."""

    model: str
    began: float
    old_version: str | None
    new_version: str
    baseline_ratio: float | None  # the model's replicas before the rollout, token-weighted
    baseline_tokens: float
    completed: float | None = None  # when the new version became the only one
    baseline_rates: tuple[float, float] | None = None  # (hit, query) tokens/s of the model before the rollout


@dataclass(frozen=True)
class Settings:
    window: float  # seconds of the gate's window (analysis.window)
    before: float  # seconds before a rollout the model's ratio is read over (the drop rule's baseline)
    look_back: float  # seconds a completed rollout is still judged (rules.event_lookback)
    min_query_tokens: float
    drop_points: float


@dataclass(frozen=True)
class Judged:
    """One model's rollout at one evaluation: what the gate says, and what its alert steps on."""

    rollout: Rollout
    verdict: Verdict
    members: tuple[Member, ...]  # the replicas over the gate's window
    condition: Condition


# (model, seconds) -> every replica serving the model, with its version and that window
MembersOf = Callable[[str, float], Sequence[Member]]


def newest_version(starts: Mapping[str, float]) -> str:
    """The version whose first replica started last is the one being rolled out."""
    return max(starts, key=lambda v: (starts[v], v))


def observe(rollouts: Mapping[str, Rollout], now: float, starts_of: Mapping[str, Mapping[str, float]], members_of: MembersOf,
            alert_states: Mapping[tuple[str, str], str], s: Settings) -> tuple[dict[str, Rollout], list[Judged]]:
    """One evaluation. `starts_of` is model -> version -> when its first replica started;
    `alert_states` is (model, version) -> state of each version alert the engine holds.
    -> (model -> its newest rollout, to keep; a Judged per model being judged)."""
    kept = {model: r for model, r in rollouts.items() if model in starts_of}
    judged = []
    for model, starts in sorted(starts_of.items()):
        rollout = kept.get(model)
        if len(starts) == 1 and rollout is None:
            continue  # the steady state: one version, nothing to judge
        newest = newest_version(starts)
        if len(starts) > 1:
            if rollout is None or rollout.new_version != newest or rollout.baseline_ratio is None:
                # (again while the old replicas' ratio was unknown: we started mid-rollout)
                rollout = kept[model] = begin(now, model, newest, members_of(model, s.before), rollout, s.min_query_tokens)
            members = members_of(model, s.window)
            verdict = analysis.analyze(members, model, newest, None, s.min_query_tokens, s.drop_points)
        elif rollout is not None and rollout.new_version == newest:
            if rollout.completed is None:
                rollout = kept[model] = replace(rollout, completed=now)
            if now - rollout.completed > s.look_back and (model, newest) not in alert_states:
                del kept[model]
                continue
            members = members_of(model, s.window)
            verdict = against_before(members, rollout, s)
        else:
            kept.pop(model, None)  # one version and no rollout of it to judge (or a rollback done)
            continue
        judged.append(Judged(rollout, verdict, tuple(members), condition(verdict, alert_states.get((model, newest)), s.drop_points)))
    return kept, judged


def begin(now: float, model: str, newest: str, before: Sequence[Member], known: Rollout | None,
          min_query_tokens: float) -> Rollout:
    """The model's ratio before the new version served it: the other replicas over the
    window `before` holds, kept for the end of the rollout."""
    others = [m for m in before if m.version != newest]
    ratio, tokens, _ = analysis.pool_ratio(others)
    if ratio is None or tokens < min_query_tokens:
        ratio = None
    old = analysis.busiest_version(others, other_than=newest)
    began = known.began if known is not None and known.new_version == newest else now
    return Rollout(model, began, old, newest, ratio, tokens, baseline_rates=analysis.pool_rates(others))


def against_before(members: Sequence[Member], rollout: Rollout, s: Settings) -> Verdict:
    """Once every replica runs the new version: against the model before its rollout."""
    missing = "" if rollout.baseline_ratio is not None else f"{rollout.model} had too little traffic before the rollout"
    return analysis.judge(members, rollout.model, rollout.new_version, rollout.old_version, rollout.baseline_ratio,
                          rollout.baseline_tokens, 0, missing, s.min_query_tokens, s.drop_points, rollout.baseline_rates)


def verdict(rollout: Rollout | None, members: Sequence[Member], model: str, version: str, baseline: str | None,
            s: Settings) -> Verdict:
    """The gate's answer (GET /api/v1/analysis): `version` against `baseline` (default: the
    other version with the most traffic, or once the rollout of `version` completed, the
    model before it)."""
    if baseline is None and rollout is not None and rollout.new_version == version and rollout.completed is not None:
        return against_before(members, rollout, s)
    return analysis.analyze(members, model, version, baseline, s.min_query_tokens, s.drop_points)


def condition(v: Verdict, alert_state: str | None, drop_points: float) -> Condition:
    """The version alert's condition: a failed verdict; an active alert holds until the
    ratio has recovered as the drop rule's does (the gate knows no `below` floor)."""
    if v.verdict == analysis.INCONCLUSIVE:
        return Condition(INCONCLUSIVE, None, f"Not enough evidence yet to judge {v.version} of {v.model}", v.reason)
    still = alert_state in (PENDING, FIRING) and not recovered(v.baseline_hit_ratio or 0.0, v.hit_ratio or 0.0, drop_points, 0.0)
    summary = (f"Prefix-cache hit rate of {v.model} is {v.hit_ratio:.0%} on {v.version} "
               f"against {v.baseline_hit_ratio:.0%} on {v.baseline_version}")
    return Condition("true" if v.verdict == analysis.FAIL or still else "false", v.hit_ratio, summary, v.reason + ".")
