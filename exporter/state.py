"""The latest published results: written by the poller, read by the collector and HTTP.

Writers replace whole immutable views under a lock; readers take a consistent copy.
Nothing here computes anything.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from .config import Target
from .vllm_metrics import Snapshot
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
    samples_kept: int = 0


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

    def set_targets(self, views: list[TargetView]) -> None:
        """Install the target list (start-up and reload); views of kept targets survive."""
        with self._lock:
            old = self._targets
            self._targets = {v.target.name: (replace(old[v.target.name], target=v.target) if v.target.name in old else v) for v in views}

    def publish(self, view: TargetView) -> None:
        with self._lock:
            if view.target.name in self._targets:
                self._targets[view.target.name] = view

    def target(self, name: str) -> TargetView | None:
        with self._lock:
            return self._targets.get(name)

    def targets(self) -> list[TargetView]:
        with self._lock:
            return list(self._targets.values())

    def set_process(self, **changes) -> None:
        with self._lock:
            self._process = replace(self._process, **changes)

    def process(self) -> ProcessView:
        with self._lock:
            return self._process

    def put(self, key: str, value: Any) -> None:
        """Results of later stages (alerts, deploys, warm-up), published the same way."""
        with self._lock:
            self._extras[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._extras.get(key, default)

    def ready(self) -> bool:
        with self._lock:
            return all(v.polled for v in self._targets.values())
