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
from .sdsources import Discovery
from .sdtargets import polled
from .scrape import Scraper
from .state import State, TargetView
from .vllm_metrics import parse
from .deploys import DeployEvent
from .engine import Engine
from .prombaseline import FleetBaselineReader
from .rules import INACTIVE

log = logging.getLogger(__name__)

NO_VLLM_METRICS = "no_vllm_metrics"
LIMIT_EXCEEDED = "limit_exceeded"
INTERNAL_ERROR = "internal_error"
MAX_BASELINE_MODELS = 10
RESULTS = scrape_results.RESULTS + (NO_VLLM_METRICS, LIMIT_EXCEEDED, INTERNAL_ERROR)


class TargetPoller:
    """One target's job: scrape, parse, hand the snapshot to the engine, publish.

    Work that grows with the target's size (parse, history, windows) runs under this
    target's own lock; the shared lock only covers adding the events it found."""

    def __init__(self, target: Target, config: Config, state: State, engine: Engine, lock: threading.Lock,
                 clock: Callable[[], float] = time.time, on_start: Callable[[str, str], None] | None = None):
        g = config.global_
        self.target = target
        self.state = state
        self.engine = engine
        self.lock = lock
        self.track_lock = threading.Lock()
        self.clock = clock
        self.scraper = Scraper(target.url, g.connect_timeout, g.scrape_timeout, g.body_size_limit, idle=g.read_timeout)
        self.model_limit = g.model_limit
        self.series_limit = g.series_limit
        self.on_start = on_start
        self.baseline_reader = FleetBaselineReader(config.fleet_baseline) if config.fleet_baseline.enabled else None
        self._warned: tuple[str, ...] = ()
        self._last_now: float | None = None

    def poll(self) -> None:
        """One cycle; never raises (an APScheduler job that raises only logs noise)."""
        try:
            self._poll()
        except Exception:  # noqa: BLE001 - the loop must survive any bug in one cycle
            log.exception("target=%s poll failed", self.target.name)
            try:
                self._publish_failure(self.clock(), INTERNAL_ERROR, "internal error; see log", None)
            except Exception:  # noqa: BLE001
                log.exception("target=%s publishing the failure failed", self.target.name)

    def _clock(self) -> float:
        now = self.clock()
        if self._last_now is not None and now < self._last_now:
            log.warning("target=%s the wall clock stepped back %.3fs; this poll is not used for windows",
                        self.target.name, self._last_now - now)
            self.state.count("clock_steps_back")
        self._last_now = now if self._last_now is None else max(now, self._last_now)
        return now

    def _poll(self) -> None:
        now = self._clock()
        result = self.scraper.scrape()
        if result.result != scrape_results.SUCCESS:
            self._publish_failure(now, result.result, result.error, result.duration)
            return
        snapshot = parse(result.body or "")
        if snapshot.warnings != self._warned:
            for w in snapshot.warnings[:10]:
                log.warning("target=%s parse: %s", self.target.name, w)
            self._warned = snapshot.warnings
        if not snapshot.series and snapshot.router is None:  # a router target has predictions, no series
            self._publish_failure(now, NO_VLLM_METRICS, "no vLLM prefix-cache series in the body", result.duration, snapshot)
            return
        over = self._over_limit(snapshot)
        if over:
            self._publish_failure(now, LIMIT_EXCEEDED, over, result.duration)
            return
        if self.target.name not in self.engine.tracks:
            return  # removed by a reload while this poll was in flight
        with self.track_lock:
            was_up = self.engine.tracks[self.target.name].view.ever_up
            events = self.engine.observe(self.target.name, now, snapshot)
            track = self.engine.tracks.get(self.target.name)
            stats, kept, samples = (track.view.stats, len(track.history), track.view.samples) if track else ({}, 0, None)
            noted = track.view.snapshot if track is not None else None
        if noted is not None and noted.warning_count > snapshot.warning_count:
            # what ingesting it refused (a counter stepping back, start times flapping)
            for w in noted.warnings[len(snapshot.warnings):][:10]:
                log.warning("target=%s ingest: %s", self.target.name, w)
            snapshot = noted
        if events:
            with self.lock:
                for ev in events:
                    self.engine.add_event(ev)
        for ev in events:
            log.info("target=%s event source=%s version=%s %s", self.target.name, ev.source, ev.version, ev.description)
        view = self._view()
        if not view.up:
            log.info("target=%s is up", self.target.name)
        # only a real start of vLLM empties its cache: the first answer since we
        # started, or a restart (process start time, counters reset), never a
        # transient scrape failure
        started = "start" if not was_up else "restart" if any(ev.is_restart for ev in events) else ""
        if started and self.on_start is not None:
            self.on_start(self.target.name, started)
        if started and self.baseline_reader is not None:
            self._read_fleet_baseline(snapshot, now)
        self.state.publish(replace(
            view, up=True, polled=True, last_result=result.result, last_error=None, last_scrape_time=now,
            last_success_time=now, scrape_duration=result.duration, scrapes=_count(view.scrapes, result.result),
            snapshot=snapshot, stats=stats, samples=samples, samples_kept=kept, rejected=_add(view.rejected, snapshot.rejected),
        ))

    def _read_fleet_baseline(self, snapshot, now: float) -> None:
        """The fleet's ratio for each model before this pod started, asked off the poll:
        a slow or failing Prometheus only costs (or delays) the comparison, never a poll."""
        at = snapshot.process_start_time if snapshot.process_start_time is not None else now
        models = sorted({s.model_name for s in snapshot.series})[:MAX_BASELINE_MODELS]
        self.baseline_reader.read_in_background(self.target.name, models, at, self._set_fleet_baseline)

    def _set_fleet_baseline(self, model: str, ratio: float, at: float) -> None:
        with self.lock:
            if self.target.name in self.engine.tracks:
                self.engine.set_fleet_baseline(self.target.name, model, ratio, at)

    def _over_limit(self, snapshot) -> str:
        if self.series_limit and len(snapshot.series) > self.series_limit:
            return f"{len(snapshot.series)} series exceed global.series_limit={self.series_limit}"
        models = len({s.model_name for s in snapshot.series})
        if self.model_limit and models > self.model_limit:
            return f"{models} models exceed global.model_limit={self.model_limit}"
        return ""

    def _view(self) -> TargetView:
        return self.state.target(self.target.name) or TargetView(target=self.target)

    def _publish_failure(self, now: float, result: str, error: str | None, duration: float | None, snapshot=None) -> None:
        view = self._view()
        if view.up or not view.polled:
            log.warning("target=%s is down: %s", self.target.name, error)
        stats, kept, samples = view.stats, view.samples_kept, view.samples
        if self.target.name in self.engine.tracks:
            with self.track_lock:
                self.engine.ingest_failure(self.target.name, now)
                track = self.engine.tracks.get(self.target.name)
                if track is not None:
                    stats, kept, samples = track.view.stats, len(track.history), track.view.samples
        self.state.publish(replace(
            view, up=False, polled=True, last_result=result, last_error=error, last_scrape_time=now,
            scrape_duration=duration, scrapes=_count(view.scrapes, result),
            snapshot=snapshot or view.snapshot, stats=stats, samples=samples, samples_kept=kept,
        ))

    def close(self) -> None:
        self.scraper.close()
        if self.baseline_reader is not None:
            self.baseline_reader.close()


