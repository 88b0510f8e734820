"""How many replicas serve each model in each scope, as established, and the events its
changes are; and the ratios of each model's replicas side by side.

A scope is what owns the replicas (analysis.scope_labels: namespace and owner): staging's
Deployment of a model is not prod's, neither in its count nor as its peers. A count seen at
two evaluations in a row is established (a wobble of one poll is not an event); the first
count of a model, at a start, is no change. The engine drives it once an evaluation with who
serves what; no I/O, no clock.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ..alerting.analysis import Scope
from ..alerting.deploys import REPLICAS, DeployEvent
from ..series.hitratio import judged_counts, shown_ratio
from ..series.window import stats_between
from .targetview import TargetView


class ReplicaCounts:
    def __init__(self) -> None:
        # (model, scope) -> its replica count as established, and a new count seen once (count, when) waiting to be confirmed
        self.counts: dict[tuple[str, Scope], tuple[int | None, tuple[int, float] | None]] = {}

    def changes(self, now: float, serving: Mapping[tuple[str, Scope], Sequence[str]], views: Mapping[str, TargetView],
                window: float) -> list[DeployEvent]:
        """An event of every replica of a model in a scope whose count changed (`serving`:
        (model, scope) -> the targets serving it there now). The event keeps their judged
        ratio over `window` before, which bounds what the change can explain."""
        events = []
        for key in sorted(set(serving) | set(self.counts)):
            n = len(serving.get(key, ()))
            established, candidate = self.counts.get(key, (None, None))
            if n == 0:
                self.counts.pop(key, None)  # the model is gone: it starts afresh if it comes back
                continue
            if n == established:
                self.counts[key] = (established, None)
            elif candidate is None or candidate[0] != n:
                self.counts[key] = (established, (n, now))
            else:
                if established is not None:
                    events.append(_event(key, established, n, candidate[1], [views[name] for name in serving[key]], window))
                self.counts[key] = (n, None)
        return events


def fleet_ratios(views: Mapping[str, TargetView], scopes: Mapping[str, Scope], window: str | None
                 ) -> dict[tuple[str, Scope], list[tuple[str, float]]]:
    """(model, scope) -> [(target, judged hit ratio over `window`)] of the replicas `views`
    holds (`scopes`: target -> its scope): each one's peers, for the causes."""
    out: dict[tuple[str, Scope], list[tuple[str, float]]] = {}
    for target, view in views.items():
        for model, windows in view.stats.items():
            r = shown_ratio(windows.get(window)) if window else None
            if r is not None:
                out.setdefault((model, scopes[target]), []).append((target, r))
    return out


def _event(key: tuple[str, Scope], was: int, now_n: int, since: float, replicas: Sequence[TargetView], window: float) -> DeployEvent:
    model, scope = key
    hits = queries = 0.0
    for view in replicas:  # the replicas that served before the change, over `window` before it
        if view.since is None or view.since >= since:
            continue
        block = view.snapshot.block_size if view.snapshot else None
        h, q = judged_counts(stats_between(view.samples, model, since - window, since, 0.0, block))
        hits, queries = hits + h, queries + q
    ratio = min(1.0, hits / queries) if queries > 0 else None
    more = now_n > was
    where = " in " + ",".join(f"{k}={v}" for k, v in scope) if scope else ""
    why = (f"{now_n} replicas of {model}{where} (was {was})"
           + (": under routing without prefix or session affinity each replica sees 1/"
              f"{now_n} of a conversation's turns; prefix-hash or session-affinity routing keeps them together "
              "(`whatif --routing` quantifies it)" if more else ""))
    return DeployEvent(since, None, f"replicas:{was}->{now_n}", REPLICAS, why, model=model, replicas=(was, now_n),
                       ratio_before=ratio, scope=scope)
