"""When each target is polled, and on which thread: one heap of due polls, one dispatching
job, two bounded pools.

A job per target costs the scheduler's bookkeeping on every poll and lets a few dead
targets starve the rest; here one APScheduler job (`Poller` runs it every tick) takes
the polls that are due from a heap and hands them to a pool:

- the *steady* lane runs the polls of targets whose last poll answered in time;
- the *probation* lane runs those never polled yet and those whose last poll was slow
  (it timed out or took more than half the interval). It has few workers: however many
  targets hang, they hold only these, and a healthy target keeps its cadence beside them.
  A new target waits for a worker there (its first poll is never skipped); a slow one is
  skipped while the slow ones already fill the lane.

A target has at most one poll queued or running. A poll that comes due while the last
one still runs (or while the probation lane is full) is skipped and counted
(prefixcache_skipped_polls_total); the log says so once when a target starts being
skipped and once when it polls on time again (three times in a row), not once a poll. Pools grow and shrink
with the number of targets (`resize`, on every change of the target list). A target
keeps its phase across reloads; a new one starts at once.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from typing import Callable

from ..logfields import fields

log = logging.getLogger(__name__)

STEADY, PROBATION = "steady", "probation"
SLOW_FRACTION = 0.5  # a poll longer than this share of the interval puts its target on probation


def steady_workers(targets: int) -> int:
    """Threads for the targets that answer: each waits on the network a few ms a poll, so
    14 carry a thousand targets at 5 s; more only take turns at the GIL, and a render of
    /metrics waiting behind dozens of busy threads waits dozens of times as long."""
    return max(4, min(16, 4 + targets // 100))


def probation_workers(targets: int) -> int:
    """Threads that new and slow targets may hold at once, whatever their number."""
    return max(2, min(8, 2 + targets // 200))


ON_TIME_AGAIN = 3  # polls dispatched on time in a row before a skipping target is said to be back


class _Lane:
    """A FIFO of polls and the daemon threads that run them (daemons: SIGTERM never
    joins a thread that waits on a peer; Poller.stop bounds its own wait)."""

    def __init__(self, name: str, run: Callable[["Entry"], None]):
        self.name = name
        self.run = run
        self.queue: deque[Entry] = deque()
        self.cond = threading.Condition()
        self.wanted = 0  # threads this lane should have
        self.threads = 0  # threads alive
        self.busy = 0  # polls running
        self.closed = False

    def resize(self, workers: int) -> None:
        with self.cond:
            self.wanted = workers
            while self.threads < self.wanted and not self.closed:
                self.threads += 1
                threading.Thread(target=self._work, name=f"poll-{self.name}", daemon=True).start()
            self.cond.notify_all()  # surplus threads leave once idle

    def load(self) -> int:
        with self.cond:
            return self.busy + len(self.queue)

    def submit(self, entry: "Entry") -> None:
        with self.cond:
            self.queue.append(entry)
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.queue.clear()
            self.cond.notify_all()

    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed and self.threads <= self.wanted:
                    self.cond.wait()
                if self.closed or self.threads > self.wanted:
                    self.threads -= 1
                    return
                entry = self.queue.popleft()
                self.busy += 1
            try:
                self.run(entry)
            finally:
                with self.cond:
                    self.busy -= 1


class Entry:
    """One target's place in the schedule."""

    __slots__ = ("name", "poll", "interval", "due", "offset", "seq", "in_flight", "running", "slow", "polled", "skipped",
                 "skipping", "on_time")

    def __init__(self, name: str, poll: Callable[[], tuple[float, bool]], interval: float, due: float, offset: float = 0.0):
        self.name = name
        self.poll = poll  # runs one poll; returns how long it took and whether the target was too slow to answer
        self.interval = interval
        self.due = due
        self.offset = offset  # added once, after the first poll: targets that came together spread out
        self.seq = 0  # the heap holds (due, seq, name); an entry whose seq moved on is stale
        self.in_flight = False  # queued or running
        self.running = False
        self.slow = False
        self.polled = False
        self.skipped = 0
        self.skipping = False
        self.on_time = 0  # polls dispatched on time since the last skip


