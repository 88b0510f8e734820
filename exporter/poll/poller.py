"""Polling: one APScheduler job per target runs scrape -> parse -> windows -> publish.

A slow or dead target only ever holds its own job: jobs coalesce, never overlap, and
run on a pool sized for the fleet.
"""
from __future__ import annotations

import logging
import time
import threading
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Callable, Sequence

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from ..alerting.deploys import DeployEvent
from ..alerting.rules_state import INACTIVE
from ..config.sections import Config, Target
from ..discovery.prombaseline import FleetBaselineReader
from ..discovery.sources import Discovery
from ..discovery.targets import polled
from ..monitor.engine import Engine, Track
from ..monitor.targetview import INTERNAL_ERROR, LIMIT_EXCEEDED, NO_VLLM_METRICS, SUCCESS, add, count
from ..parse.vllm_metrics import parse
from ..serve.state import Deploys, State
from .scrape import Scraper

log = logging.getLogger(__name__)

MAX_BASELINE_MODELS = 10


class TargetPoller:
    """One target's job: scrape, parse, hand the snapshot to the engine, publish.

    The scrape and the parse run under no lock. The engine work that grows with the
    target's size (history, windows) and the publishing of its view run under its own
    lock, which a reload also takes: from the moment the poll reads its Track until the
    view is published, no reload can remove or reconfigure it. The engine lock is only
    taken to add the events the poll found."""

    def __init__(self, target: Target, config: Config, state: State, engine: Engine, engine_lock: threading.Lock,
                 clock: Callable[[], float] = time.time, on_start: Callable[[str, str], None] | None = None,
                 target_lock: threading.Lock | None = None):
        g = config.global_
        self.target = target
        self.state = state
        self.engine = engine
        self.engine_lock = engine_lock
        self.target_lock = target_lock or threading.Lock()
        # set by a reload that removed the target, under its lock: a poll still in flight then
        # publishes nothing, even once the same name is polled again (with a new lock and Track)
        self.retired = False
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
            self.state.count(clock_steps_back=1)
        self._last_now = now if self._last_now is None else max(now, self._last_now)
        return now

    def _track(self) -> Track | None:
        """This target's Track, read once under its lock (held by the caller); None once a
        reload removed the target while the scrape was in flight."""
        return None if self.retired else self.engine.tracks.get(self.target.name)

    def _poll(self) -> None:
        now = self._clock()
        result = self.scraper.scrape()
        if result.result != SUCCESS:
            self._publish_failure(now, result.result, result.error, result.duration)
            return
        snapshot = parse(result.body or "", self.series_limit)
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
        with self.target_lock:
            track = self._track()
            if track is None:
                return
            was_up, before = track.view.ever_up, track.view
            events = self.engine.observe(self.target.name, now, snapshot)
            if events:
                with self.engine_lock:
                    for ev in events:
                        self.engine.add_event(ev)
            noted = track.view.snapshot
            if noted is not None and noted.warning_count > snapshot.warning_count:
                # what ingesting it refused (a counter stepping back, start times flapping)
                for w in noted.warnings[len(snapshot.warnings):][:10]:
                    log.warning("target=%s ingest: %s", self.target.name, w)
                snapshot = noted
            track.view = view = replace(
                track.view, snapshot=snapshot, up=True, down_since=None, samples_kept=len(track.history),
                polled=True, last_result=result.result, last_error=None, last_scrape_time=now, last_success_time=now,
                scrape_duration=result.duration, scrapes=count(before.scrapes, result.result), rejected=add(before.rejected, snapshot.rejected))
            self.state.publish(view)
        for ev in events:
            log.info("target=%s event source=%s version=%s %s", self.target.name, ev.source, ev.version, ev.description)
        if not before.up:
            log.info("target=%s is up", self.target.name)
        # only a real start of vLLM empties its cache: the first answer since we
        # started, or a restart (process start time, counters reset), never a
        # transient scrape failure
        started = "start" if not was_up else "restart" if any(ev.is_restart for ev in events) else ""
        if started and self.on_start is not None:
            self.on_start(self.target.name, started)
        if started and self.baseline_reader is not None:
            self._read_fleet_baseline(snapshot, now)

    def _read_fleet_baseline(self, snapshot, now: float) -> None:
        """The fleet's ratio for each model before this pod started, asked off the poll:
        a slow or failing Prometheus only costs (or delays) the comparison, never a poll."""
        at = snapshot.process_start_time if snapshot.process_start_time is not None else now
        models = sorted({s.model_name for s in snapshot.series})[:MAX_BASELINE_MODELS]
        self.baseline_reader.read_in_background(self.target.name, models, at, self._set_fleet_baseline)

    def _set_fleet_baseline(self, model: str, ratio: float, at: float) -> None:
        with self.engine_lock:
            if self.target.name in self.engine.tracks:
                self.engine.set_fleet_baseline(self.target.name, model, ratio, at)

    def _over_limit(self, snapshot) -> str:
        if snapshot.over_series_limit:  # parsing stopped there: the rest of the body was never read
            return f"more than {self.series_limit} series exceed global.series_limit={self.series_limit}"
        models = len({s.model_name for s in snapshot.series})
        if self.model_limit and models > self.model_limit:
            return f"{models} models exceed global.model_limit={self.model_limit}"
        return ""

    def _publish_failure(self, now: float, result: str, error: str | None, duration: float | None, snapshot=None) -> None:
        with self.target_lock:
            track = self._track()
            if track is None:
                return
            before = track.view
            if before.up or not before.polled:
                log.warning("target=%s is down: %s", self.target.name, error)
            self.engine.ingest_failure(self.target.name, now)
            track.view = view = replace(
                track.view, samples_kept=len(track.history), polled=True, last_result=result, last_error=error,
                last_scrape_time=now, scrape_duration=duration, scrapes=count(before.scrapes, result),
                snapshot=snapshot or before.snapshot)
            self.state.publish(view)

    def close(self) -> None:
        self.scraper.close()
        if self.baseline_reader is not None:
            self.baseline_reader.close()


