"""Every Alertmanager behind a name, as Prometheus finds them with `dns_sd_configs` of type A
on a headless Service (prometheus/prometheus discovery/dns): each address of the name is an
Alertmanager of its own, on the URL's port, and gets every alert.

An HA Alertmanager (kube-prometheus-stack runs two or three behind the headless
`alertmanager-operated`) dedupes what its replicas receive; one that gets only some of the
alerts cannot. A URL whose host is an IP address is one Alertmanager, as before.

The semantics of Prometheus's refresh: the name's IPv4 addresses (type A; a name with none
gets its IPv6 ones, type AAAA), re-resolved every `refresh_interval`; an authoritative "no
such name" or "no address" empties the list, any other failure keeps the last one. The
resolver's answer is awaited at most `timeout` on a thread of its own, never on a send and
never by a stop: a resolver that hangs costs that name's refresh, and no second lookup of
the name starts while one still hangs.
"""
from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

MAX_ADDRESSES = 16  # per name: more is a misconfigured name, not an Alertmanager cluster


class ResolveError(Exception):
    """No answer to trust (a timeout, SERVFAIL, no resolver): keep the last addresses."""


Lookup = Callable[[str, int], list[str]]


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def lookup(host: str, port: int) -> list[str]:
    """The addresses of `host` from the system resolver: IPv4 ones, else IPv6 ones; [] when
    the name authoritatively has none. ResolveError on any other failure."""
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []  # NXDOMAIN, or a name without an address: believed, as Prometheus does
        raise ResolveError(f"cannot resolve {host}: {exc.strerror or exc}") from None
    except (OSError, UnicodeError) as exc:
        raise ResolveError(f"cannot resolve {host}: {exc}") from None
    v4 = [info[4][0] for info in infos if info[0] == socket.AF_INET]
    v6 = [info[4][0] for info in infos if info[0] == socket.AF_INET6]
    return v4 or v6


def ordered(addresses: list[str]) -> list[str]:
    """Distinct addresses in numeric order, at most MAX_ADDRESSES: the same ones every refresh."""
    unique = {ipaddress.ip_address(a.split("%")[0]) for a in addresses if is_address(a.split("%")[0])}
    return [str(a) for a in sorted(unique, key=lambda a: (a.version, int(a)))][:MAX_ADDRESSES]


def url_for(url: str, address: str) -> str:
    """`url` with its host replaced by `address` (user info and port kept): one Alertmanager's URL."""
    parts = urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + host + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class BoundedLookup:
    """`lookup(host, port)` awaited at most `timeout` seconds on a daemon thread; a lookup
    still running from an earlier call is not started twice (ResolveError until it ends)."""

    def __init__(self, resolve: Lookup, timeout: float):
        self.resolve = resolve
        self.timeout = timeout
        self._lock = threading.Lock()
        self._running: set[str] = set()

    def __call__(self, host: str, port: int) -> list[str]:
        with self._lock:
            if host in self._running:
                raise ResolveError(f"cannot resolve {host}: the previous lookup has not answered yet")
            self._running.add(host)
        box: dict = {}

        def work() -> None:
            try:
                box["addresses"] = self.resolve(host, port)
            except ResolveError as exc:
                box["error"] = exc
            except Exception as exc:  # noqa: BLE001 - a resolver's bug is this name's failure, not the thread's
                box["error"] = ResolveError(f"cannot resolve {host}: {type(exc).__name__}: {exc}")
            finally:
                with self._lock:
                    self._running.discard(host)

        worker = threading.Thread(target=work, name=f"resolve {host}", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            raise ResolveError(f"cannot resolve {host}: no answer within {self.timeout:g}s")
        if "error" in box:
            raise box["error"]
        return box["addresses"]