class Dispatcher:
    """The schedule of every target's polls (see the module's doc). `dispatch()` is the
    one scheduler job; `clock` is monotonic time (a wall clock stepping back must not
    stall every poll)."""

    def __init__(self, on_skips: Callable[[dict[str, int]], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.on_skips = on_skips
        self.lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count(1)
        self.lanes = {STEADY: _Lane(STEADY, self._run), PROBATION: _Lane(PROBATION, self._run)}
        self._skips_published: dict[str, int] = {}
        self.idle = threading.Condition()
        self.running = 0

    # --- the target list ---------------------------------------------------------------
    def set(self, name: str, poll: Callable[[], tuple[float, bool]], interval: float, jitter: float = 0.0) -> None:
        """Schedule `name` (new: due now, then its later polls spread over `jitter` seconds)
        or change its poll and interval (kept: its phase stays, or moves closer when the
        interval shrank)."""
        now = self.clock()
        with self.lock:
            entry = self.entries.get(name)
            if entry is None:
                offset = (hash(name) % 1000) / 1000 * jitter if jitter else 0.0
                entry = self.entries[name] = Entry(name, poll, interval, now, offset)
            else:
                entry.poll = poll
                if interval != entry.interval:
                    entry.due = min(entry.due, now + interval)
                    entry.interval = interval
                else:
                    return
            self._push(entry)

    def remove(self, name: str) -> None:
        with self.lock:
            self.entries.pop(name, None)  # its heap items go stale
            self._skips_published.pop(name, None)

    def resize(self) -> None:
        n = len(self.entries)
        self.lanes[STEADY].resize(steady_workers(n))
        self.lanes[PROBATION].resize(probation_workers(n))

    def _push(self, entry: Entry) -> None:
        entry.seq = next(self._seq)
        heapq.heappush(self.heap, (entry.due, entry.seq, entry.name))

    # --- the job -----------------------------------------------------------------------
    def dispatch(self) -> float | None:
        """Hand every due poll to its lane; -> when the next one is due (monotonic)."""
        now = self.clock()
        skips: dict[str, int] = {}
        with self.lock:
            while self.heap and self.heap[0][0] <= now:
                _, seq, name = heapq.heappop(self.heap)
                entry = self.entries.get(name)
                if entry is None or entry.seq != seq:
                    continue
                # the next poll keeps the phase; a dispatcher that fell behind skips ahead, never bursts
                missed = int((now - entry.due) // entry.interval)
                entry.due += entry.interval * (missed + 1) + entry.offset
                entry.offset = 0.0
                self._push(entry)
                lane = self.lanes[PROBATION if entry.slow or not entry.polled else STEADY]
                # a new target waits its turn; a known-slow one is skipped while the slow ones fill the lane
                if entry.in_flight or (entry.slow and lane.name == PROBATION and lane.load() >= lane.wanted):
                    entry.skipped += 1
                    entry.on_time = 0
                    skips[name] = entry.skipped
                    if not entry.skipping and (entry.polled or entry.running):  # one still queued at start: counted only
                        entry.skipping = True
                        log.warning("polls are skipped: %s (counted in prefixcache_skipped_polls_total; "
                                    "said again once it polls on time)",
                                    "its last poll is still running" if entry.in_flight else
                                    "every worker for slow and new targets is busy", extra=fields(target=name))
                    continue
                entry.on_time += 1
                if entry.skipping and entry.on_time >= ON_TIME_AGAIN:  # not at every flap of a target on the edge
                    entry.skipping = False
                    log.info("polls on time again", extra=fields(target=name))
                entry.in_flight = True
                lane.submit(entry)
            following = self.heap[0][0] if self.heap else None
        if skips and self.on_skips is not None:
            self.on_skips(skips)
        return following

    def _run(self, entry: Entry) -> None:
        entry.running = True
        with self.idle:
            self.running += 1
        try:
            took, slow = entry.poll()
        except Exception:  # noqa: BLE001 - TargetPoller.poll never raises; a bug here must not kill the worker
            log.exception("poll failed", extra=fields(target=entry.name))
            took, slow = 0.0, True
        finally:
            with self.idle:
                self.running -= 1
                self.idle.notify_all()
        with self.lock:
            entry.in_flight = entry.running = False
            entry.polled = True
            entry.slow = slow or took > SLOW_FRACTION * entry.interval

    def skips(self) -> dict[str, int]:
        with self.lock:
            return {name: e.skipped for name, e in self.entries.items() if e.skipped}

    def wait_idle(self, timeout: float) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.running <= 0, timeout)

    def close(self) -> None:
        for lane in self.lanes.values():
            lane.close()


def dispatch_tick(poll_interval: float) -> float:
    """How often the dispatching job looks for due polls: a poll starts at most this late."""
    return max(0.01, min(0.1, poll_interval / 20))
