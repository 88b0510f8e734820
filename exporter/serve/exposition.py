"""Our /metrics text: our families rendered from the state with a fragment cached per
target, so a render costs what changed since the last one, not the fleet; the runtime
collectors (process, GC, platform) read on every scrape, so `process_cpu_seconds_total`
moves even while nothing else does.

A target's fragment is its families' sample lines, rendered by prometheus_client's own
text format from the collector's families of that one target, and kept while the target's
view (an immutable object, replaced on every poll), its skipped polls, its deploy events
and the fleet's set of label names stay the same. The answer is then assembled family by
family. A failed render is an HTTP 500, a log line and a count in
prefixcache_collect_errors_total: never an empty 200.
"""
from __future__ import annotations

import gzip
import logging
import threading
import time
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest

from .collector import Families, PrefixCacheCollector, label_names
from .state import State

log = logging.getLogger(__name__)


class _Families:
    """Families as a collector, for generate_latest."""

    def __init__(self, families: Iterable[Metric]):
        self.families = families

    def collect(self):
        return self.families


class ReservedNames:
    """Registered in the runtime registry: describes our families and collects nothing, so
    that a runtime collector exposing one of our names is refused at registration rather
    than rendering a duplicate family next to ours."""

    def __init__(self, collector: PrefixCacheCollector):
        self.collector = collector

    def describe(self):
        return self.collector.describe()

    def collect(self):
        return []


def split_families(text: str) -> dict[str, tuple[str, str]]:
    """Text format -> exposed family name -> (its HELP and TYPE lines, its sample lines)."""
    out: dict[str, tuple[str, str]] = {}
    for chunk in text.split("# HELP ")[1:]:
        name = chunk.partition(" ")[0]
        type_end = chunk.index("\n", chunk.index("\n# TYPE ") + 1) + 1
        out[name] = ("# HELP " + chunk[:type_end], chunk[type_end:])
    return out


class FragmentRender:
    """Renders the collector's families with a cache of each target's fragment."""

    def __init__(self, collector: PrefixCacheCollector):
        self.collector = collector
        self._fragments: dict[str, tuple[tuple, dict[str, tuple[str, str]]]] = {}
        self.rendered_targets = 0  # fragments rendered anew, for tests and benchmarks

    def _text(self, fill: Callable[[Families], None], extra: tuple[str, ...]) -> dict[str, tuple[str, str]]:
        families = Families(self.collector.windows, extra)
        fill(families)
        return split_families(generate_latest(_Families(families.done())).decode("utf-8"))

    def render(self) -> bytes:
        reading = self.collector.state.read()
        extra = label_names(reading)
        p = reading.published
        parts = [self._text(lambda f: self.collector.head(f, reading), extra)]
        fragments = {}
        for view in sorted(reading.targets, key=lambda v: v.target.name):
            name = view.target.name
            more = self.collector.per_target(p, name)
            cached = self._fragments.get(name)
            if cached is not None and cached[0][0] is view and cached[0][1:] == (more, extra):
                fragments[name] = cached
            else:
                text = self._text(lambda f, v=view, m=more: self.collector.target(f, v, *m), extra)
                fragments[name] = ((view, more, extra), text)
                self.rendered_targets += 1
            parts.append(fragments[name][1])
        self._fragments = fragments  # gone targets' fragments go with them
        parts.append(self._text(lambda f: self.collector.tail(f, reading), extra))
        headers: dict[str, str] = {}
        samples: dict[str, list[str]] = {}
        for part in parts:
            for family, (header, lines) in part.items():
                if family not in headers:
                    headers[family] = header
                    samples[family] = []
                samples[family].append(lines)
        return "".join(headers[f] + "".join(samples[f]) for f in headers).encode("utf-8")


class Exposition:
    """/metrics for every scraper. With `collector` (the sidecar): our families rendered
    at most once per `min_interval` and only when the state changed, from cached
    fragments, shared by every scraper with their gzip; the `registry` (the runtime
    collectors) read on every scrape. Without (tests that register our collector in the
    registry): the whole registry, rendered once per state change."""

    def __init__(self, state: State, registry: CollectorRegistry, min_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, collector: PrefixCacheCollector | None = None):
        self.state = state
        self.registry = registry
        # Each poll of each target is a state change: with many targets, renders are
        # coalesced to at most one per `min_interval` (data at most that old), so a busy
        # fleet does not turn every scrape into a render.
        self.min_interval = min_interval
        self.clock = clock
        self.fragments = FragmentRender(collector) if collector is not None else None
        self._lock = threading.Lock()
        self._generation = -1
        self._rendered_at = -1e18
        self._body = b""
        self._gzip: bytes | None = None

    def _ours(self) -> bytes:
        return self.fragments.render() if self.fragments is not None else generate_latest(self.registry)

    def get(self, gzipped: bool) -> bytes:
        with self._lock:  # concurrent scrapers wait for one render instead of each rendering
            generation = self.state.generation
            now = self.clock()
            if generation != self._generation and (self._generation == -1 or now - self._rendered_at >= self.min_interval):
                try:
                    body = self._ours()
                except Exception:
                    log.exception("collect failed: /metrics answers 500 until a render succeeds")
                    self.state.count(collect_errors=1)
                    self._generation = -1
                    raise
                self._body, self._gzip, self._generation, self._rendered_at = body, None, generation, now
            if gzipped and self._gzip is None:
                self._gzip = gzip.compress(self._body, compresslevel=1)
            ours = self._gzip if gzipped else self._body
        if self.fragments is None:
            return ours
        runtime = generate_latest(self.registry)  # process CPU and memory, GC: as of this scrape
        # a gzip stream may hold several members, read as one (RFC 1952; Go's and Python's readers do)
        return ours + (gzip.compress(runtime, compresslevel=1) if gzipped else runtime)
