"""Polling: one APScheduler job per target runs scrape -> parse -> windows -> publish.

A slow or dead target only ever holds its own job: jobs coalesce, never overlap, and
run on a pool sized for the fleet.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timezone
import threading
from typing import Callable, Sequence

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from . import scrape as scrape_results
from .config import Config, Target
from .scrape import Scraper
from .state import State, TargetView
from .vllm_metrics import parse
from .deploys import DeployEvent
from .engine import Engine

log = logging.getLogger(__name__)

NO_VLLM_METRICS = "no_vllm_metrics"
INTERNAL_ERROR = "internal_error"
RESULTS = scrape_results.RESULTS + (NO_VLLM_METRICS, INTERNAL_ERROR)


class TargetPoller:
    """One target's job: scrape, parse, hand the snapshot to the engine, publish."""

    def __init__(self, target: Target, config: Config, state: State, engine: Engine, lock: threading.Lock,
                 clock: Callable[[], float] = time.time, on_start: Callable[[str, str], None] | None = None):
        g = config.global_
        self.target = target
        self.state = state
        self.engine = engine
        self.lock = lock
        self.clock = clock
        self.scraper = Scraper(target.url, g.connect_timeout, g.read_timeout, g.body_size_limit)
        self.on_start = on_start
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
        with self.lock:
            events = self.engine.ingest(self.target.name, now, snapshot)
            track = self.engine.tracks[self.target.name]
            stats, kept = track.stats, len(track.history)
        for ev in events:
            log.info("target=%s event source=%s version=%s %s", self.target.name, ev.source, ev.version, ev.description)
        view = self._view()
        if not view.up:
            log.info("target=%s is up", self.target.name)
        if self.on_start is not None:
            if not view.up:
                self.on_start(self.target.name, "target up")
            elif any(ev.is_restart for ev in events):
                self.on_start(self.target.name, "restart")
        self.state.publish(replace(
            view, up=True, polled=True, last_result=result.result, last_error=None, last_scrape_time=now,
            last_success_time=now, scrape_duration=result.duration, scrapes=_count(view.scrapes, result.result),
            snapshot=snapshot, stats=stats, samples_kept=kept,
        ))

    def _view(self) -> TargetView:
        return self.state.target(self.target.name) or TargetView(target=self.target)

    def _publish_failure(self, now: float, result: str, error: str | None, duration: float | None, snapshot=None) -> None:
        view = self._view()
        if view.up or not view.polled:
            log.warning("target=%s is down: %s", self.target.name, error)
        with self.lock:
            self.engine.ingest_failure(self.target.name, now)
            track = self.engine.tracks[self.target.name]
            stats, kept = track.stats, len(track.history)
        self.state.publish(replace(
            view, up=False, polled=True, last_result=result, last_error=error, last_scrape_time=now,
            scrape_duration=duration, scrapes=_count(view.scrapes, result),
            snapshot=snapshot or view.snapshot, stats=stats, samples_kept=kept,
        ))

    def close(self) -> None:
        self.scraper.close()


def _count(scrapes: tuple[tuple[str, int], ...], result: str) -> tuple[tuple[str, int], ...]:
    counts = dict(scrapes)
    counts[result] = counts.get(result, 0) + 1
    return tuple(sorted(counts.items()))


class Poller:
    """Owns the scheduler, the engine (behind one lock) and one TargetPoller per target.
    The evaluation job runs the rules every poll interval and hands transitions on."""

    def __init__(self, config: Config, state: State, clock: Callable[[], float] = time.time,
                 after_evaluate: Callable[[list, list], None] | None = None, sources: Sequence[Callable[[float], list]] = (),
                 on_start: Callable[[str, str], None] | None = None):
        self.state = state
        self.on_start = on_start
        self.clock = clock
        self.after_evaluate = after_evaluate
        self.sources = list(sources)
        self.lock = threading.Lock()
        self.engine = Engine(config)
        workers = max(4, min(64, len(config.targets) + 1))
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
            poller = TargetPoller(t, config, self.state, self.engine, self.lock, self.clock, self.on_start)
            self.pollers[t.name] = poller
            self.scheduler.add_job(poller.poll, "interval", id=t.name, name=t.name,
                                   seconds=config.global_.poll_interval, jitter=config.global_.jitter or None,
                                   next_run_time=_now_datetime())
        if self.scheduler.get_job("evaluate"):
            self.scheduler.remove_job("evaluate")
        self.scheduler.add_job(self.evaluate, "interval", id="evaluate", name="evaluate",
                               seconds=config.global_.poll_interval, next_run_time=_now_datetime())

    def add_event(self, event: DeployEvent) -> None:
        with self.lock:
            self.engine.add_event(event)
        self._publish_engine()

    def evaluate(self) -> None:
        try:
            now = self.clock()
            for source in self.sources:
                for ev in source(now):
                    log.info("event source=%s target=%s version=%s %s", ev.source, ev.target, ev.version, ev.description)
                    with self.lock:
                        self.engine.add_event(ev)
            with self.lock:
                transitions = self.engine.evaluate(now)
                firing = self.engine.firing()
            for tr in transitions:
                a = tr.alert
                log.info("alert %s %s target=%s model=%s cause=%s", a.alertname, tr.state, a.target, a.model, dict(a.labels).get("cause"))
            self._publish_engine()
            if self.after_evaluate is not None:
                self.after_evaluate(transitions, firing)
        except Exception:  # noqa: BLE001 - the evaluation loop must survive a bug
            log.exception("rule evaluation failed")

    def _publish_engine(self) -> None:
        with self.lock:
            alerts = self.engine.active_alerts()
            events = list(self.engine.events)[-50:]
            counts = dict(self.engine.event_counts)
            last = self.engine.last_deploy()
        self.state.put("alerts", alerts)
        self.state.put("deploys", {"recent": [e.to_json() for e in events], "counts": counts, "last": last})

    def reload(self, config: Config) -> None:
        """New targets, timings or rules: histories of kept targets survive."""
        self.config = config
        with self.lock:
            self.engine.reconfigure(config)
        self._install(config)

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        for p in self.pollers.values():
            p.close()


def _now_datetime() -> datetime:
    return datetime.now(timezone.utc)
