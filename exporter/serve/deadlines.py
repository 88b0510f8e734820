"""The HTTP server's deadlines (exporter/serve/server.py): one thread that shuts down the
socket of each connection whose request, or answer, is not done by its deadline."""
from __future__ import annotations

import _socket
import socket
import threading
import time


class Deadlines:
    """One thread that ends the connections whose request is not in by its deadline:
    shutting the socket down wakes whoever waits on it (the selector, or a worker blocked
    reading it), whatever the read is (a handshake, a header line, the body)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._stopped = False
        self._until = float("inf")  # no deadline later than this (cap)
        self._thread = threading.Thread(target=self._run, name="http-deadlines", daemon=True)
        self._thread.start()

    def arm(self, key: int, sock: socket.socket, seconds: float) -> None:
        with self._cond:
            self._armed[key] = (min(self.clock() + seconds, self._until), sock)
            self._cond.notify()

    def cap(self, seconds: float) -> None:
        """Every deadline, those armed later too, at most `seconds` from now (a stop)."""
        with self._cond:
            self._until = self.clock() + seconds
            self._armed = {k: (min(d, self._until), sock) for k, (d, sock) in self._armed.items()}
            self._cond.notify()

    def armed(self, key: int) -> bool:
        with self._cond:
            return key in self._armed

    def disarm(self, key: int) -> None:
        # under the lock: once this returns the reaper never touches the socket again,
        # so it cannot shut down a later connection that reuses the file descriptor
        with self._cond:
            self._armed.pop(key, None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(2.0)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = self.clock()
                for key in [k for k, (deadline, _) in self._armed.items() if deadline <= now]:
                    _, sock = self._armed.pop(key)
                    try:
                        # the plain socket's shutdown, also under TLS: SSLSocket.shutdown
                        # would tear down the TLS object another thread is reading with
                        _socket.socket.shutdown(sock, socket.SHUT_RDWR)
                    except OSError:
                        pass
                wake = min((d for d, _ in self._armed.values()), default=now + 3600.0)
                self._cond.wait(max(0.0, wake - now))