def _count(scrapes: tuple[tuple[str, int], ...], result: str) -> tuple[tuple[str, int], ...]:
    counts = dict(scrapes)
    counts[result] = counts.get(result, 0) + 1
    return tuple(sorted(counts.items()))


def _add(total: tuple[tuple[str, int], ...], more: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    if not more:
        return total
    counts = dict(total)
    for reason, n in more:
        counts[reason] = counts.get(reason, 0) + n
    return tuple(sorted(counts.items()))


class Poller:
    """Owns the schedulers, the engine and one TargetPoller per target. Targets poll on
    one pool; rule evaluation runs on its own thread every poll interval, so slow
    targets cannot starve it, and hands transitions on."""

    def __init__(self, config: Config, state: State, clock: Callable[[], float] = time.time,
                 after_evaluate: Callable[[list, list], None] | None = None, sources: Sequence[Callable[[float], list]] = (),
                 on_start: Callable[[str, str], None] | None = None):
        self.state = state
        self.on_start = on_start
        self.clock = clock
        self.after_evaluate = after_evaluate
        self.sources = list(sources)
        self.lock = threading.Lock()  # events and alert views: small work only
        self.eval_lock = threading.Lock()  # evaluation against reconfiguration
        self.reload_lock = threading.Lock()  # one reload at a time
        self._busy = 0  # jobs running now: stop() waits for them, but only so long
        self._idle = threading.Condition()
        self.engine = Engine(config)
        # threads start on demand: discovery may bring any number of targets later
        workers = 64 if config.discovery.enabled else max(4, min(64, len(config.targets) + 1))
        self.scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(workers), "rules": ThreadPoolExecutor(1),
                                                        "discovery": ThreadPoolExecutor(1)},
                                             job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        self.pollers: dict[str, TargetPoller] = {}
        self.config = config  # as loaded: the static targets
        self.discovery: Discovery | None = None
        self.discovered: list[Target] = []
        self.current = config  # what is polled: static and discovered targets of this shard
        self._merge_warnings: tuple[str, ...] = ()
        self._install(config, rebuild=True)

    def _install(self, config: Config, rebuild: bool) -> None:
        """Poll the targets of `config` plus the discovered ones. `rebuild` (a reload:
        timings may have changed) replaces every job; otherwise only targets that came,
        went or changed are touched, so a discovery refresh never resets a poll."""
        current = replace(config, targets=self._targets_of(config))
        with self.eval_lock, self.lock:
            self.engine.reconfigure(current)
        self.current = current
        self.state.set_targets([TargetView(target=t) for t in current.targets])
        wanted = {t.name: t for t in current.targets}
        for name in list(self.pollers):
            if rebuild or name not in wanted or self.pollers[name].target != wanted[name]:
                self.pollers.pop(name).close()
                if self.scheduler.get_job(name):
                    self.scheduler.remove_job(name)
        for t in current.targets:
            if t.name in self.pollers:
                continue
            poller = TargetPoller(t, current, self.state, self.engine, self.lock, self.clock, self.on_start)
            self.pollers[t.name] = poller
            self.scheduler.add_job(self._tracked(poller.poll), "interval", id=t.name, name=t.name,
                                   seconds=config.global_.poll_interval, jitter=config.global_.jitter or None,
                                   next_run_time=_now_datetime())
        if rebuild:
            if self.scheduler.get_job("evaluate"):
                self.scheduler.remove_job("evaluate")
            self.scheduler.add_job(self._tracked(self.evaluate), "interval", id="evaluate", name="evaluate", executor="rules",
                                   seconds=config.global_.poll_interval, next_run_time=_now_datetime())
            self._install_discovery(config)

    def _targets_of(self, config: Config) -> tuple[Target, ...]:
        targets, warnings = polled(config.targets, self.discovered, config.discovery.shard)
        if tuple(warnings) != self._merge_warnings:
            for w in warnings:
                log.warning("discovery: %s", w)
            self._merge_warnings = tuple(warnings)
        return tuple(targets)

    def _install_discovery(self, config: Config) -> None:
        if self.discovery is not None and self.discovery.cfg == config.discovery:
            return
        if self.discovery is not None:
            self.discovery.close()
        if self.scheduler.get_job("discover"):
            self.scheduler.remove_job("discover")
        self.discovery = Discovery(config.discovery, self.clock) if config.discovery.enabled else None
        # published before the first refresh: readiness waits for every source to answer once
        self.state.put("discovery", self.discovery.snapshot() if self.discovery is not None else [])
        if self.discovery is None:
            self.discovered = []
            return
        # the first refresh runs on the discovery thread, at once: never on the start-up path
        self.scheduler.add_job(self._tracked(self.discover), "interval", id="discover", name="discover", executor="discovery",
                               seconds=config.discovery.refresh_interval, next_run_time=_now_datetime())

    def discover(self) -> None:
        """One refresh of every discovery source; applies what changed. Never raises."""
        try:
            discovery = self.discovery
            if discovery is None:
                return
            found = discovery.refresh()
            with self.reload_lock:
                if discovery is not self.discovery:
                    return
                self.state.put("discovery", discovery.snapshot())
                if found == self.discovered:
                    return
                self.discovered = found
                self._install(self.config, rebuild=False)
        except Exception:  # noqa: BLE001 - the refresh loop must survive a bug
            log.exception("discovery refresh failed")
            self.state.count("discovery_errors")

    def analyze(self, now: float, model: str, version: str, baseline: str | None):
        """The rollout gate's verdict; reads only the tracks' immutable views."""
        with self.eval_lock:  # the engine's config and track list, against a reload
            return self.engine.analyze(now, model, version, baseline)

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
                events = self.engine.take_events(now)
            with self.eval_lock:
                transitions = self.engine.evaluate(now, events)
                firing = self.engine.firing()
            for tr in transitions:
                a = tr.alert
                if tr.state == INACTIVE:
                    log.info("alert %s pending ended without firing target=%s model=%s%s", a.alertname, a.target, a.model,
                             f" version={a.version}" if a.version else "")
                else:
                    log.info("alert %s %s target=%s model=%s%s cause=%s", a.alertname, tr.state, a.target, a.model,
                             f" version={a.version}" if a.version else "", dict(a.labels).get("cause"))
            self._publish_engine()
            if self.after_evaluate is not None:
                self.after_evaluate(transitions, firing)
        except Exception:  # noqa: BLE001 - the evaluation loop must survive a bug
            log.exception("rule evaluation failed")
            self.state.count("evaluation_errors")

    def _publish_engine(self) -> None:
        with self.eval_lock:
            alerts = self.engine.active_alerts()
            verdicts = dict(self.engine.verdicts)
            routing = dict(self.engine.predictions)
        with self.lock:
            events = list(self.engine.events)[-50:]
            counts: dict[str, dict[str, int]] = {}
            for (target, source), n in self.engine.event_counts.items():
                counts.setdefault(target, {})[source] = n
            last = self.engine.last_deploy()
        self.state.put("alerts", alerts)
        self.state.put("fleet", verdicts)
        self.state.put("routing", routing)
        self.state.put("deploys", {"recent": [e.to_json() for e in events], "counts": counts, "last": last})

    def reload(self, config: Config) -> None:
        """New targets, timings or rules: histories of kept targets survive. Reloads are
        serialized; a poll in flight finishes against the track it started with."""
        with self.reload_lock:
            self.config = config
            self._install(config, rebuild=True)
            self._publish_engine()
        if self.discovery is not None and self.scheduler.running:
            self.discover()

    def start(self) -> None:
        """The first discovery refresh is a job like the others: a slow discovery source
        never delays start-up (readiness waits for it instead)."""
        self.scheduler.start()

    def _tracked(self, job: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with self._idle:
                self._busy += 1
            try:
                job()
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()
        run.__name__ = run.__qualname__ = getattr(job, "__name__", "job")
        return run

    def stop(self, timeout: float = 2.0) -> bool:
        """No new job starts; those running get `timeout` seconds to finish (a poll is
        bounded by its scrape deadline, which may be longer: SIGTERM does not wait for it).
        False when one is still running: the process must then leave without joining it."""
        if self.discovery is not None:
            self.discovery.close()  # first: a refresh in flight ends now, not at its deadline
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        with self._idle:
            idle = self._idle.wait_for(lambda: self._busy <= 0, timeout)
            if not idle:
                log.warning("stopping with %d poll(s) or refresh(es) still waiting on their peers", self._busy)
        for p in self.pollers.values():
            p.close()
        if self.discovery is not None:
            self.discovery.close()
        return idle


def _now_datetime() -> datetime:
    return datetime.now(timezone.utc)
