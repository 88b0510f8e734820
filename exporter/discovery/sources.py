"""The I/O half of discovery: ask a Prometheus for its targets, read file_sd files.

Each refresh of each source ends in `sdtargets.settle`, so a source that fails keeps
its last good targets (said in a log line and in prefixcache_discovery_* metrics) and
one that suddenly answers nothing is not believed at once.

No source can hold the sidecar: each one is asked on a thread of its own, side by side,
and waited for at most its deadline (a Prometheus that drips its answer, a file_sd path
on a hung mount), one ask at a time per source; a refresh may have a budget of its own
(a reload's: it ends then, the ask goes on for the next refresh), and `close` ends the
wait at once, so start-up, reloads and SIGTERM never wait on a peer.
"""
from __future__ import annotations

import glob
import logging
import os
import stat
import threading
import time
from dataclasses import replace
from typing import Callable

from ..config.discovery import DiscoveryConfig, PrometheusSDConfig
from ..config.sections import Target
from ..peers import files
from ..peers.promapi import PrometheusAPI, PrometheusAPIError
from ..peers.urls import redact_url
from .targets import DiscoveryError, Found, Limits, Selector, SourceState, from_file_sd, from_targets_api, limit_targets, limits_log, over_limits, settle

log = logging.getLogger(__name__)

PROMETHEUS, FILE_SD = "prometheus", "file_sd"
MAX_SD_FILE = 16 * 1024 * 1024
FILE_SD_DEADLINE = 5.0  # reading local files: only a hung mount takes longer
MAX_FILE_ERRORS = 5


class PrometheusSource:
    def __init__(self, cfg: PrometheusSDConfig, limits: Limits):
        self.cfg = cfg
        self.limits = limits
        self.deadline = cfg.timeout
        self.selector = Selector(cfg.wanted_labels, cfg.scrape_pool)
        self.api = PrometheusAPI(cfg.url, cfg.timeout, cfg.bearer_token, cfg.username, cfg.password)
        self.where = redact_url(self.api.base_url + "/api/v1/targets")
        self.narrows = bool(cfg.scrape_pool)  # the server then answers only that pool

    def fetch(self) -> tuple[Found, list[str]]:
        params = {"state": "active"}
        if self.cfg.scrape_pool:  # narrows the answer where Prometheus knows it (2.42+); older ones ignore it
            params["scrapePool"] = self.cfg.scrape_pool
        try:
            payload = self.api.get("/api/v1/targets", params)
        except PrometheusAPIError as exc:
            raise DiscoveryError(str(exc)) from None
        return from_targets_api(payload, self.selector, self.where, self.limits), []

    def describe(self) -> str:
        return f"{self.selector} at {self.where}"

    def close(self) -> None:
        self.api.close()


class FileSource:
    """file_sd files, each re-read only when it changed; a file that turns malformed
    keeps its last good targets, as Prometheus does. Only regular files are read (a FIFO
    or a device behind a matching name would block or never end), each up to its cap."""

    narrows = False

    def __init__(self, patterns: tuple[str, ...], limits: Limits):
        self.patterns = patterns
        self.limits = limits
        self.deadline = FILE_SD_DEADLINE
        self._seen: dict[str, tuple] = {}  # path -> (mtime_ns, size, inode)
        self._found: dict[str, Found] = {}

    def fetch(self) -> tuple[Found, list[str]]:
        errors: list[str] = []
        paths = sorted({p for pattern in self.patterns for p in glob.glob(pattern)})
        for gone in set(self._found) - set(paths):
            self._found.pop(gone)
            self._seen.pop(gone, None)
        for path in paths:
            try:
                st = os.stat(path)  # follows a symlink: what it names must be a regular file too
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                if self._seen.get(path) == stamp and path in self._found:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    raise DiscoveryError(f"{path}: not a regular file")
                self._found[path] = from_file_sd(files.read_text(path, MAX_SD_FILE), path, self.limits)
                self._seen[path] = stamp
            except OSError as exc:
                errors.append(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}")
            except DiscoveryError as exc:
                errors.append(str(exc))
                self._seen.pop(path, None)  # read it again next time, even unchanged
        if not paths:
            errors.append(f"no file matches {', '.join(self.patterns)}")
        if len(errors) > MAX_FILE_ERRORS:  # a glob over thousands of bad files: one log line, not a page
            errors[MAX_FILE_ERRORS:] = [f"and {len(errors) - MAX_FILE_ERRORS} more file(s) not read"]
        found = Found()
        for path in sorted(self._found):
            found.add(self._found[path])
        return found, errors

    def describe(self) -> str:
        return ", ".join(self.patterns)

    def close(self) -> None:
        pass


