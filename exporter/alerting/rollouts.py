"""A model's rollouts over time: when one began, what the model hit before it, when it
completed, and the verdict and alert condition of each evaluation. Pure: when each
version's first replica started, the replicas' windows and `now` in; the rollouts to
keep and what to judge out.

A rollout is one model's within one scope: the replicas that agree on the labels saying
what owns them (analysis.scope_labels: namespace and owner, the Deployment or Rollout).
Versions are never compared across scopes: staging's and prod's pod-template hashes of one
model are two Deployments, each with its own ratio, not a rollout; a target without those
labels (a sidecar's own pod) shares the empty scope with the others that lack them.

A rollout begins when a second version serves a model in a scope; the scope's ratio before
it (the other versions' replicas over the drop rule's baseline window) is kept. While two
versions serve, the newest is judged against the one it replaces (exporter/alerting/analysis.py);
once it is the only one, against the scope before the rollout, until the look-back after it
completed has passed and its alert is over. The old version alone again (a rollback) ends it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from . import analysis
from .analysis import Member, Scope, Verdict
from .rules import recovered
from .rules_state import FIRING, INCONCLUSIVE, PENDING, Condition


@dataclass(frozen=True)
class Rollout:
    """A model's rollout in one scope: from the moment a second version served it there,
    until the new one has been judged against the scope's ratio before it began."""

    model: str
    began: float
    old_version: str | None
    new_version: str
    baseline_ratio: float | None  # the model's replicas before the rollout, token-weighted
    baseline_tokens: float
    completed: float | None = None  # when the new version became the only one
    baseline_rates: tuple[float, float] | None = None  # (hit, query) tokens/s of the model before the rollout
    scope: Scope = ()  # what owns the replicas rolled (namespace, owner): the rollout of one Deployment


@dataclass(frozen=True)
class Settings:
    window: float  # seconds of the gate's window (analysis.window)
    before: float  # seconds before a rollout the model's ratio is read over (the drop rule's baseline)
    look_back: float  # seconds a completed rollout is still judged (rules.event_lookback)
    min_query_tokens: float
    drop_points: float
    scope_labels: tuple[str, ...] = ()  # analysis.scope_labels: what the gate may be asked to narrow by


@dataclass(frozen=True)
class Judged:
    """One model's rollout at one evaluation: what the gate says, and what its alert steps on."""

    rollout: Rollout
    verdict: Verdict
    members: tuple[Member, ...]  # the replicas over the gate's window
    condition: Condition


# (model, seconds) -> every replica serving the model, of every scope, with its version and that window
MembersOf = Callable[[str, float], Sequence[Member]]
Key = tuple[str, Scope]  # (model, scope): one rollout each


def scope_of(labels: Mapping[str, str], names: Sequence[str]) -> Scope:
    """The scope of a target with `labels`: those of `names` it has, in that order."""
    return tuple((n, labels[n]) for n in names if labels.get(n))


def scope_text(scope: Scope) -> str:
    """`namespace=prod,owner=vllm`, as a label selector reads; "" for the empty scope."""
    return ",".join(f"{k}={v}" for k, v in scope)


def newest_version(starts: Mapping[str, float]) -> str:
    """The version whose first replica started last is the one being rolled out."""
    return max(starts, key=lambda v: (starts[v], v))


def observe(rollouts: Mapping[Key, Rollout], now: float, starts_of: Mapping[Key, Mapping[str, float]], members_of: MembersOf,
            alert_states: Mapping[tuple[str, Scope, str], str], s: Settings) -> tuple[dict[Key, Rollout], list[Judged]]:
    """One evaluation. `starts_of` is (model, scope) -> version -> when its first replica
    there started; `alert_states` is (model, scope, version) -> state of each version alert
    the engine holds. -> ((model, scope) -> its newest rollout, to keep; a Judged per
    (model, scope) being judged)."""
    kept = {key: r for key, r in rollouts.items() if key in starts_of}
    read: dict[tuple[str, float], Sequence[Member]] = {}  # each model's replicas read once per window, whatever its scopes

    def of(key: Key, seconds: float) -> list[Member]:
        model, scope = key
        if (model, seconds) not in read:
            read[(model, seconds)] = members_of(model, seconds)
        return [m for m in read[(model, seconds)] if m.scope == scope]

    judged = []
    for key, starts in sorted(starts_of.items()):
        model, scope = key
        rollout = kept.get(key)
        if len(starts) == 1 and rollout is None:
            continue  # the steady state: one version, nothing to judge
        newest = newest_version(starts)
        if len(starts) > 1:
            if rollout is None or rollout.new_version != newest or rollout.baseline_ratio is None:
                # (again while the old replicas' ratio was unknown: we started mid-rollout)
                rollout = kept[key] = begin(now, key, newest, of(key, s.before), rollout, s.min_query_tokens)
            members = of(key, s.window)
            verdict = scoped(analysis.analyze(members, model, newest, None, s.min_query_tokens, s.drop_points), scope)
        elif rollout is not None and rollout.new_version == newest:
            if rollout.completed is None:
                rollout = kept[key] = replace(rollout, completed=now)
            if now - rollout.completed > s.look_back and (model, scope, newest) not in alert_states:
                del kept[key]
                continue
            members = of(key, s.window)
            verdict = against_before(members, rollout, s)
        else:
            kept.pop(key, None)  # one version and no rollout of it to judge (or a rollback done)
            continue
        judged.append(Judged(rollout, verdict, tuple(members),
                             condition(verdict, alert_states.get((model, scope, newest)), s.drop_points)))
    return kept, judged


