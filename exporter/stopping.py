"""How every long-running command (run, demo, record, simulate) learns to stop: SIGTERM and SIGINT set one event."""
from __future__ import annotations

import signal
import threading
from typing import Callable


def stop_event(on_signal: Callable[[], None] | None = None) -> threading.Event:
    """An event SIGTERM or SIGINT sets; `on_signal` runs in the handler too, so it must
    not block (hand slow work to a thread: the handler may interrupt one holding a lock)."""
    stop = threading.Event()

    def handler(*_) -> None:
        stop.set()
        if on_signal is not None:
            on_signal()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
