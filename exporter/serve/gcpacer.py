"""The cycle collector's collections moved to moments when no one is scraping.

A collection holds the interpreter lock from start to end: at 200 targets a young one
took 15-60 ms and a full one 65-100 ms, and a burst of scrapers that came meanwhile
waited for all of it (the bursts whose every answer took 100 ms and more). The pacer
looks every `every` seconds and runs the collection the collector would run next:
right after a scrape (it paused `quiet` seconds ago, not more than `window` more), once
the young generation is `share` of the way to its threshold, since the next scrape of
scrapers that come every few seconds is then furthest off; at any other moment without
scrapes, once it is `late_share` of the way (a collection at a random moment lands in
the next burst now and then). A full collection it leaves to the collector: whether one
runs depends on how many long-lived objects are pending (CPython skips it under a
quarter of them), which Python does not show. The automatic collector stays on behind it
with the same thresholds: a pacer that finds no pause, or stops, leaves the collections
as they were. Where the collector is off when it looks (a Prometheus read decoding its
answer) it collects nothing. Only for CPython's generational collector (before 3.14,
whose incremental collector counts otherwise): `supported()`.
"""
from __future__ import annotations

import gc
import logging
import sys
import threading
from typing import Callable, Sequence

log = logging.getLogger(__name__)


def supported() -> bool:
    return sys.implementation.name == "cpython" and sys.version_info < (3, 14)


def generation_due(counts: Sequence[int], thresholds: Sequence[int], share: float) -> int | None:
    """The generation to collect now (the oldest whose count is past its threshold, as the
    collector picks), or None while the young one is under `share` of its threshold, and
    None where a full collection may be due (the collector's choice, see above).
    Counts and thresholds are gc.get_count() and gc.get_threshold()."""
    if thresholds[0] <= 0 or counts[0] < share * thresholds[0] or counts[-1] > thresholds[-1]:
        return None
    for generation in range(len(counts) - 2, 0, -1):
        if counts[generation] > thresholds[generation]:
            return generation
    return 0


class CollectionPacer:
    def __init__(self, quiet_for: Callable[[], float], quiet: float = 0.02, every: float = 0.05, share: float = 0.5,
                 window: float = 0.1, late_share: float = 0.9,
                 collect: Callable[[int], int] = gc.collect, counts: Callable[[], tuple] = gc.get_count,
                 thresholds: Callable[[], tuple] = gc.get_threshold, enabled: Callable[[], bool] = gc.isenabled):
        self.quiet_for = quiet_for  # seconds since the last scrape
        self.quiet, self.every, self.share, self.window, self.late_share = quiet, every, share, window, late_share
        self._collect, self._counts, self._thresholds, self._enabled = collect, counts, thresholds, enabled
        self.collections = 0  # run by the pacer, for tests
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> int | None:
        """One look: the generation collected, or None."""
        quiet_for = self.quiet_for()
        if not self._enabled() or quiet_for < self.quiet:
            return None
        share = self.share if quiet_for <= self.quiet + self.window else self.late_share
        generation = generation_due(self._counts(), self._thresholds(), share)
        if generation is not None:
            self._collect(generation)
            self.collections += 1
        return generation

    def start(self) -> "CollectionPacer":
        self._thread = threading.Thread(target=self._run, name="gc-pacer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the automatic collector carries on alone
                log.exception("gc pacer failed; the collector runs on its own from now")
                return
