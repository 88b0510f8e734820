"""How every long-running command (run, demo, record, simulate) learns to stop, and the
sidecar to reload: a signal's handler only writes a byte to a pipe, and a thread of its own
does the work.

A handler runs in the main thread between two bytecodes, also in the middle of another
handler: one that set a threading.Event took that event's lock, and a second signal
arriving while the first held it waited for it forever (a storm of SIGHUPs left the
process deaf to SIGTERM: 20 times in 20 with 3,000 signals). os.write takes no lock."""
from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Callable

log = logging.getLogger(__name__)


def on_signals(signums: tuple[int, ...], action: Callable[[], None], name: str) -> None:
    """`action` on a thread named `name`, once for the signals that came since it last
    began: signals that arrive while it runs make one more run after it, whatever their
    number. An exception in `action` is its own to report: the thread goes on."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)

    def handler(*_) -> None:
        try:
            os.write(wake_write, b"\0")
        except BlockingIOError:  # the pipe is full: a run is asked for already
            pass

    def loop() -> None:
        while True:
            os.read(wake_read, 65536)  # every byte written so far: one run for all of them
            try:
                action()
            except Exception:  # noqa: BLE001 - a bug in one run must not end the runs
                log.exception("%s failed", name)

    threading.Thread(target=loop, name=name, daemon=True).start()
    for signum in signums:
        signal.signal(signum, handler)


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
