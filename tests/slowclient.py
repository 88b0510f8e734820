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


class Holding:
    """`count` clients that each connect, send `first` (part of a request: a head without
    its end, a head without its body, 5 bytes of a TLS ClientHello) and hold the
    connection until the server drops it, then connect again, as an attacker would. With
    `tls` (a client context) each shakes hands first. Bounded: each client connects at
    most `max_connects` times and stops after `seconds`; every socket has a timeout.
    `connects` counts connections made, `drops` those the server ended."""

    def __init__(self, port: int, count: int, first: bytes, tls=None, seconds: float = 30.0, max_connects: int = 10):
        self.port, self.count, self.first, self.tls = port, count, first, tls
        self.seconds, self.max_connects = seconds, max_connects
        self.connects = self.drops = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> "Holding":
        self._until = time.monotonic() + self.seconds
        for _ in range(self.count):
            t = threading.Thread(target=self._hold, daemon=True)
            t.start()
            self._threads.append(t)
        deadline = time.monotonic() + 5
        while self.connects < self.count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _hold(self) -> None:
        for _ in range(self.max_connects):
            if self._stop.is_set() or time.monotonic() > self._until:
                return
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw:
                    sock = self.tls.wrap_socket(raw, server_hostname="127.0.0.1") if self.tls is not None else raw
                    sock.sendall(self.first)
                    with self._lock:
                        self.connects += 1
                    sock.settimeout(0.2)
                    while not self._stop.is_set() and time.monotonic() < self._until:
                        try:
                            if not sock.recv(4096):
                                break
                        except socket.timeout:
                            continue
                    else:
                        return  # our time is up, not the server's doing
                with self._lock:
                    self.drops += 1
            except OSError:  # refused, reset: the server ended it
                with self._lock:
                    self.drops += 1
                self._stop.wait(0.05)
