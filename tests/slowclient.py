"""Misbehaving HTTP clients for the server's tests: connections that stay silent, and
slowloris connections that send a request head one line at a time. Every socket is
bounded (a timeout on each call, a cap on lines sent) and closed on exit."""
from __future__ import annotations

import socket
import threading
import time


class Silent:
    """`count` TCP connections to 127.0.0.1:`port` that never send a byte."""

    def __init__(self, port: int, count: int):
        self.port, self.count = port, count
        self.sockets: list[socket.socket] = []

    def __enter__(self) -> "Silent":
        for _ in range(self.count):
            self.sockets.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))
        return self

    def __exit__(self, *exc) -> None:
        for s in self.sockets:
            s.close()


class Dripping:
    """`count` connections that each send a request line, then one header line every
    `interval` seconds, never ending the head (at most `max_lines` lines). `dropped`
    counts the connections the server ended, `seconds_held` how long each was kept."""

    def __init__(self, port: int, count: int, interval: float, max_lines: int = 40, first: bytes = b"GET /metrics HTTP/1.1\r\n"):
        self.port, self.count, self.interval, self.max_lines, self.first = port, count, interval, max_lines, first
        self.seconds_held: list[float] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._started = threading.Barrier(count + 1, timeout=10)

    def __enter__(self) -> "Dripping":
        for i in range(self.count):
            t = threading.Thread(target=self._drip, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        self._started.wait()  # every connection has sent its first line
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    @property
    def dropped(self) -> int:
        with self._lock:
            return len(self.seconds_held)

    def _drip(self, i: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(self.first)
                started = time.monotonic()
                self._started.wait()
                for line in range(self.max_lines):
                    if self._stop.wait(self.interval):
                        return
                    try:
                        s.sendall(f"X-Drip-{line}: {i}\r\n".encode())
                        s.settimeout(0.001)
                        s.recv(1024)  # an answer (an error page) or the end: either way the server is done with us
                    except socket.timeout:
                        continue  # still open, nothing said: drip on
                    except OSError:
                        pass
                    finally:
                        s.settimeout(5)
                    with self._lock:
                        self.seconds_held.append(time.monotonic() - started)
                    return
        except threading.BrokenBarrierError:
            return
