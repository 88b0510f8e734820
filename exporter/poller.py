"""Polling: one APScheduler job per target runs scrape -> parse -> windows -> publish.

A slow or dead target only ever holds its own job: jobs coalesce, never overlap, and
run on a pool sized for the fleet.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from . import scrape as scrape_results
from .config import Config, Target
from .scrape import Scraper
from .state import State, TargetView
from .vllm_metrics import parse
from .window import History, summarize

log = logging.getLogger(__name__)

NO_VLLM_METRICS = "no_vllm_metrics"
INTERNAL_ERROR = "internal_error"
RESULTS = scrape_results.RESULTS + (NO_VLLM_METRICS, INTERNAL_ERROR)
_FINE_SECONDS = 900.0  # windows up to 15m see every sample; older ones are thinned


class TargetPoller:
    def __init__(self, target: Target, config: Config, state: State, clock: Callable[[], float] = time.time,
                 on_sample: Callable[[str, float, object, History], None] | None = None):
        g = config.global_
        self.target = target
        self.config = config
        self.state = state
        self.clock = clock
        self.on_sample = on_sample
        self.scraper = Scraper(target.url, g.connect_timeout, g.read_timeout, g.body_size_limit)
        self.history = History(config.longest_window + g.poll_interval, fine_seconds=_FINE_SECONDS)
        self._warned: tuple[str, ...] = ()

    def poll(self) -> None:
        """One cycle; never raises (an APScheduler job that raises only logs noise)."""
        try:
            self._poll()
        except Exception:  # noqa: BLE001 - the loop must survive any bug in one cycle
            log.exception("target=%s poll failed", self.target.name)
            self._publish_failure(self.clock(), INTERNAL_ERROR, "internal error; see log", None)

    def _poll(self) -> None:
        now = self.clock()
        result = self.scraper.scrape()
        if result.result != scrape_results.SUCCESS:
            self._publish_failure(now, result.result, result.error, result.duration)
            return
        snapshot = parse(result.body or "")
        if snapshot.warnings != self._warned:
            for w in snapshot.warnings[:10]:
                log.warning("target=%s parse: %s", self.target.name, w)
            self._warned = snapshot.warnings
        if not snapshot.series:
            self._publish_failure(now, NO_VLLM_METRICS, "no vLLM prefix-cache series in the body", result.duration, snapshot)
            return
        self.history.append(now, snapshot)
        if self.on_sample is not None:
            self.on_sample(self.target.name, now, snapshot, self.history)
        view = self._view()
        if not view.up:
            log.info("target=%s is up", self.target.name)
        self.state.publish(replace(
            view, up=True, polled=True, last_result=result.result, last_error=None, last_scrape_time=now,
            last_success_time=now, scrape_duration=result.duration, scrapes=_count(view.scrapes, result.result),
            snapshot=snapshot, stats=self._stats(now, snapshot.block_size), samples_kept=len(self.history),
        ))

    def _stats(self, now: float, block_size: int | None):
        g = self.config.global_
        return summarize(self.history.samples(), now, g.windows, g.min_query_tokens, block_size)

    def _view(self) -> TargetView:
        return self.state.target(self.target.name) or TargetView(target=self.target)

    def _publish_failure(self, now: float, result: str, error: str | None, duration: float | None, snapshot=None) -> None:
        view = self._view()
        if view.up or not view.polled:
            log.warning("target=%s is down: %s", self.target.name, error)
        block_size = view.snapshot.block_size if view.snapshot else None
        self.state.publish(replace(
            view, up=False, polled=True, last_result=result, last_error=error, last_scrape_time=now,
            scrape_duration=duration, scrapes=_count(view.scrapes, result),
            snapshot=snapshot or view.snapshot, stats=self._stats(now, block_size), samples_kept=len(self.history),
        ))

    def close(self) -> None:
        self.scraper.close()


def _count(scrapes: tuple[tuple[str, int], ...], result: str) -> tuple[tuple[str, int], ...]:
    counts = dict(scrapes)
    counts[result] = counts.get(result, 0) + 1
    return tuple(sorted(counts.items()))


class Poller:
    """Owns the scheduler and one TargetPoller per target."""

    def __init__(self, config: Config, state: State, clock: Callable[[], float] = time.time,
                 on_sample=None, after_poll: Callable[[], None] | None = None):
        self.state = state
        self.clock = clock
        self.on_sample = on_sample
        self.after_poll = after_poll
        workers = max(4, min(64, len(config.targets)))
        self.scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(workers)},
                                             job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        self.pollers: dict[str, TargetPoller] = {}
        self.config = config
        self._install(config)

    def _install(self, config: Config) -> None:
        self.state.set_targets([TargetView(target=t) for t in config.targets])
        for name in list(self.pollers):
            self.pollers.pop(name).close()
            if self.scheduler.get_job(name):
                self.scheduler.remove_job(name)
        for t in config.targets:
            poller = TargetPoller(t, config, self.state, self.clock, self.on_sample)
            self.pollers[t.name] = poller
            self.scheduler.add_job(poller.poll, "interval", id=t.name, name=t.name,
                                   seconds=config.global_.poll_interval, jitter=config.global_.jitter or None,
                                   next_run_time=_now_datetime())
        if self.after_poll is not None and not self.scheduler.get_job("evaluate"):
            self.scheduler.add_job(self.after_poll, "interval", id="evaluate", name="evaluate",
                                   seconds=config.global_.poll_interval, next_run_time=_now_datetime())

    def reload(self, config: Config) -> None:
        """New targets or timings: histories of unchanged targets are kept."""
        kept = {name: p.history for name, p in self.pollers.items()
                if any(t.name == name and t == p.target for t in config.targets)
                and config.longest_window == self.config.longest_window}
        self.config = config
        self._install(config)
        for name, history in kept.items():
            self.pollers[name].history = history

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        for p in self.pollers.values():
            p.close()


def _now_datetime() -> datetime:
    return datetime.now(timezone.utc)
