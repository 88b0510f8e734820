"""How many replicas serve each model, as established, and the events its changes are.

A count seen at two evaluations in a row is established (a wobble of one poll is not an
event); the first count of a model, at a start, is no change. The engine drives it once an
evaluation with who serves what; no I/O, no clock.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ..alerting.deploys import REPLICAS, DeployEvent
from ..series.hitratio import judged_counts
from ..series.window import stats_between
from .targetview import TargetView


class ReplicaCounts:
    def __init__(self) -> None:
        # model -> its replica count as established, and a new count seen once (count, when) waiting to be confirmed
        self.counts: dict[str, tuple[int | None, tuple[int, float] | None]] = {}

    def changes(self, now: float, serving: Mapping[str, Sequence[str]], views: Mapping[str, TargetView],
                window: float) -> list[DeployEvent]:
        """An event of every replica of a model whose count changed (`serving`: model -> the
        targets serving it now). The event keeps the model's judged ratio over its replicas
        over `window` before, which bounds what the change can explain."""
        events = []
        for model in sorted(set(serving) | set(self.counts)):
            n = len(serving.get(model, ()))
            established, candidate = self.counts.get(model, (None, None))
            if n == 0:
                self.counts.pop(model, None)  # the model is gone: it starts afresh if it comes back
                continue
            if n == established:
                self.counts[model] = (established, None)
            elif candidate is None or candidate[0] != n:
                self.counts[model] = (established, (n, now))
            else:
                if established is not None:
                    events.append(_event(model, established, n, candidate[1], [views[name] for name in serving[model]], window))
                self.counts[model] = (n, None)
        return events


def _event(model: str, was: int, now_n: int, since: float, replicas: Sequence[TargetView], window: float) -> DeployEvent:
    hits = queries = 0.0
    for view in replicas:  # the replicas that served before the change, over `window` before it
        if view.since is None or view.since >= since:
            continue
        block = view.snapshot.block_size if view.snapshot else None
        h, q = judged_counts(stats_between(view.samples, model, since - window, since, 0.0, block))
        hits, queries = hits + h, queries + q
    ratio = min(1.0, hits / queries) if queries > 0 else None
    more = now_n > was
    why = (f"{now_n} replicas of {model} (was {was})"
           + (": under routing without prefix or session affinity each replica sees 1/"
              f"{now_n} of a conversation's turns; prefix-hash or session-affinity routing keeps them together "
              "(`whatif --routing` quantifies it)" if more else ""))
    return DeployEvent(since, None, f"replicas:{was}->{now_n}", REPLICAS, why, model=model, replicas=(was, now_n),
                       ratio_before=ratio)
