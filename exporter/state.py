"""The latest published results: written by the poller, read by the collector and HTTP.

Writers replace whole immutable views under a lock; readers take a consistent copy.
Nothing here computes anything.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from .config import Target
from .snapshot import Snapshot
from .history import Samples
from .window import WindowStats


@dataclass(frozen=True)
class TargetView:
    target: Target
    up: bool = False
    polled: bool = False
    last_result: str | None = None
    last_error: str | None = None
    last_scrape_time: float | None = None
    last_success_time: float | None = None
    scrape_duration: float | None = None
    scrapes: tuple[tuple[str, int], ...] = ()  # result -> count, cumulative
    snapshot: Snapshot | None = None
    stats: dict[str, dict[str, WindowStats]] = field(default_factory=dict)  # model -> window -> stats
    samples: Samples | None = None  # what `stats` came from (immutable): the status page draws the last hour from it
    samples_kept: int = 0
    rejected: tuple[tuple[str, int], ...] = ()  # reason -> samples the parser refused, cumulative


@dataclass(frozen=True)
class ProcessView:
    config_reload_success: bool = True
    config_reload_time: float | None = None


class State:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[str, TargetView] = {}
        self._process = ProcessView()
        self._extras: dict[str, Any] = {}
        self._counters: dict[str, int] = {}
        self._generation = 0  # bumped on every change: readers cache what they render from it

    def set_targets(self, views: list[TargetView]) -> None:
        """Install the target list (start-up and reload); views of kept targets survive."""
        with self._lock:
            old = self._targets
            self._targets = {v.target.name: (replace(old[v.target.name], target=v.target) if v.target.name in old else v) for v in views}
            self._generation += 1

    @property
    def generation(self) -> int:
        return self._generation

    def count(self, name: str, n: int = 1) -> None:
        """Process-wide event counters (collect errors, clock steps, ...)."""
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n
            self._generation += 1

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def publish(self, view: TargetView) -> None:
        """A poll's result. The installed Target wins over the one the poll started with,
        so a poll in flight during a reload never brings back the old labels or URL."""
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

    def set_process(self, **changes) -> None:
        with self._lock:
            self._process = replace(self._process, **changes)
            self._generation += 1

    def process(self) -> ProcessView:
        with self._lock:
            return self._process

    def put(self, key: str, value: Any) -> None:
        """Results of later stages (alerts, deploys, warm-up), published the same way."""
        with self._lock:
            self._extras[key] = value
            self._generation += 1

    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._extras.get(key, default)

    def ready(self) -> bool:
        with self._lock:
            return all(v.polled for v in self._targets.values())
