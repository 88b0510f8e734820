"""Polling: scrape -> parse -> windows -> publish, for every target on its schedule.

One APScheduler job dispatches the polls that are due onto bounded pools (exporter/poll/dispatch.py): a target
has one poll at a time, slow and new targets share a few workers of their own, so a few hundred hung targets never
hold up the others. A reload or a discovery change touches only the targets that came, went or changed.
"""
from __future__ import annotations

import itertools
import logging
import time
import threading
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial
from types import MappingProxyType
from typing import Callable, Sequence

from apscheduler.executors.debug import DebugExecutor
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from ..alerting.deploys import DeployEvent
from ..alerting.rules_state import INACTIVE
from ..logfields import fields, namespace_of
from ..config.sections import Config, Target
from ..discovery.prombaseline import FleetBaselineReader
from ..discovery.sources import Discovery
from ..discovery.targets import polled
from ..monitor.engine import Engine, Track
from ..monitor.targetview import INTERNAL_ERROR, LIMIT_EXCEEDED, NO_VLLM_METRICS, SUCCESS, TIMEOUT, add, count
from ..parse.vllm_metrics import parse
from ..serve.state import Deploys, State
from . import kvsource
from .dispatch import Dispatcher, dispatch_tick
from .promread import SCRAPED_SINCE_START, PrometheusReader, read_once, reader_settings
from .scrape import Scraper
from .taskwatch import TaskWatch

log = logging.getLogger(__name__)
_now_datetime = partial(datetime.now, timezone.utc)

MAX_BASELINE_MODELS = 10