def scoped(v: Verdict, scope: Scope) -> Verdict:
    """The verdict of the replicas of `scope`, saying so."""
    return replace(v, scope=scope, reason=f"{v.reason} (in {scope_text(scope)})") if scope else v


def begin(now: float, key: Key, newest: str, before: Sequence[Member], known: Rollout | None,
          min_query_tokens: float) -> Rollout:
    """The scope's ratio for the model before the new version served it: the other
    replicas of the scope over the window `before` holds, kept for the end of the rollout."""
    model, scope = key
    others = [m for m in before if m.version != newest]
    ratio, tokens, _ = analysis.pool_ratio(others)
    if ratio is None or tokens < min_query_tokens:
        ratio = None
    old = analysis.busiest_version(others, other_than=newest)
    began = known.began if known is not None and known.new_version == newest else now
    return Rollout(model, began, old, newest, ratio, tokens, baseline_rates=analysis.pool_rates(others), scope=scope)


def against_before(members: Sequence[Member], rollout: Rollout, s: Settings) -> Verdict:
    """Once every replica runs the new version: against the model before its rollout."""
    missing = "" if rollout.baseline_ratio is not None else f"{rollout.model} had too little traffic before the rollout"
    return scoped(analysis.judge(members, rollout.model, rollout.new_version, rollout.old_version, rollout.baseline_ratio,
                                 rollout.baseline_tokens, 0, missing, s.min_query_tokens, s.drop_points, rollout.baseline_rates),
                  rollout.scope)


def verdict(rollout: Rollout | None, members: Sequence[Member], model: str, version: str, baseline: str | None,
            s: Settings, scope: Scope = ()) -> Verdict:
    """`version` against `baseline` among `members`, the replicas of one scope (default: the
    other version there with the most traffic, or once the rollout of `version` completed,
    the scope before it; no other version there: inconclusive, "no baseline")."""
    if baseline is None and rollout is not None and rollout.new_version == version and rollout.completed is not None:
        return against_before(members, rollout, s)
    return scoped(analysis.analyze(members, model, version, baseline, s.min_query_tokens, s.drop_points), scope)


_WORST_FIRST = (analysis.FAIL, analysis.INCONCLUSIVE, analysis.PASS)


def gate(rollouts: Mapping[Key, Rollout], members: Sequence[Member], model: str, version: str, baseline: str | None,
         s: Settings, where: Mapping[str, str] | None = None) -> Verdict:
    """The gate's answer (GET /api/v1/analysis): `version` of `model` judged within the scope
    of the replicas that run it, against `baseline` there or by default the other version
    there with the most traffic, never a version of another scope. `where` (scope label ->
    value, as the gate was asked) keeps the scopes that match it. A version that runs in
    several scopes (one pod template applied to staging and prod) is judged in each on its
    own, and the worst verdict answers: a fail anywhere fails, a pass needs every one.
    `where` names other than scope labels are no question of scope and left out; a replica
    without a label `where` names (a sidecar's own target) is not told apart by it."""
    where = {k: v for k, v in (where or {}).items() if k in s.scope_labels}
    members = [m for m in members if all(dict(m.scope).get(k, v) == v for k, v in where.items())]
    scopes = sorted({m.scope for m in members if m.version == version})
    if not scopes:  # no replica runs it (there): inconclusive with an error, never a pass
        v = analysis.analyze(members, model, version, baseline, s.min_query_tokens, s.drop_points)
        return replace(v, reason=f"{v.reason} where {scope_text(tuple(sorted(where.items())))}") if where else v
    verdicts = [verdict(rollouts.get((model, scope)), [m for m in members if m.scope == scope], model, version, baseline, s, scope)
                for scope in scopes]
    if len(verdicts) == 1:
        return verdicts[0]
    worst = min(verdicts, key=lambda v: _WORST_FIRST.index(v.verdict))
    others = "; ".join(f"{v.verdict} in {scope_text(v.scope) or 'replicas without scope labels'}" for v in verdicts if v is not worst)
    return replace(worst, reason=f"{worst.reason}; {version} runs in {len(verdicts)} scopes, each judged on its own "
                                 f"(ask about one with its scope labels as parameters): {others}")


def condition(v: Verdict, alert_state: str | None, drop_points: float) -> Condition:
    """The version alert's condition: a failed verdict; an active alert holds until the
    ratio has recovered as the drop rule's does (the gate knows no `below` floor)."""
    if v.verdict == analysis.INCONCLUSIVE:
        return Condition(INCONCLUSIVE, None, f"Not enough evidence yet to judge {v.version} of {v.model}", v.reason)
    still = alert_state in (PENDING, FIRING) and not recovered(v.baseline_hit_ratio or 0.0, v.hit_ratio or 0.0, drop_points, 0.0)
    summary = (f"Prefix-cache hit rate of {v.model} is {v.hit_ratio:.0%} on {v.version} "
               f"against {v.baseline_hit_ratio:.0%} on {v.baseline_version}")
    return Condition("true" if v.verdict == analysis.FAIL or still else "false", v.hit_ratio, summary, v.reason + ".")
