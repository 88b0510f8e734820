"""The latest published results: the one store the collector, the HTTP APIs and the status page read.

Per target, the TargetView its last poll published (exporter/monitor/targetview.py); for the rest
of the process, one frozen `Published` record of typed fields, replaced whole. Both sit
under one lock, and `read()` hands out one consistent moment of both. Every field has a
name: a misspelled one is an AttributeError or TypeError, never a silently empty value.
Nothing here computes anything.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Mapping

from ..alerting.analysis import Verdict
from ..alerting.router import Delivered, Prediction
from ..alerting.rules_state import Alert
from ..discovery.targets import SourceState
from ..monitor.targetview import TargetView

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class QueueStats:
    """One Alertmanager queue as the notifier publishes it (exporter/notify/alertmanager.py)."""
    url: str
    pending: int
    notifications_ok: int
    notifications_failed: int
    alerts_sent: int
    dropped: int
    last_success: float | None
    last_error: str | None
    rejected: int = 0


@dataclass
class WarmupStatus:
    """The warm-up's runs as it publishes them (exporter/poll/warmup.py)."""
    runs: int = 0
    running: bool = False
    done: bool = False  # a warm-up finished since the last start or restart
    results: dict[str, int] = field(default_factory=dict)  # result -> requests, cumulative
    last_duration: float | None = None
    last_finished: float | None = None
    last_failed: int = 0


# the sidecar's periodic tasks, as the log and the status page name them
TASKS = {"read": "reading the Prometheus source", "evaluate": "evaluating the rules", "discover": "refreshing discovery"}


@dataclass(frozen=True)
class TaskStats:
    """One of the sidecar's periodic tasks as the poller publishes it (exporter/poll/taskwatch.py)."""
    interval: float  # seconds between the runs it is due
    runs: int = 0  # runs that ended
    missed: int = 0  # runs not started when due: the last one still ran
    last_seconds: float | None = None  # how long the last run that ended took
    behind: bool = False  # missing runs, and not a few runs in a row on time since


@dataclass(frozen=True)
class Counters:
    """Process-wide events, counted from start (prefixcache_*_total)."""

    collect_errors: int = 0  # renders of /metrics that failed
    evaluation_errors: int = 0  # rule evaluations that failed
    clock_steps_back: int = 0  # polls that saw the wall clock step back
    discovery_errors: int = 0  # discovery refreshes that failed on a bug (logged)


@dataclass(frozen=True)
class Deploys:
    """The deploy events as GET /api/v1/deploys answers them."""

    recent: tuple[dict, ...] = ()  # the newest 50, oldest first, as DeployEvent.to_json()
    counts: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: _EMPTY)  # target ('' for all) -> source -> events
    last: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # target ('' for all) -> newest deploy-like event

    def to_json(self) -> dict:
        return {"recent": list(self.recent), "counts": {t: dict(c) for t, c in self.counts.items()}, "last": dict(self.last)}


@dataclass(frozen=True)
class Published:
    """Everything but the per-target views, as the later stages last published it."""

    config_reload_success: bool = True
    config_reload_time: float | None = None
    counters: Counters = Counters()
    alerts: tuple[Alert, ...] | None = None  # None until the first evaluation
    verdicts: Mapping[tuple, Verdict] = field(default_factory=lambda: _EMPTY)  # (model, scope) -> the rollout gate's verdict at the last evaluation
    # router target -> model -> window -> (predicted, delivered)
    routing: Mapping[str, Mapping[str, Mapping[str, tuple[Prediction, Delivered]]]] = field(default_factory=lambda: _EMPTY)
    deploys: Deploys | None = None  # None until the engine first published
    discovery: tuple[SourceState, ...] = ()  # one per discovery source
    alertmanager: tuple[QueueStats, ...] = ()
    alertmanagers_discovered: int | None = None  # None while no alertmanager.urls is configured
    warmup: WarmupStatus | None = None  # None while warm-up is off
    skipped_polls: Mapping[str, int] = field(default_factory=lambda: _EMPTY)  # target -> polls skipped (its last still ran)
    tasks: Mapping[str, TaskStats] = field(default_factory=lambda: _EMPTY)  # read, evaluate, discover -> their runs
    # targets whose engine's own series are not exported (read from a Prometheus that holds them:
    # discovery.read_prometheus.reexport_engine_series)
    engine_series_withheld: frozenset[str] = frozenset()
    samples_source: str = ""  # read from a Prometheus: from where, at which resolution (the status page says it)


@dataclass(frozen=True)
class Reading:
    """One consistent moment of the state: what a render reads, once."""

    targets: tuple[TargetView, ...]
    published: Published
    generation: int

    def ready(self) -> bool:
        return all(v.polled for v in self.targets)


_COUNTERS = frozenset(f.name for f in fields(Counters))


class State:
    """Lock order: callers may hold their own locks (the poller's target and engine locks)
    when they call in; State calls nothing back while it holds its lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[str, TargetView] = {}
        self._published = Published()
        self._generation = 0  # bumped on every change: readers cache what they render from it

    @property
    def generation(self) -> int:
        return self._generation

    # --- per-target views ---------------------------------------------------------------
    def set_targets(self, views: list[TargetView]) -> None:
        """Install the target list (start-up and reload): each target's view as its Track
        holds it (a kept target's keeps its history and counts), the very same object."""
        with self._lock:
            self._targets = {v.target.name: v for v in views}
            self._generation += 1

    def publish(self, view: TargetView) -> None:
        """A poll's result. The installed Target wins over the one the poll started with,
        so a poll in flight during a reload never brings back the old labels or URL; a
        target no longer installed stays gone."""
        with self._lock:
            current = self._targets.get(view.target.name)
            if current is not None:
                self._targets[view.target.name] = view if view.target is current.target else replace(view, target=current.target)
            self._generation += 1

    def target(self, name: str) -> TargetView | None:
        with self._lock:
            return self._targets.get(name)

    def targets(self) -> list[TargetView]:
        with self._lock:
            return list(self._targets.values())

    def ready(self) -> bool:
        with self._lock:
            return all(v.polled for v in self._targets.values())

    # --- the rest -----------------------------------------------------------------------
    @property
    def published(self) -> Published:
        return self._published  # replaced whole under the lock, never changed: a plain read is one moment

    def update(self, **changes) -> None:
        """Replace named fields of `Published` (a name it lacks is a TypeError)."""
        with self._lock:
            self._published = replace(self._published, **changes)
            self._generation += 1

    def count(self, **increments: int) -> None:
        """Raise named `Counters` (a name it lacks is a TypeError)."""
        unknown = set(increments) - _COUNTERS
        if unknown:
            raise TypeError(f"no such counter: {', '.join(sorted(unknown))}")
        with self._lock:
            c = self._published.counters
            counters = replace(c, **{name: getattr(c, name) + n for name, n in increments.items()})
            self._published = replace(self._published, counters=counters)
            self._generation += 1

    def read(self) -> Reading:
        """The views and the rest as of one moment."""
        with self._lock:
            return Reading(tuple(self._targets.values()), self._published, self._generation)
