"""The I/O half of discovery: ask a Prometheus for its targets, read file_sd files.

Each refresh of each source ends in `discovery.settle`, so a source that fails keeps
its last good targets (said in a log line and in prefixcache_discovery_* metrics) and
one that suddenly answers nothing is not believed at once.
"""
from __future__ import annotations

import glob
import logging
import os
import threading
from dataclasses import replace
from typing import Callable

from .config import DiscoveryConfig, PrometheusSDConfig, Target
from .discovery import DiscoveryError, SourceState, from_file_sd, from_targets_api, settle
from .promapi import PrometheusAPI, PrometheusAPIError
from .scrape import redact_url

log = logging.getLogger(__name__)

PROMETHEUS, FILE_SD = "prometheus", "file_sd"
MAX_SD_FILE = 16 * 1024 * 1024


class PrometheusSource:
    def __init__(self, cfg: PrometheusSDConfig):
        self.cfg = cfg
        self.api = PrometheusAPI(cfg.url, cfg.timeout, cfg.bearer_token, cfg.username, cfg.password)

    def fetch(self) -> list[Target]:
        try:
            # scrapePool narrows the answer where Prometheus knows it (2.42+); older ones ignore it
            payload = self.api.get("/api/v1/targets", {"state": "active", "scrapePool": self.cfg.job})
        except PrometheusAPIError as exc:
            raise DiscoveryError(str(exc)) from None
        return from_targets_api(payload, self.cfg.job, redact_url(self.api.base_url + "/api/v1/targets"))

    def close(self) -> None:
        self.api.close()


class FileSource:
    """file_sd files, each re-read only when it changed; a file that turns malformed
    keeps its last good targets, as Prometheus does."""

    def __init__(self, patterns: tuple[str, ...]):
        self.patterns = patterns
        self._seen: dict[str, tuple] = {}  # path -> (mtime_ns, size, inode)
        self._targets: dict[str, list[Target]] = {}

    def fetch(self) -> tuple[list[Target], list[str]]:
        errors: list[str] = []
        paths = sorted({p for pattern in self.patterns for p in glob.glob(pattern)})
        for gone in set(self._targets) - set(paths):
            self._targets.pop(gone)
            self._seen.pop(gone, None)
        for path in paths:
            try:
                st = os.stat(path)
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                if self._seen.get(path) == stamp and path in self._targets:
                    continue
                if st.st_size > MAX_SD_FILE:
                    raise DiscoveryError(f"{path}: over {MAX_SD_FILE} bytes")
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                self._targets[path] = from_file_sd(text, path)
                self._seen[path] = stamp
            except (OSError, UnicodeDecodeError) as exc:
                errors.append(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}")
            except DiscoveryError as exc:
                errors.append(str(exc))
                self._seen.pop(path, None)  # read it again next time, even unchanged
        if not paths:
            errors.append(f"no file matches {', '.join(self.patterns)}")
        return [t for path in sorted(self._targets) for t in self._targets[path]], errors

    def close(self) -> None:
        pass


class Discovery:
    """The discovery sources of one config and their last good lists."""

    def __init__(self, cfg: DiscoveryConfig, clock: Callable[[], float]):
        self.cfg = cfg
        self.clock = clock
        self.lock = threading.Lock()
        self.prometheus = PrometheusSource(cfg.prometheus) if cfg.prometheus else None
        self.files = FileSource(cfg.file_sd) if cfg.file_sd else None
        self.states: dict[str, SourceState] = {}
        if self.prometheus:
            self.states[PROMETHEUS] = SourceState(PROMETHEUS)
        if self.files:
            self.states[FILE_SD] = SourceState(FILE_SD)

    def refresh(self) -> list[Target]:
        """Ask every source once; -> the targets of all sources (last good where one failed)."""
        with self.lock:
            if self.prometheus:
                self._settle(PROMETHEUS, *self._ask_prometheus())
            if self.files:
                found, errors = self.files.fetch()
                self._settle(FILE_SD, found, "; ".join(errors))
            return [t for s in self.states.values() for t in s.targets]

    def _ask_prometheus(self) -> tuple[list[Target] | None, str]:
        try:
            return self.prometheus.fetch(), ""
        except DiscoveryError as exc:
            return None, str(exc)

    def _settle(self, name: str, found: list[Target] | None, error: str) -> None:
        old = self.states[name]
        new = settle(old, self.clock(), found, error, self.cfg.accept_empty_after)
        if found is not None and error:  # file_sd: some files were read, some were not
            new = replace(new, ok=False, failures=old.failures + 1, error=error)
        if new.error and new.error != old.error:
            log.warning("discovery %s: %s%s", name, new.error,
                        f"; keeping the last {len(new.targets)} target(s)" if not new.ok else "")
        elif not new.error and old.error:
            log.info("discovery %s: working again", name)
        if {t.name for t in new.targets} != {t.name for t in old.targets}:
            log.info("discovery %s: %d target(s) (was %d)", name, len(new.targets), len(old.targets))
        self.states[name] = new

    def snapshot(self) -> list[SourceState]:
        with self.lock:
            return list(self.states.values())

    def close(self) -> None:
        if self.prometheus:
            self.prometheus.close()