class TargetPoller:
    """One target's job: scrape, parse, hand the snapshot to the engine, publish.

    The scrape and the parse run under no lock. The engine work that grows with the target's size (history,
    windows) and the publishing of its view run under its own lock, which a reload also takes: from the moment
    the poll reads its Track until the view is published, no reload can remove or reconfigure it. The engine
    lock is only taken to add the events the poll found."""

    def __init__(self, target: Target, config: Config, state: State, engine: Engine, engine_lock: threading.Lock,
                 clock: Callable[[], float] = time.time, on_start: Callable[[str, str], None] | None = None,
                 target_lock: threading.Lock | None = None, pause: Callable[[], None] = lambda: None):
        self.target = target
        self.pause = pause  # before the parse: a burst of scrapers of /metrics goes first
        self._paused = 0.0  # how long the poll under way waited there
        self.state = state
        self.engine = engine
        self.engine_lock = engine_lock
        self.target_lock = target_lock or threading.Lock()
        # set by a reload that removed the target, under its lock: a poll still in flight then
        # publishes nothing, even once the same name is polled again (with a new lock and Track)
        self.retired = False
        self.clock = clock
        self.on_start = on_start
        self._warned: tuple[str, ...] = ()
        self._last_now: float | None = None
        # polls are numbered as they start; one publishes only over an older one (under the target's lock)
        self._numbers = itertools.count(1)
        self._published = 0
        # the parser's scrape cache of this target (a series' text -> its labels), bounded by the parser;
        # used by one poll at a time, as the target has
        self._parse_memo: dict[str, dict[str, str]] = {}
        self.scraper: Scraper | None = None
        self.baseline_reader: FleetBaselineReader | None = None
        self.kv_source: kvsource.KVEventSource | None = None  # its KV cache events, where it publishes them
        self._scrape_settings: tuple = ()
        self.reconfigure(target, config)

    def reconfigure(self, target: Target, config: Config) -> None:
        """A reload's or discovery's new settings for a kept target: its connection, its
        pending fleet-baseline question and its place in the schedule stay unless what
        they depend on changed (the URL and timeouts, the fleet_baseline section)."""
        g = config.global_
        self.target = target
        self.model_limit = g.model_limit
        self.series_limit = g.series_limit
        settings = (target.url, g.connect_timeout, g.scrape_timeout, g.body_size_limit, g.read_timeout)
        if settings != self._scrape_settings:
            old, self._scrape_settings = self.scraper, settings
            self.scraper = Scraper(target.url, g.connect_timeout, g.scrape_timeout, g.body_size_limit, idle=g.read_timeout)
            if old is not None:
                old.retire()
        wanted = config.fleet_baseline if config.fleet_baseline.enabled else None
        current = self.baseline_reader.cfg if self.baseline_reader is not None else None
        if wanted != current:
            if self.baseline_reader is not None:
                self.baseline_reader.close()
            self.baseline_reader = FleetBaselineReader(wanted) if wanted is not None else None
        self.kv_source = kvsource.kept(self.kv_source, target, config, self.clock)

    def poll(self) -> tuple[float, bool]:
        """One cycle; never raises. -> (seconds it took, whether the target was too slow
        to answer: the dispatcher then polls it on the lane for slow targets)."""
        began = time.monotonic()
        number = next(self._numbers)
        self._paused = 0.0
        try:
            slow = self._poll(number)
            return time.monotonic() - began - self._paused, slow  # a wait for scrapes is not the target's slowness
        except Exception:  # noqa: BLE001 - the loop must survive any bug in one cycle
            log.exception("poll failed", extra=self._about())
            try:
                self._publish_failure(number, self.clock(), INTERNAL_ERROR, "internal error; see log", None)
            except Exception:  # noqa: BLE001
                log.exception("publishing the failure failed", extra=self._about())
            return time.monotonic() - began - self._paused, False

    def _newest(self, number: int) -> bool:
        """Under the target's lock: this poll started after the last one published (a poll
        that took long never publishes over a newer one: an old failure over a success)."""
        newest, self._published = number >= self._published, max(number, self._published)
        return newest

    def _clock(self) -> float:
        now = self.clock()
        if self._last_now is not None and now < self._last_now:
            log.warning("the wall clock stepped back %.3fs; this poll is not used for windows", self._last_now - now,
                        extra=self._about())
            self.state.count(clock_steps_back=1)
        self._last_now = now if self._last_now is None else max(now, self._last_now)
        return now

    def _about(self, **more) -> dict:
        return fields(target=self.target.name, namespace=namespace_of(self.target), **more)

    def _track(self) -> Track | None:
        """This target's Track, read once under its lock (held by the caller); None once a reload removed it."""
        return None if self.retired else self.engine.tracks.get(self.target.name)

    def _poll(self, number: int) -> bool:
        now = self._clock()
        result = self.scraper.scrape()
        if result.result != SUCCESS:
            self._publish_failure(number, now, result.result, result.error, result.duration)
            return result.result == TIMEOUT
        paused = time.monotonic()
        self.pause()
        self._paused = time.monotonic() - paused
        self._accept(number, now, parse(result.body or "", self.series_limit, self._parse_memo), result.duration)
        return False

    def ingest(self, now: float, snapshot) -> None:
        """A sample of the target read elsewhere (the Prometheus source, at the time
        Prometheus scraped it): the very path a scraped body takes. Never raises."""
        number = next(self._numbers)
        try:
            self._accept(number, now, snapshot, None)
        except Exception:  # noqa: BLE001 - one bad sample must not end the read of every other
            log.exception("ingest failed", extra=self._about())
            self._publish_failure(number, now, INTERNAL_ERROR, "internal error; see log", None)

    def mark_down(self, now: float, result: str, error: str) -> None:
        """The target's samples stopped (the Prometheus source): down, not frozen."""
        self._publish_failure(next(self._numbers), now, result, error, None)

    def _accept(self, number: int, now: float, snapshot, duration: float | None) -> None:
        if snapshot.warnings != self._warned:
            for w in snapshot.warnings[:10]:
                log.warning("parse: %s", w, extra=self._about())
            self._warned = snapshot.warnings
        if not snapshot.series and snapshot.router is None:  # a router target has predictions, no series
            self._publish_failure(number, now, NO_VLLM_METRICS, "no vLLM prefix-cache series in the body", duration, snapshot)
            return
        over = self._over_limit(snapshot)
        if over:
            self._publish_failure(number, now, LIMIT_EXCEEDED, over, duration)
            return
        with self.target_lock:
            track = self._track()
            if track is None or not self._newest(number):
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
                    log.warning("ingest: %s", w, extra=self._about())
                snapshot = noted
            track.view = view = track.view.evolve(
                snapshot=snapshot, up=True, down_since=None, samples_kept=len(track.history),
                polled=True, last_result=SUCCESS, last_error=None, last_scrape_time=now, last_success_time=now,
                scrape_duration=duration, scrapes=count(before.scrapes, SUCCESS), rejected=add(before.rejected, snapshot.rejected),
                kv=self.kv_source.view(now) if self.kv_source is not None else None)
            self.state.publish(view)
        for ev in events:
            log.info("event: %s", ev.description, extra=self._about(source=ev.source, version=ev.version))
        if not before.up:  # at every start of ours, once a pod: said for each only at debug
            log.log(logging.INFO if before.polled else logging.DEBUG, "up" if not before.polled else "up again", extra=self._about())
        # only a real start of vLLM empties its cache: the first answer since we started, or a restart
        # (process start time, counters reset), never a transient scrape failure
        started = "start" if not was_up else "restart" if any(ev.is_restart for ev in events) else ""
        try:  # the success is published: what fails here (a start's hook) is said, never published over it
            if started and (reader := self.baseline_reader) is not None:  # read once: a reload may set it to None
                self._read_fleet_baseline(reader, snapshot, now)
            if started and self.on_start is not None:
                self.on_start(self.target.name, started)
        except Exception:  # noqa: BLE001
            log.exception("acting on the %s of the target failed", started, extra=self._about())

    def _read_fleet_baseline(self, reader: FleetBaselineReader, snapshot, now: float) -> None:
        """The fleet's ratio for each model before this pod started, asked off the poll:
        a slow or failing Prometheus only costs (or delays) the comparison, never a poll."""
        at = snapshot.process_start_time if snapshot.process_start_time is not None else now
        models = sorted({s.model_name for s in snapshot.series})[:MAX_BASELINE_MODELS]
        reader.read_in_background(self.target.name, models, at, self._set_fleet_baseline)

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

    def _publish_failure(self, number: int, now: float, result: str, error: str | None, duration: float | None,
                         snapshot=None) -> None:
        with self.target_lock:
            track = self._track()
            if track is None or not self._newest(number):
                return
            before = track.view
            if before.up or not before.polled:
                log.warning("down: %s", error, extra=self._about(error=result))
            self.engine.ingest_failure(self.target.name, now)
            track.view = view = replace(
                track.view, samples_kept=len(track.history), polled=True, last_result=result, last_error=error,
                last_scrape_time=now, scrape_duration=duration, scrapes=count(before.scrapes, result),
                snapshot=snapshot or before.snapshot)
            self.state.publish(view)

    def close(self) -> None:
        self.kv_source = kvsource.kept(self.kv_source, None, None, self.clock)
        for peer in (self.scraper, self.baseline_reader):
            if peer is not None:
                peer.close()


