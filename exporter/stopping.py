"""How every long-running command (run, demo, record, simulate) learns to stop, and the
sidecar to reload: a signal only writes a byte to a pipe, and a thread of its own does the
work.

A handler runs in the main thread between two bytecodes, also in the middle of another
handler: one that set a threading.Event took that event's lock, and a second signal
arriving while the first held it waited for it forever (a storm of SIGHUPs left the
process deaf to SIGTERM: 20 times in 20 with 3,000 signals). os.write takes no lock.

The kernel hands a signal sent to the process to any thread that does not block it, and
a Python handler runs only when the main thread next runs bytecode: one handed to a poll
thread while the main thread waits on an event ran at the next SIGTERM, so a SIGHUP could
reload nothing until the process stopped. The byte is therefore written by the
interpreter's C-level handler, on whichever thread took the signal, to the process's
wakeup fd (signal.set_wakeup_fd); a relay thread reads the signal numbers there.

Before `run` gets to install its handlers (imports, config, bind: about 0.35 s), SIGHUP's
default action ended the process (exit 129, no log line), and SIGUSR1 and SIGUSR2 always
did: the entry point holds them from its first line (hold_startup_signals), a SIGHUP held
makes one reload once the reload handler is in place, and the sidecar ignores SIGUSR1 and
SIGUSR2 with a log line, as Go exporters do."""
from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from typing import Callable

log = logging.getLogger(__name__)


# SIGHUP asks a reload, SIGUSR1 and SIGUSR2 nothing: neither may end the process as it starts
STARTUP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGUSR1", "SIGUSR2") if hasattr(signal, name))
_held: set[int] = set()  # the signals hold_startup_signals took over and no handler has claimed since
_came_early: set[int] = set()  # of those, the ones that came; set.add in a handler takes no lock


def _note_early(signum, _frame) -> None:
    _came_early.add(signum)


def hold_startup_signals() -> None:
    """The entry point's first call, before the imports: STARTUP_SIGNALS are noted instead
    of ending the process, until on_signals or ignore_signals claims them (the sidecar) or
    release_startup_signals gives them back their default (the other commands)."""
    for signum in STARTUP_SIGNALS:
        signal.signal(signum, _note_early)
        _held.add(signum)


def release_startup_signals() -> None:
    """The default actions back for the signals still held, and one that came while they
    were held is delivered now: a command with no use for them ends on them as it did."""
    for signum in sorted(_held):
        signal.signal(signum, signal.SIG_DFL)
        _held.discard(signum)
        if signum in _came_early:
            _came_early.discard(signum)
            os.kill(os.getpid(), signum)


def _claim(signum: int) -> bool:
    """Takes `signum` out of the held ones (its handler is set already): whether it came while held."""
    _held.discard(signum)
    came = signum in _came_early
    _came_early.discard(signum)
    return came


class _Relay:
    """The process's wakeup fd and the thread that hands each signal number written to it
    to the pipes of the actions that wait for it (non-blocking: a full pipe already asks
    for a run)."""

    def __init__(self) -> None:
        self.wakes: dict[int, tuple[int, ...]] = {}  # replaced whole: the relay thread reads it unlocked
        self.ignored: frozenset[int] = frozenset()  # replaced whole, as wakes
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)  # the main thread's call; raises elsewhere
        threading.Thread(target=self._relay, args=(read,), name="signals", daemon=True).start()

    def add(self, signum: int, wake_write: int) -> None:
        self.wakes = {**self.wakes, signum: self.wakes.get(signum, ()) + (wake_write,)}

    def _relay(self, read: int) -> None:
        while True:
            for signum in set(os.read(read, 65536)):
                if signum in self.ignored:  # a thread of its own, not a handler: it may log
                    log.info("ignoring %s", signal.Signals(signum).name)
                for wake in self.wakes.get(signum, ()):
                    try:
                        os.write(wake, b"\0")
                    except BlockingIOError:  # the pipe is full: a run is asked for already
                        pass


@functools.cache
def _process_relay() -> _Relay:
    """One per process, as its wakeup fd."""
    return _Relay()


def _ignore(*_) -> None:
    """The Python-level handler: the C-level one has already written the byte."""


def on_signals(signums: tuple[int, ...], action: Callable[[], None], name: str) -> None:
    """`action` on a thread named `name`, once for the signals that came since it last
    began: signals that arrive while it runs make one more run after it, whatever their
    number. An exception in `action` is its own to report: the thread goes on. Called from
    the main thread (as signal.signal must be)."""
    relay = _process_relay()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)

    def loop() -> None:
        while True:
            os.read(wake_read, 65536)  # every byte written so far: one run for all of them
            try:
                action()
            except Exception:  # noqa: BLE001 - a bug in one run must not end the runs
                log.exception("%s failed", name)

    threading.Thread(target=loop, name=name, daemon=True).start()
    for signum in signums:
        relay.add(signum, wake_write)
        signal.signal(signum, _ignore)
        if _claim(signum):  # it came while the process started: its run is owed
            log.info("%s came while starting: %s runs now", signal.Signals(signum).name, name)
            os.write(wake_write, b"\0")


def ignore_signals(signums: tuple[int, ...]) -> None:
    """Each of `signums` logs a line and does nothing else (their default ends the process);
    called from the main thread, as on_signals."""
    relay = _process_relay()
    relay.ignored = relay.ignored | frozenset(signums)
    for signum in signums:
        signal.signal(signum, _ignore)
        if _claim(signum):
            log.info("ignoring %s (it came while starting)", signal.Signals(signum).name)


def stop_event(on_signal: Callable[[], None] | None = None) -> threading.Event:
    """An event SIGTERM or SIGINT sets; `on_signal` runs after it is set (on the signal
    thread, not in the handler)."""
    stop = threading.Event()

    def stopped() -> None:
        stop.set()
        if on_signal is not None:
            on_signal()

    on_signals((signal.SIGTERM, signal.SIGINT), stopped, "stop-signal")
    return stop