class Poller:
    """Owns the schedulers, the engine and one TargetPoller per target. Targets poll on
    one pool; rule evaluation runs on its own thread every poll interval, so slow
    targets cannot starve it, and hands transitions on.

    Locks, always taken in this order (a thread holding one takes only later ones):
      1. reload_lock: one reconfiguration at a time (a SIGHUP's whole reload, which holds it
         from reading the file on, and a discovery refresh's change); reentrant;
      2. the targets' locks (self.target_locks, one per target name, all of them in name
         order when a reconfiguration takes them): a target's Track, its history and
         view, and the publishing of that view;
      3. engine_lock: the rest of the engine (its config and track list, events, alerts,
         verdicts, predictions, fleet baselines), for evaluation, analysis, events and
         reconfiguration;
      4. the State's own lock, taken inside State's methods only.
    Evaluation reads each Track's view without its lock: views are immutable and replaced
    whole, and the track list only changes under every lock above."""

    def __init__(self, config: Config, state: State, clock: Callable[[], float] = time.time,
                 after_evaluate: Callable[[list, list], None] | None = None, sources: Sequence[Callable[[float], list]] = (),
                 on_start: Callable[[str, str], None] | None = None):
        self.state = state
        self.on_start = on_start
        self.clock = clock
        self.after_evaluate = after_evaluate
        self.sources = list(sources)
        self.reload_lock = threading.RLock()
        self.target_locks: dict[str, threading.Lock] = {}  # changed only under reload_lock and every lock in it
        self.engine_lock = threading.Lock()
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
        with self.reload_lock:
            self._install(config, rebuild=True)

    def _install(self, config: Config, rebuild: bool) -> None:
        """Poll the targets of `config` plus the discovered ones (the caller holds
        reload_lock). `rebuild` (a reload: timings may have changed) replaces every job;
        otherwise only targets that came, went or changed are touched, so a discovery
        refresh never resets a poll."""
        current = replace(config, targets=self._targets_of(config))
        wanted = {t.name: t for t in current.targets}
        for name in wanted:
            self.target_locks.setdefault(name, threading.Lock())
        with ExitStack() as held:
            # every target's lock: no poll is between reading its Track and publishing its view
            for name in sorted(self.target_locks):
                held.enter_context(self.target_locks[name])
            with self.engine_lock:
                self.engine.reconfigure(current)
                views = [self.engine.tracks[t.name].view for t in current.targets]
            self.current = current
            self.state.set_targets(views)
            for name in [n for n in self.target_locks if n not in wanted]:
                del self.target_locks[name]
                if name in self.pollers:
                    self.pollers[name].retired = True
        for name in list(self.pollers):
            if rebuild or name not in wanted or self.pollers[name].target != wanted[name]:
                self.pollers.pop(name).close()
                if self.scheduler.get_job(name):
                    self.scheduler.remove_job(name)
        for t in current.targets:
            if t.name in self.pollers:
                continue
            poller = TargetPoller(t, current, self.state, self.engine, self.engine_lock, self.clock, self.on_start,
                                  target_lock=self.target_locks[t.name])
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
        self.state.update(discovery=tuple(self.discovery.snapshot()) if self.discovery is not None else ())
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
                self.state.update(discovery=tuple(discovery.snapshot()))
                if found == self.discovered:
                    return
                self.discovered = found
                self._install(self.config, rebuild=False)
        except Exception:  # noqa: BLE001 - the refresh loop must survive a bug
            log.exception("discovery refresh failed")
            self.state.count(discovery_errors=1)

    def analyze(self, now: float, model: str, version: str, baseline: str | None):
        """The rollout gate's verdict, against one consistent engine."""
        with self.engine_lock:
            return self.engine.analyze(now, model, version, baseline)

    def add_event(self, event: DeployEvent) -> None:
        with self.engine_lock:
            self.engine.add_event(event)
        self._publish_engine()

    def evaluate(self) -> None:
        try:
            now = self.clock()
            found = [ev for source in self.sources for ev in source(now)]  # a source may read a file: under no lock
            for ev in found:
                log.info("event source=%s target=%s version=%s %s", ev.source, ev.target, ev.version, ev.description)
            with self.engine_lock:
                for ev in found:
                    self.engine.add_event(ev)
                transitions = self.engine.evaluate(now, self.engine.take_events(now))
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
            self.state.count(evaluation_errors=1)

    def _publish_engine(self) -> None:
        """Alerts, verdicts, predictions and deploys as of one moment of the engine,
        copied under its lock: readers never see a dict the engine goes on changing."""
        with self.engine_lock:
            alerts = tuple(self.engine.active_alerts())
            verdicts = MappingProxyType(dict(self.engine.verdicts))
            routing = MappingProxyType(dict(self.engine.predictions))
            recent = tuple(e.to_json() for e in list(self.engine.events)[-50:])
            counts: dict[str, dict[str, int]] = {}
            for (target, source), n in self.engine.event_counts.items():
                counts.setdefault(target, {})[source] = n
            last = self.engine.last_deploy()
        self.state.update(alerts=alerts, verdicts=verdicts, routing=routing,
                          deploys=Deploys(recent, MappingProxyType(counts), MappingProxyType(last)))

    def reload(self, config: Config) -> None:
        """New targets, timings or rules: histories of kept targets survive. Reloads are
        serialized; a poll in flight of a kept target finishes against its Track."""
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
        # the poller list changes under reload_lock; a reload stuck on a peer never holds SIGTERM up
        locked = self.reload_lock.acquire(timeout=0.5)
        try:
            pollers = list(self.pollers.values())
        finally:
            if locked:
                self.reload_lock.release()
        for p in pollers:
            p.close()
        if self.discovery is not None:
            self.discovery.close()
        return idle


def _now_datetime() -> datetime:
    return datetime.now(timezone.utc)