class Poller:
    """Owns the scheduler, the engine and one TargetPoller per target. Targets poll on
    the dispatcher's pools; rule evaluation runs on its own thread every poll interval,
    so slow targets cannot starve it, and hands transitions on.

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
        # a poll's parse waits for a burst of scrapes to pass (the sidecar sets it: Exposition.wait_for_pause)
        self.pause_for_scrapes: Callable[[], None] = lambda: None
        self._busy = 0  # jobs running now: stop() waits for them, but only so long
        self._idle = threading.Condition()
        self.engine = Engine(config)
        # the dispatching job runs on the scheduler's own thread (no hop, no pool of its own);
        # polls run on the dispatcher's pools, rules and discovery on one thread each
        self.scheduler = BackgroundScheduler(executors={"default": DebugExecutor(), "rules": ThreadPoolExecutor(1),
                                                        "discovery": ThreadPoolExecutor(1), "read": ThreadPoolExecutor(1)},
                                             job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        self.dispatcher = Dispatcher(on_skips=self._publish_skips)
        self.tasks = TaskWatch(changed=self._publish_tasks)  # the read, rule and discovery jobs' runs and misses
        self.tasks.watch(self.scheduler)
        self.pollers: dict[str, TargetPoller] = {}
        self.config = config  # as loaded: the static targets
        self.discovery: Discovery | None = None
        self.discovered: list[Target] = []
        self.reader: PrometheusReader | None = None  # discovery.read_prometheus: the pods' samples from a Prometheus
        self.read_found: list[Target] = []  # the pods it found
        self.read_names: frozenset[str] = frozenset()  # of what is polled, the targets it reads (no scrape of theirs)
        self.engine_series_withheld: frozenset[str] = frozenset()  # of those, whose engine's own series we do not export
        self.freeze_reads = False  # freeze what each read leaves (the sidecar's process: promread.read_once)
        self.reads_frozen = 0
        self.current = config  # what is polled: static and discovered targets of this shard
        self._merge_warnings: tuple[str, ...] = ()
        self._timings: tuple = ()
        self.reload_discovery_budget = 5.0  # seconds a reload waits for discovery (the discovery thread waits on)
        with self.reload_lock:
            self._install(config)

    def _install(self, config: Config) -> None:
        """Poll the targets of `config` plus the discovered ones (the caller holds
        reload_lock). Only targets that came, went or changed are touched: a kept target
        keeps its poller, its connection, its phase and its pending fleet-baseline
        question, whether a reload or a discovery refresh changed the list."""
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
            for t in current.targets:
                if t.name in self.pollers:
                    self.pollers[t.name].reconfigure(t, current)
        for name in [n for n in self.pollers if n not in wanted]:
            self.pollers.pop(name).close()
            self.dispatcher.remove(name)
        g = config.global_
        read_urls = {t.url for t in self.read_found}
        self.read_names = frozenset(t.name for t in current.targets if t.url in read_urls)
        read = config.discovery.read_prometheus
        withheld = self.read_names if read is not None and not read.reexport_engine_series else frozenset()
        if withheld != self.engine_series_withheld:
            self.engine_series_withheld = withheld
            self.state.update(engine_series_withheld=withheld)
        for t in current.targets:
            poller = self.pollers.get(t.name)
            if poller is None:
                poller = self.pollers[t.name] = TargetPoller(t, current, self.state, self.engine, self.engine_lock, self.clock,
                                                             self.on_start, target_lock=self.target_locks[t.name],
                                                             pause=lambda: self.pause_for_scrapes())
            if t.name in self.read_names:
                self.dispatcher.remove(t.name)  # its samples come from the Prometheus source
            else:
                self.dispatcher.set(t.name, poller.poll, g.poll_interval, g.jitter)
        self.dispatcher.resize()
        timings = (g.poll_interval,)
        if timings != self._timings:
            self._timings = timings
            for job in ("dispatch", "evaluate"):
                if self.scheduler.get_job(job):
                    self.scheduler.remove_job(job)
            self.scheduler.add_job(self._dispatch, "interval", id="dispatch", name="dispatch",
                                   seconds=dispatch_tick(g.poll_interval), next_run_time=_now_datetime())
            self.tasks.expect("evaluate", g.poll_interval)
            self.scheduler.add_job(self._tracked(self.evaluate), "interval", id="evaluate", name="evaluate", executor="rules",
                                   seconds=g.poll_interval, next_run_time=_now_datetime())
        self._install_discovery(config)

    def _dispatch(self) -> None:
        try:
            self.dispatcher.dispatch()
        except Exception:  # noqa: BLE001 - the schedule must survive a bug
            log.exception("dispatching polls failed")

    def _publish_skips(self, changed: dict[str, int]) -> None:
        self.state.update(skipped_polls=MappingProxyType(self.dispatcher.skips()))

    def _targets_of(self, config: Config) -> tuple[Target, ...]:
        targets, warnings = polled(config.targets, self.discovered + self.read_found, config.discovery.shard,
                                   config.discovery.kv_events)
        if tuple(warnings) != self._merge_warnings:
            for w in warnings:
                log.warning("discovery: %s", w)
            self._merge_warnings = tuple(warnings)
        return tuple(targets)

    def publish_discovery(self) -> None:
        states = tuple(self.discovery.snapshot()) if self.discovery is not None else ()
        self.state.update(discovery=states + ((self.reader.state,) if self.reader is not None else ()))

    def _install_reader(self, config: Config) -> None:
        """discovery.read_prometheus: its reader and its job, anew when its settings changed."""
        wanted = reader_settings(config.discovery, config.global_.poll_interval)
        if self.reader is not None and reader_settings(self.reader.cfg, self.reader.poll_interval) == wanted:
            return
        if (old := self.reader) is not None:
            old.close()
        if self.scheduler.get_job("read"):
            self.scheduler.remove_job("read")
        self.reader = PrometheusReader(config.discovery, config.global_.poll_interval, config.anchored_seconds + 60.0,
                                       config.rules.longest_hold) if config.discovery.read_prometheus else None
        if self.reader is not None and old is not None:
            self.reader.carry_over(old)  # what was read stays read: a reload never feeds a pod's samples twice
        if self.reader is None:
            self.tasks.forget("read")
            self.state.update(samples_source=SCRAPED_SINCE_START)
            if self.read_found:
                self.read_found = []
                self._install(config)
        if self.reader is not None:
            self.tasks.expect("read", config.global_.poll_interval)
            self.scheduler.add_job(self._tracked(self.read), "interval", id="read", name="read", executor="read",
                                   seconds=config.global_.poll_interval, next_run_time=_now_datetime())

    def read(self) -> None:
        """One read of the Prometheus source (exporter/poll/promread.py). Never raises."""
        try:
            read_once(self)
        except Exception:  # noqa: BLE001 - the read loop must survive a bug
            log.exception("reading Prometheus failed")
            self.state.count(discovery_errors=1)

    def _install_discovery(self, config: Config) -> None:
        self._install_reader(config)
        if self.discovery is not None and self.discovery.cfg == config.discovery:
            return
        if self.discovery is not None:
            self.discovery.close()
        if self.scheduler.get_job("discover"):
            self.scheduler.remove_job("discover")
        self.discovery = Discovery(config.discovery, self.clock) if config.discovery.prometheus or config.discovery.file_sd else None
        # published before the first refresh: readiness waits for every source to answer once
        self.publish_discovery()
        if self.discovery is None:
            self.discovered = []
            self.tasks.forget("discover")
            return
        # the first refresh runs on the discovery thread, at once: never on the start-up path
        self.tasks.expect("discover", config.discovery.refresh_interval)
        self.scheduler.add_job(self._tracked(self.discover), "interval", id="discover", name="discover", executor="discovery",
                               seconds=config.discovery.refresh_interval, next_run_time=_now_datetime())

    def discover(self, budget: float | None = None) -> None:
        """One refresh of every discovery source, under no lock; applies what changed. Never raises."""
        try:
            discovery = self.discovery
            found = discovery.refresh(budget) if discovery is not None else []
            if found is None and self.scheduler.get_job("discover"):  # not done in `budget` (a reload's): the job's, now
                self.scheduler.modify_job("discover", next_run_time=_now_datetime())
            if discovery is None or found is None:
                return
            with self.reload_lock:
                if discovery is not self.discovery:
                    return
                self.publish_discovery()
                if found != self.discovered:
                    self.discovered = found
                    self._install(self.config)
        except Exception:  # noqa: BLE001 - the refresh loop must survive a bug
            log.exception("discovery refresh failed")
            self.state.count(discovery_errors=1)

    def analyze(self, now: float, model: str, version: str, baseline: str | None, where: dict[str, str] | None = None):
        """The rollout gate's verdict, against one consistent engine."""
        with self.engine_lock:
            return self.engine.analyze(now, model, version, baseline, where)

    def add_event(self, event: DeployEvent) -> None:
        with self.engine_lock:
            self.engine.add_event(event)
        self._publish_engine()

    def samples_now(self) -> float:
        """The time to compare samples with: read from Prometheus they carry its wall-clock time
        (a steady clock ahead of it after a step NTP slews back found every pod stale)."""
        return getattr(self.clock, "wall", self.clock)() if self.reader is not None else self.clock()

    def evaluate(self) -> None:
        if self.reader is not None and self.reader.backfilling:  # stepping the rules through the past: now waits
            return
        try:
            now = self.samples_now()
            found = [ev for source in self.sources for ev in source(now)]  # a source may read a file: under no lock
            for ev in found:
                log.info("event: %s", ev.description, extra=fields(source=ev.source, target=ev.target, version=ev.version))
            with self.engine_lock:
                for ev in found:
                    self.engine.add_event(ev)
                transitions = self.engine.evaluate(now, self.engine.take_events(now))
                firing = self.engine.firing()
            for tr in transitions:
                a = tr.alert
                labels = dict(a.labels)
                log.info("alert pending ended without firing" if tr.state == INACTIVE else f"alert {tr.state}", extra=fields(
                    alert=a.alertname, state=tr.state, target=a.target, namespace=labels.get("namespace"), model=a.model,
                    cause=labels.get("cause"), version=a.version))
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

    def reload(self, config: Config, refresh: bool = True) -> None:
        """New targets, timings or rules: histories of kept targets survive. Reloads are
        serialized; a poll in flight of a kept target finishes against its Track; discovery then refreshes under no lock."""
        with self.reload_lock:
            self.config = config
            self._install(config)
            self._publish_engine()
        if refresh and self.scheduler.running:
            self.discover(self.reload_discovery_budget)

    def start(self) -> None:
        """The first discovery refresh is a job like the others: a slow discovery source
        never delays start-up (readiness waits for it instead)."""
        if self.reader is None:
            log.info(SCRAPED_SINCE_START)
        self.scheduler.start()

    def _tracked(self, job: Callable[[], None]) -> Callable[[], None]:
        """A job counted busy while it runs (stop() waits for it) and timed as its task."""
        task = getattr(job, "__name__", "job")  # as its scheduler job is named

        def run() -> None:
            with self._idle:
                self._busy += 1
            self.tasks.started(task, time.monotonic())
            try:
                job()
            finally:
                self.tasks.ended(task, time.monotonic())
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()
        run.__name__ = run.__qualname__ = task
        return run

    def _publish_tasks(self) -> None:
        self.state.update(tasks=MappingProxyType(self.tasks.stats()))

    def stop(self, timeout: float = 2.0) -> bool:
        """No new poll or job starts; those running get `timeout` seconds to finish (a poll
        is bounded by its scrape deadline, which may be longer: SIGTERM does not wait for it).
        False when one is still running: the process must then leave without joining it."""
        deadline = time.monotonic() + timeout
        if self.discovery is not None:
            self.discovery.close()  # first: a refresh in flight ends now, not at its deadline
        if self.reader is not None:
            self.reader.close()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        self.dispatcher.close()
        polls_done = self.dispatcher.wait_idle(timeout)
        with self._idle:
            idle = self._idle.wait_for(lambda: self._busy <= 0, max(0.0, deadline - time.monotonic())) and polls_done
            if not idle:
                log.warning("stopping with %d poll(s) and %d refresh(es) or evaluation(s) still waiting on their peers",
                            self.dispatcher.running, self._busy)
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

