"""When a restarted engine's cache counts as warm again: by what its ratio does, not by a clock. Pure.

A restart (a first start, a wake from sleep mode) empties the prefix cache, and a low ratio
while it refills is no incident: that is the cold-start grace. A real vLLM refills a shared
system prompt's blocks within seconds, so the grace ends once the data says the cache is
warm: the ratio back at its level before the restart (or the fleet's for its model before
the pod started), or flat at a plateau, not climbing any more, with enough query tokens to
tell. From then on a drop is judged as any drop, and a plateau that stays low is a
regression behind the restart. `rules.cold_start_grace` stays the upper bound, for traffic
too thin to tell.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..series.hitratio import judged_ratio, judged_tokens
from ..series.samples import TargetSample
from ..series.window import stats_between
from .deploys import DeployEvent

WARM_SPAN = 60.0  # one look at the ratio: at least a minute of requests
# the ratio of the last span at most this far above the span before: no longer climbing (a
# cache refilling climbs by more than this a minute; Poisson noise over a minute of a few
# hundred requests moves it by well under it)
PLATEAU_POINTS = 0.03


@dataclass(frozen=True)
class WarmthSettings:
    span: float  # WARM_SPAN, or two polls where they are longer
    min_query_tokens: float  # each span, as the drop rule needs to judge a window
    drop_points: float  # back at the level before: within half the drop rule's threshold
    below: float
    baseline: float  # how far before the restart its level is read


def warmth_settings(drop, poll_interval: float) -> WarmthSettings:
    """From the drop rule's settings (rules.RuleSettings): the traffic it needs to judge a
    window, its threshold and baseline; a span of at least two polls."""
    return WarmthSettings(span=max(WARM_SPAN, 2 * poll_interval), min_query_tokens=drop.min_query_tokens,
                          drop_points=drop.drop_points, below=drop.below, baseline=drop.baseline)


def cold_restart(events: Sequence[DeployEvent], now: float, grace: float, warm_since: float | None) -> DeployEvent | None:
    """The restart whose emptied cache still explains a low ratio at `now`: the newest one
    within the grace, unless the cache was seen warm since (`warm_since`: the start of the
    span that showed it warm), or None."""
    newest = None
    for e in events:
        if e.is_restart and 0 <= now - e.t <= grace and (newest is None or e.t >= newest.t):
            newest = e
    if newest is None or is_warm_after(newest, warm_since):
        return None
    return newest


def is_warm_after(restart: DeployEvent, warm_since: float | None) -> bool:
    return warm_since_time(restart.t, warm_since)


def warm_since_time(t: float, warm_since: float | None) -> bool:
    """The cache was seen warm at `t` or later (a restart's, or a clear of the whole cache)."""
    return warm_since is not None and warm_since >= t


def warm_because(samples: Sequence[TargetSample], models: Sequence[str], restart_t: float, now: float,
                 levels: Mapping[str, float], s: WarmthSettings, block_size: int | None) -> str:
    """Why the cache of a target restarted at `restart_t` is warm at `now`, or "" while it
    is not (or the traffic is too thin to tell). Every model with enough traffic in the
    last span must be warm, and one at least. `levels`: model -> the fleet's ratio before
    the pod started, where known; the target's own ratio before the restart comes first."""
    if now - s.span < restart_t:
        return ""
    whys = []
    for model in models:
        recent = stats_between(samples, model, now - s.span, now, 0.0, block_size)
        ratio = judged_ratio(recent)
        if ratio is None or judged_tokens(recent, block_size) < s.min_query_tokens:
            continue
        why = _back_at_level(samples, model, restart_t, ratio, levels.get(model), s, block_size) or \
            _plateau(samples, model, restart_t, now, ratio, s, block_size)
        if not why:
            return ""
        whys.append(f"{model}: {why}" if len(models) > 1 else why)
    return "; ".join(whys)


def _back_at_level(samples: Sequence[TargetSample], model: str, restart_t: float, ratio: float,
                   fleet_level: float | None, s: WarmthSettings, block_size: int | None) -> str:
    before = stats_between(samples, model, restart_t - s.baseline, restart_t, 0.0, block_size)
    level, whose = judged_ratio(before), "before the restart"
    if level is None or judged_tokens(before, block_size) < s.min_query_tokens:
        level, whose = fleet_level, "of the fleet before the pod started"
    if level is None:
        return ""
    if level - ratio < s.drop_points / 2 and not ratio < s.below <= level:
        return f"the hit ratio is back at {ratio:.0%}, against {level:.0%} {whose}"
    return ""


def _plateau(samples: Sequence[TargetSample], model: str, restart_t: float, now: float, ratio: float,
             s: WarmthSettings, block_size: int | None) -> str:
    if now - 2 * s.span < restart_t:
        return ""
    earlier = stats_between(samples, model, now - 2 * s.span, now - s.span, 0.0, block_size)
    before = judged_ratio(earlier)
    if before is None or judged_tokens(earlier, block_size) < s.min_query_tokens or ratio - before >= PLATEAU_POINTS:
        return ""
    return f"the hit ratio stopped climbing at {ratio:.0%} ({before:.0%} over the {s.span:.0f}s before)"
