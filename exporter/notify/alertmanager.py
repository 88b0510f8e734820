"""Delivery of alert states to Alertmanager (API v2), one queue and one sender thread
per Alertmanager, so one that hangs delays only its own alerts. A URL whose host is a name
stands for every Alertmanager behind it, as Prometheus's dns_sd finds them
(exporter/notify/resolve.py): each address is a queue of its own, re-resolved as pods
come and go; a queue that appears gets every firing alert and the recent resolutions.

Each queue holds the latest payload per alert, so an outage of any length loses no
transition: what is pending when the Alertmanager comes back is the current truth, a
resolution included. Firing alerts are re-sent every resend interval with an endsAt a
few intervals ahead, so Alertmanager resolves them by itself if we die. Each POST has
one deadline for its whole answer and a cap on its size; a redirect is a failure (a
sign-in page that answers 200 has not received any alert).
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Sequence
from urllib.parse import urlsplit

from ..alerting.rules_state import FIRING, RESOLVED, Alert, Transition
from ..config.sections import AlertmanagerConfig
from ..peers.http import Endpoint, PeerError, basic_auth, exchange
from ..peers.urls import redact_url
from ..serve.state import QueueStats
from .resolve import BoundedLookup, Lookup, ResolveError, is_address, lookup, ordered, url_for

log = logging.getLogger(__name__)

_BATCH = 500
_MAX_BACKOFF = 30.0
_MAX_ANSWER = 64 * 1024  # Alertmanager answers a POST with nothing or a short error
RESOLVED_RESEND_FOR = 900.0  # as Prometheus: resolved alerts are re-sent for 15 minutes
RESOLVE_TIMEOUT = 5.0  # the longest wait for a name's addresses, off every send


def alert_key(alert: Alert) -> tuple:
    """Alertmanager identifies an alert by its label set, and so does the queue."""
    return tuple(sorted(alert.labels)) or alert.key

def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def payload(alert: Alert, now: float, resend_interval: float, generator_url: str, resolved: bool = False) -> dict:
    ends = alert.resolved_at if resolved and alert.resolved_at is not None else now + 4 * resend_interval
    return {
        "labels": dict(alert.labels),
        "annotations": {k: v for k, v in alert.annotations if v},
        "startsAt": rfc3339(alert.fired_at or alert.active_at or now),
        "endsAt": rfc3339(ends),
        "generatorURL": generator_url,
    }


@dataclass
class _Queue:
    url: str
    pending: "OrderedDict[tuple, dict]" = field(default_factory=OrderedDict)
    queued_at: dict = field(default_factory=dict)  # key -> when a firing alert was last queued (the ticker's time)
    resolved: dict = field(default_factory=dict)  # key -> (payload, resolved at, last queued) for 15 minutes
    failures: int = 0
    retry_at: float = 0.0
    sent: int = 0
    ok: int = 0
    failed: int = 0
    rejected: int = 0
    dropped: int = 0
    last_success: float | None = None
    last_error: str | None = None
    endpoint: Endpoint | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)  # one POST at a time: never one batch twice
    wake: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    name: "_Name | None" = None  # the configured name this queue is an address of
    address: str = ""
    retired: threading.Event = field(default_factory=threading.Event)  # its address left the name


@dataclass
class _Name:
    """A configured URL whose host is a name: the addresses it has now, each a queue."""

    url: str
    host: str
    port: int
    addresses: tuple[str, ...] = ()
    error: str | None = None


class Notifier:
    def __init__(self, cfg: AlertmanagerConfig, generator_url: str, clock: Callable[[], float] = time.time,
                 resolve: Lookup = lookup, ticker: Callable[[], float] | None = None):
        self.cfg = cfg
        self.generator_url = generator_url
        self.clock = clock  # the wall clock: startsAt and endsAt, which Alertmanager compares with its own
        # the resend and retry cadence: a wall clock stepped back 10 minutes (NTP, a VM migration)
        # stopped the resends, and Alertmanager resolved a firing alert at its endsAt; an
        # injected clock (tests, a replay) is its own ticker
        self.ticker = ticker or (time.monotonic if clock is time.time else clock)
        # replaced whole under self.lock, never changed in place: a reader iterates its own copy
        self.queues: list[_Queue] = []
        self.names: list[_Name] = []
        for url in cfg.urls:
            parts = urlsplit(url)
            if is_address(parts.hostname or ""):
                self.queues.append(self._queue(url))
            else:
                self.names.append(_Name(url, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)))
        self.lookup = BoundedLookup(resolve, min(cfg.timeout, RESOLVE_TIMEOUT))
        self.recently_resolved: dict = {}  # key -> (payload, resolved at by the ticker), for queues that appear
        self._resolver: threading.Thread | None = None
        self._started = False
        self.lock = threading.Lock()
        self.headers = {"Content-Type": "application/json"}
        if cfg.username:
            self.headers["Authorization"] = basic_auth(cfg.username, cfg.password)
        if cfg.bearer_token:
            self.headers["Authorization"] = f"Bearer {cfg.bearer_token}"
        self._stop = threading.Event()

    def _queue(self, url: str, name: _Name | None = None, address: str = "") -> _Queue:
        """The queue of one Alertmanager: `url` itself, or the address of a name (connected to
        by address, spoken to, TLS included, by the name)."""
        target = url.rstrip("/") + "/api/v2/alerts"
        q = _Queue(url_for(target, address) if address else target, name=name, address=address)
        q.endpoint = Endpoint(target, self.cfg.ca_file, connect_to=address or None)
        return q

    # --- the names' addresses ------------------------------------------------------------
    def refresh_names(self) -> bool:
        """Resolve every name once (each at most the lookup's timeout); True when an
        Alertmanager came or went. A failure keeps the name's last addresses."""
        changed = False
        for name in self.names:
            try:
                found = tuple(ordered(self.lookup(name.host, name.port)))
            except ResolveError as exc:
                if name.error != str(exc):
                    log.warning("alertmanager %s: %s; keeping its %d address(es)", redact_url(name.url), exc, len(name.addresses))
                name.error = str(exc)
                continue
            name.error = None
            if found != name.addresses:
                log.info("alertmanager %s: %d address(es)%s", redact_url(name.url), len(found), f": {', '.join(found)}" if found else "")
                self._set_addresses(name, found)
                changed = True
        return changed

    def _set_addresses(self, name: _Name, found: tuple[str, ...]) -> None:
        with self.lock:
            gone = [q for q in self.queues if q.name is name and q.address not in found]
            new = [self._queue(name.url, name, a) for a in found if a not in name.addresses]
            for q in new:  # a new Alertmanager learns the recent resolutions; firing alerts come with the next resend
                q.resolved = {key: (body, at, -math.inf) for key, (body, at) in self.recently_resolved.items()}
            self.queues = [q for q in self.queues if q not in gone] + new
            name.addresses = found
            started = self._started
        for q in gone:
            q.retired.set()
            q.wake.set()
        if started:
            for q in new:
                self._start_sender(q)

    def _resolve_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh_names()
            except Exception:  # noqa: BLE001 - the resolver must outlive any bug
                log.exception("resolving the Alertmanagers failed")
            self._stop.wait(self.cfg.refresh_interval)

    def discovered(self) -> int | None:
        """How many Alertmanagers get alerts now; None when none is configured."""
        return len(self.queues) if self.cfg.urls else None

    # --- input, from the evaluation job --------------------------------------------------
    def transitions(self, transitions: Sequence[Transition]) -> None:
        now, tick = self.clock(), self.ticker()
        with self.lock:
            for tr in transitions:
                key = alert_key(tr.alert)
                if tr.state == FIRING:
                    self.recently_resolved.pop(key, None)
                    for q in self.queues:
                        q.resolved.pop(key, None)
                    self._put(key, payload(tr.alert, now, self.cfg.resend_interval, self.generator_url), tick, firing=True)
                elif tr.state == RESOLVED:
                    body = payload(tr.alert, now, self.cfg.resend_interval, self.generator_url, resolved=True)
                    self.recently_resolved[key] = (body, tick)
                    for q in self.queues:
                        q.resolved[key] = (body, tick, tick)
                    self._put(key, body, tick, firing=False)
        self._wake_all()

    def resend(self, firing: Sequence[Alert]) -> None:
        """Queue a fresh copy of every firing alert not queued for a resend interval."""
        now, tick = self.clock(), self.ticker()
        with self.lock:
            for key, (_, resolved_at) in list(self.recently_resolved.items()):
                if tick - resolved_at > RESOLVED_RESEND_FOR:
                    del self.recently_resolved[key]
            for q in self.queues:
                for a in firing:
                    key = alert_key(a)
                    if a.state == FIRING and tick - q.queued_at.get(key, -1e18) >= self.cfg.resend_interval:
                        self._put_one(q, key, payload(a, now, self.cfg.resend_interval, self.generator_url), tick, True)
                for key, (body, resolved_at, queued) in list(q.resolved.items()):
                    if tick - resolved_at > RESOLVED_RESEND_FOR:
                        del q.resolved[key]
                    elif tick - queued >= self.cfg.resend_interval and key not in q.pending:
                        q.resolved[key] = (body, resolved_at, tick)
                        self._put_one(q, key, body, tick, False)
        self._wake_all()

    def _wake_all(self) -> None:
        for q in self.queues:
            q.wake.set()

    def _put(self, key, body: dict, tick: float, firing: bool) -> None:
        for q in self.queues:
            self._put_one(q, key, body, tick, firing)

    def _put_one(self, q: _Queue, key, body: dict, tick: float, firing: bool) -> None:
        q.pending.pop(key, None)
        q.pending[key] = body
        if firing:
            q.queued_at[key] = tick
        else:
            q.queued_at.pop(key, None)
        while len(q.pending) > self.cfg.queue_capacity:
            q.pending.popitem(last=False)
            q.dropped += 1

    # --- delivery ------------------------------------------------------------------------
    def start(self) -> "Notifier":
        with self.lock:
            self._started = True
            queues = list(self.queues)
        for q in queues:
            self._start_sender(q)
        if self.names:
            # the names are resolved on a thread of their own, from now on: neither start-up
            # nor a send nor a stop waits on a resolver (a daemon: SIGTERM never joins it)
            self._resolver = threading.Thread(target=self._resolve_loop, name="alertmanager resolver", daemon=True)
            self._resolver.start()
        return self

    def _start_sender(self, q: _Queue) -> None:
        q.thread = threading.Thread(target=self._run, args=(q,), name=f"alertmanager {redact_url(q.url)}", daemon=True)
        q.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is pending, to every Alertmanager at once, for at most `timeout`
        seconds in all, then stop: one that hangs costs its own alerts, never the others'
        or the shutdown's. A name's lookup in flight is not waited for."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake_all()
        with self.lock:
            queues = list(self.queues)
        flushers = [threading.Thread(target=self._flush, args=(q, deadline), name="alertmanager flush", daemon=True)
                    for q in queues]
        for f in flushers:
            f.start()
        for thread in flushers + [q.thread for q in queues if q.thread is not None]:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _flush(self, q: _Queue, deadline: float) -> None:
        while time.monotonic() < deadline and q.pending and q.failures == 0:
            if not self._deliver_queue(q, deadline):
                return

    def _run(self, q: _Queue) -> None:
        while not self._stop.is_set() and not q.retired.is_set():
            try:
                self._deliver_queue(q, None)
            except Exception:  # noqa: BLE001 - the sender must outlive any bug
                log.exception("alertmanager delivery failed")
            q.wake.wait(0.5)
            q.wake.clear()

    def deliver_once(self, deadline: float | None = None) -> None:
        """One batch to each Alertmanager, one after the other (the threads of start() send
        to each on its own)."""
        for q in list(self.queues):
            self._deliver_queue(q, deadline)

    def _deliver_queue(self, q: _Queue, deadline: float | None) -> bool:
        """False when the send lock was not free before `deadline` (a POST in flight)."""
        wait = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not q.send_lock.acquire(timeout=wait):
            return False
        try:
            self._deliver(q, deadline)
        finally:
            q.send_lock.release()
        return True

    def _deliver(self, q: _Queue, deadline: float | None) -> None:
        with self.lock:
            if not q.pending or self.ticker() < q.retry_at:
                return
            batch = list(q.pending.items())[:_BATCH]
        timeout = self.cfg.timeout if deadline is None else max(0.1, min(self.cfg.timeout, deadline - time.monotonic()))
        error, permanent = self._post(q, [body for _, body in batch], timeout)
        with self.lock:
            if permanent:
                # Alertmanager refused the payload itself (4xx): sending it again cannot
                # succeed and would block every later alert behind it
                for key, body in batch:
                    if q.pending.get(key) is body:
                        del q.pending[key]
                q.rejected += 1
                q.failures = 0
                q.retry_at = 0.0
                q.last_error = error
                log.error("alertmanager %s rejected %d alert(s), dropped them: %s", redact_url(q.url), len(batch), error)
            elif error is None:
                for key, body in batch:
                    if q.pending.get(key) is body:
                        del q.pending[key]
                q.ok += 1
                q.sent += len(batch)
                q.failures = 0
                q.retry_at = 0.0
                q.last_success, q.last_error = self.clock(), None
            else:
                q.failed += 1
                q.failures += 1
                q.retry_at = self.ticker() + min(_MAX_BACKOFF, 0.5 * 2 ** (q.failures - 1))
                if q.last_error != error:
                    log.warning("alertmanager %s: %s; %d alert(s) kept for retry", redact_url(q.url), error, len(q.pending))
                q.last_error = error

    def _post(self, q: _Queue, alerts: list[dict], timeout: float) -> tuple[str | None, bool]:
        """(error or None, whether retrying cannot help), within `timeout` seconds in all."""
        try:
            answer = exchange(q.endpoint, "POST", body=json.dumps(alerts).encode(), headers=self.headers,
                              timeout=timeout, size_limit=_MAX_ANSWER, error_body_limit=200)
        except PeerError as exc:
            return f"{type(exc).__name__}: {exc}", False
        status = answer.status
        if 200 <= status < 300:
            return None, False
        if 300 <= status < 400:
            # a proxy's sign-in page or a moved Alertmanager: nothing was delivered, and a
            # POST must not turn into a GET that answers 200
            return f"HTTP {status}: redirect to {redact_url(answer.headers.get('location', '?'))[:200]}, not followed", False
        error = f"HTTP {status}: {answer.body.decode('utf-8', 'replace').strip()}"
        # 408 and 429 are the server asking us to come back later
        return error, 400 <= status < 500 and status not in (408, 429)

    def stats(self) -> list[QueueStats]:
        with self.lock:
            return [QueueStats(q.url, len(q.pending), q.ok, q.failed, q.sent, q.dropped, q.last_success, q.last_error, q.rejected)
                    for q in self.queues]
