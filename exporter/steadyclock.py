"""The sidecar's clock: wall-clock seconds that never step back.

The windows, the rules' `for`, the resends to Alertmanager and the cold-start graces all
measure time between two readings of one clock. A wall clock stepped back 10 minutes
(NTP, a VM migration) froze the windows (every poll older than the last was refused)
until it passed its old reading again. This clock goes on at the monotonic clock's pace;
where the wall clock is ahead of it (a step forward, a VM resumed) it follows at once, and
where the wall clock is behind it slews toward it at 1% of the time that passes, so it
never goes back and is never behind the wall clock (an alert's endsAt is never in
Alertmanager's past).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

SLEW = 0.01  # the share of elapsed time by which a clock ahead of the wall clock falls back toward it


class SteadyClock:
    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic):
        self._wall, self._monotonic = wall, monotonic
        self._lock = threading.Lock()
        self._last_mono = monotonic()
        self._last = wall()

    def wall(self) -> float:
        """The wall clock it follows: the clock of samples stamped elsewhere (Prometheus's)."""
        return self._wall()

    def __call__(self) -> float:
        with self._lock:
            mono, wall = self._monotonic(), self._wall()
            elapsed = max(0.0, mono - self._last_mono)
            now = self._last + elapsed
            now = wall if wall >= now else max(wall, now - SLEW * elapsed)
            self._last, self._last_mono = now, mono
            return now