class _Ask:
    """One ask of one source, on a thread of its own: what it found, when it began."""

    def __init__(self, began: float):
        self.began = began
        self.box: dict = {}
        self.done = threading.Event()  # its answer came, or close woke its waiters
        self.thread: threading.Thread | None = None
        self.taken = False  # a refresh settled it


class Discovery:
    """The discovery sources of one config and their last good lists."""

    def __init__(self, cfg: DiscoveryConfig, clock: Callable[[], float], monotonic: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.clock = clock
        self.lock = threading.Lock()  # the states: held only briefly
        self._refreshing = threading.Lock()  # one refresh at a time
        self._closed = threading.Event()
        self._waits: set[threading.Event] = set()
        self._asking: dict[str, _Ask] = {}
        self.monotonic = monotonic  # the refresh's deadlines and budget (the waits themselves are real)
        self._hinted: set[str] = set()
        self.limits = limits = Limits(cfg.target_limit, cfg.label_limit, cfg.label_value_length_limit)
        self.sources: dict[str, PrometheusSource | FileSource] = {}
        if cfg.prometheus:
            self.sources[PROMETHEUS] = PrometheusSource(cfg.prometheus, limits)
        if cfg.file_sd:
            self.sources[FILE_SD] = FileSource(cfg.file_sd, limits)
        self.states: dict[str, SourceState] = {name: SourceState(name) for name in self.sources}

    @property
    def prometheus(self) -> PrometheusSource | None:
        return self.sources.get(PROMETHEUS)  # type: ignore[return-value]

    @property
    def files(self) -> FileSource | None:
        return self.sources.get(FILE_SD)  # type: ignore[return-value]

    def refresh(self, budget: float | None = None) -> list[Target] | None:
        """Ask every source once, side by side, each within its deadline; -> the targets of
        all sources (last good where one failed). After `close`, returns at once.

        `budget`: seconds for the whole refresh, the wait for a refresh in flight included
        (a reload's refresh, which must not wait on a slow peer for as long as the discovery
        thread may). -> None when it ran out first: a source not answered by then is not
        failed, its ask goes on, and the next refresh waits for that same ask (the peer is
        not asked again on top of itself)."""
        began = self.monotonic()
        left = (lambda: None) if budget is None else (lambda: budget - (self.monotonic() - began))
        if not self._refreshing.acquire(timeout=-1 if budget is None else max(0.0, left())):
            return None  # the refresh in flight settles what it finds
        try:
            asks = {}
            for name, source in self.sources.items():
                ask = self._ask(name, source)
                if ask is None:  # closed
                    return self.targets()
                asks[name] = ask
            cut = False
            for name, ask in asks.items():
                outcome = self._outcome(self.sources[name], ask, left())
                if outcome is None:
                    if self._closed.is_set():
                        return self.targets()
                    cut = True  # out of budget, not of the source's deadline: no verdict on it
                    continue
                self._settle(name, *outcome)
            return None if cut else self.targets()
        finally:
            self._refreshing.release()

    def targets(self) -> list[Target]:
        with self.lock:
            return [t for s in self.states.values() for t in s.targets]

    def _ask(self, name: str, source) -> "_Ask | tuple[None, str] | None":
        """The source's ask: the one a refresh whose budget ran out left, within its deadline
        (in flight, or answered and not settled yet), else a new one on a thread of its own;
        an error where the one in flight is past its deadline; None once closed."""
        previous = self._asking.get(name)
        if previous is not None and not previous.taken and self.monotonic() - previous.began < source.deadline:
            return previous  # left by a refresh out of budget: still asking, or answered since and not yet settled
        if previous is not None and previous.thread.is_alive():
            return None, f"{source.describe()}: the ask before this one is still unanswered after its {source.deadline:g}s deadline"
        ask = _Ask(self.monotonic())
        if previous is not None:
            with self.lock:
                self._waits.discard(previous.done)

        def run() -> None:
            try:
                ask.box["found"], ask.box["errors"] = source.fetch()
            except DiscoveryError as exc:
                ask.box["error"] = str(exc)
            except Exception as exc:  # noqa: BLE001 - an error no layer below foresaw is still a failed refresh
                ask.box["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            finally:
                ask.done.set()

        with self.lock:  # with close's lock: a close either came before (we stop) or will wake us
            if self._closed.is_set():
                return None
            self._waits.add(ask.done)
        ask.thread = threading.Thread(target=run, name=f"discovery-{name}", daemon=True)
        self._asking[name] = ask
        ask.thread.start()
        return ask

    def _outcome(self, source, ask, left: float | None) -> tuple[Found | None, str] | None:
        """What the ask came to by its deadline; None when closed meanwhile, or when `left`
        (seconds of the refresh's budget) ran out first."""
        if isinstance(ask, tuple):
            return ask
        until_deadline = source.deadline - (self.monotonic() - ask.began)
        wait = max(0.0, until_deadline if left is None else min(until_deadline, left))
        ask.done.wait(wait)
        if self._closed.is_set():
            return None
        if not ask.done.is_set():
            if left is not None and left < until_deadline:
                return None
            ask.taken = True  # judged: a later refresh does not wait for it again
            return None, f"{source.describe()}: no complete answer within the {source.deadline:g}s deadline"
        with self.lock:
            self._waits.discard(ask.done)
        ask.taken = True
        if "error" in ask.box:
            return None, ask.box["error"]
        return ask.box["found"], "; ".join(ask.box["errors"])

    def _settle(self, name: str, found: Found | None, error: str) -> None:
        with self.lock:
            old = self.states[name]
        targets = limit_targets(found.targets, self.cfg.target_limit, found.dropped) if found is not None else None
        new = settle(old, self.clock(), targets, error, self.cfg.accept_empty_after)
        if found is not None:
            dropped = tuple(sorted(found.dropped.items()))
            new = replace(new, dropped=dropped, found=len(found.targets),
                          over_limits=over_limits(dropped, len(found.targets), len(targets), self.limits))
            if error:  # file_sd: some files were read, some were not
                new = replace(new, ok=False, failures=old.failures + 1, error=error)
        if new.error and new.error != old.error:
            log.warning("discovery %s: %s%s", name, new.error,
                        f"; keeping the last {len(new.targets)} target(s)" if not new.ok else "")
        elif not new.error and old.error:
            log.info("discovery %s: working again", name)
        level, line = limits_log(old, new)
        if line:
            log.log(logging.WARNING if level == "warning" else logging.INFO, "discovery %s: %s", name, line)
        source = self.sources[name]
        # said when the answer held targets, none ours (an empty Prometheus is more often one that just started),
        # or when the server narrowed the answer to a pool that held nothing
        if found is not None and not new.matched_ever and name not in self._hinted and (found.unmatched or source.narrows):
            self._hinted.add(name)
            log.warning("discovery %s: answered, but nothing matches %s; the answer held %s. A source that never matched "
                        "is far more often a wrong selector than an empty fleet (prefixcache_discovery_matched_nothing)",
                        name, source.describe(), ", ".join(found.unmatched) or "no target (the server kept only that scrape_pool)")
        if {t.name for t in new.targets} != {t.name for t in old.targets}:
            log.info("discovery %s: %d target(s) (was %d)", name, len(new.targets), len(old.targets))
        with self.lock:
            self.states[name] = new

    def snapshot(self) -> list[SourceState]:
        with self.lock:
            return list(self.states.values())

    def close(self) -> None:
        """Ends a refresh in flight now (its source's thread is left to its own deadline)."""
        with self.lock:
            self._closed.set()
            for done in self._waits:
                done.set()
        for source in self.sources.values():
            source.close()
