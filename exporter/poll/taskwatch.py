"""The sidecar's own periodic tasks watched: reading the Prometheus source (`read`),
evaluating the rules (`evaluate`), refreshing discovery (`discover`).

Each runs as one APScheduler job with max_instances 1: a run that comes due while the
last one still runs is not started (a 10,000-pod read whose queries Prometheus answers in
13 s, beside our 4 s of feeding them, outlasts a 15 s interval now and then). The
scheduler said so itself, one warning a missed run, and counted it nowhere. Here each
missed run is counted (prefixcache_task_runs_missed_total, as Prometheus counts the
missed iterations of its rule groups), each run's duration kept, and the log says once
when a task falls behind and once when it keeps its interval again (ON_TIME_AGAIN runs
in a row with none missed), not once a miss. The misses of a task's first run are
counted only: at 10,000 pods the first read, which reaches 5 minutes back, outlasts the
interval at every start. Nothing is lost meanwhile: the next read
reaches back to the last one, and the rules judge what the windows hold then."""
from __future__ import annotations

import logging
import threading
import time

from apscheduler.events import EVENT_JOB_MAX_INSTANCES

from ..serve.state import TASKS, TaskStats
from .dispatch import ON_TIME_AGAIN

log = logging.getLogger(__name__)


class TaskWatch:
    """Thread-safe: runs end on their executors' threads, misses are told on the
    scheduler's. `changed` is called after every change, one call at a time (under a lock
    of its own, not the one of the counts): two threads that each read the counts and
    published them could publish the older after the newer, and an exported counter would
    go back (a false reset to increase())."""

    def __init__(self, changed=lambda: None) -> None:
        self._lock = threading.Lock()
        self._stats: dict[str, TaskStats] = {}
        self._started: dict[str, float] = {}  # task -> when its running run started (monotonic)
        self._on_time: dict[str, int] = {}  # task -> runs ended with none missed during them, in a row
        self._missed_during: set[str] = set()  # tasks that missed a run while the current one ran
        self._straddling: set[str] = set()  # tasks whose job a reload replaced while a run of it ran
        self.changed = changed
        self._telling = threading.Lock()

    def _tell(self) -> None:
        with self._telling:
            self.changed()

    def watch(self, scheduler) -> None:
        """Told of the runs `scheduler` misses (its jobs are named after their tasks), in
        place of its own warning at each."""
        scheduler.add_listener(lambda event: self.missed(event.job_id, time.monotonic()), EVENT_JOB_MAX_INSTANCES)
        logging.getLogger("apscheduler.scheduler").addFilter(_MISSES_COUNTED)

    def expect(self, task: str, interval: float) -> None:
        """A task now due every `interval` seconds (its counts carry on across reloads). Called
        before its job is (re)scheduled: the new job's first run, due at once, finds a run of
        the old one still running, which is no sign of falling behind."""
        with self._lock:
            if task in self._started:
                self._straddling.add(task)
            old = self._stats.get(task)
            self._stats[task] = TaskStats(interval) if old is None else TaskStats(interval, old.runs, old.missed,
                                                                                   old.last_seconds, old.behind)
        self._tell()

    def forget(self, task: str) -> None:
        """A task no longer scheduled (the Prometheus source or discovery configured away)."""
        with self._lock:
            for known in (self._stats, self._started, self._on_time):
                known.pop(task, None)
            self._missed_during.discard(task)
            self._straddling.discard(task)
        self._tell()

    def started(self, task: str, at: float) -> None:
        with self._lock:
            self._started[task] = at
            self._missed_during.discard(task)
            self._straddling.discard(task)

    def ended(self, task: str, at: float) -> None:
        with self._lock:
            stats = self._stats.get(task)
            began = self._started.pop(task, None)
            if stats is None or began is None:
                return
            on_time = 0 if task in self._missed_during else self._on_time.get(task, 0) + 1
            self._on_time[task] = on_time
            back = stats.behind and on_time >= ON_TIME_AGAIN
            self._stats[task] = TaskStats(stats.interval, stats.runs + 1, stats.missed, at - began, stats.behind and not back)
        if back:
            log.info("%s keeps its %gs interval again (%d run(s) missed in all)", _doing(task), stats.interval, stats.missed)
        self._tell()

    def missed(self, task: str, at: float) -> None:
        """A run of the task came due while the last one still ran, and was not started.
        The scheduler wakes at each run's due time and tells each; one that woke late, past
        several (a starved scheduler thread), coalesces them and tells one: a lower bound."""
        with self._lock:
            stats = self._stats.get(task)
            if stats is None:
                return
            self._missed_during.add(task)
            self._on_time[task] = 0
            # a first run reaches further back (a read: 5 minutes of samples) and outlasts the interval at
            # fleet size at every start: its misses are counted, but they are not falling behind
            # likewise a run of a job a reload replaced, which the new job's first run waits for
            quiet = stats.runs == 0 or task in self._straddling
            self._stats[task] = TaskStats(stats.interval, stats.runs, stats.missed + 1, stats.last_seconds, stats.behind or not quiet)
            began = self._started.get(task)
        if not stats.behind and not quiet:
            running = f"its run started {at - began:.1f}s ago still runs" if began is not None else "its last run still ran"
            took = f" (the one before took {stats.last_seconds:.1f}s)" if stats.last_seconds is not None else ""
            log.warning("%s falls behind its %gs interval: %s%s; the runs due meanwhile are not started (counted in "
                        "prefixcache_task_runs_missed_total; said again once it keeps its interval)",
                        _doing(task), stats.interval, running, took)
        self._tell()

    def stats(self) -> dict[str, TaskStats]:
        with self._lock:
            return dict(self._stats)


def _doing(task: str) -> str:
    doing = TASKS.get(task, task)
    return doing[:1].upper() + doing[1:]


class _SchedulerMisses(logging.Filter):
    """APScheduler's warning at every run it did not start because the last still ran."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith('Execution of job "%s" skipped: maximum number of running instances')


_MISSES_COUNTED = _SchedulerMisses()
