"""Memory the process freed given back to the system, between scrapes.

glibc gives back only the top of its heap when memory is freed: what is freed below it
stays in the process's RSS, to be reused. A sidecar that reads 10,000 pods from
Prometheus decodes some 120 MB of answers every 15 s and renews every target's history
arrays as they are thinned; the holes those leave behind were about a tenth of what it
held (in-process, 1,000 targets with an hour of history: 78 KiB a target of RSS, 68 after
malloc_trim), and an orchestrator kills a pod by its RSS, not by what Python uses. The
trimmer calls malloc_trim(0) every `every` seconds, at a moment no one is scraping (it
locks the heap while it walks it: a millisecond at 80 MB). Where the C library has no
malloc_trim (musl, macOS) it does nothing: `trim_function()` is None.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


def trim_function() -> Callable[[], int] | None:
    """glibc's malloc_trim(0), or None where the process's C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class HeapTrimmer:
    def __init__(self, quiet_for: Callable[[], float], trim: Callable[[], int], every: float = 30.0,
                 quiet: float = 0.02, look: float = 0.05):
        self.quiet_for = quiet_for  # seconds since the last scrape
        self._trim = trim
        self.every, self.quiet, self.look = every, quiet, look
        self.trims = 0  # for tests
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> bool:
        """One trim if no one is scraping; whether it trimmed."""
        if self.quiet_for() < self.quiet:
            return False
        self._trim_now()
        return True

    def _trim_now(self) -> None:
        self._trim()
        self.trims += 1

    def start(self) -> "HeapTrimmer":
        self._thread = threading.Thread(target=self._run, name="heap-trim", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every):
                # a trim waits for a pause in the scrapes, at most one interval: then it trims anyway
                for _ in range(max(1, int(self.every / self.look))):
                    if self.step() or self._stop.wait(self.look):
                        break
                else:
                    self._trim_now()
        except Exception:  # noqa: BLE001 - memory stays as it is; the process carries on
            log.exception("heap trim failed; memory freed is no longer given back")
