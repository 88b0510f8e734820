"""Our /metrics text: our families rendered from the state with a fragment cached per
target, so a render's formatting costs what changed since the last one, not the fleet;
the runtime collectors (process, GC, platform) read on every scrape, so
`process_cpu_seconds_total` moves even while nothing else does.

A target's fragment is its families' sample lines in the text format, written directly
from the collector's families of that one target (TextFamilies: the lines
prometheus_client's generate_latest writes, without building its objects), reused while the target's
view (an immutable object, replaced on every poll), its skipped polls, its deploy events
and the fleet's set of label names stay the same, and kept only for a target whose view
outlives renders (FragmentRender). The answer is compressed family by family as the
targets render (familyzip.py): its text is never whole. A failed render is an HTTP 500, a
log line and a count in prefixcache_collect_errors_total: never an empty 200.
"""
from __future__ import annotations

import functools
import gzip
import logging
import sys
import threading
import weakref
import time
from collections import defaultdict
from typing import Callable

import math

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.utils import floatToGoString

from .collector import METRICS, Families, PrefixCacheCollector, label_names
from .familyzip import FamilyGzip
from .state import State

log = logging.getLogger(__name__)


def _value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels_text(pairs) -> str:
    return "{" + ",".join(f'{k}="{_value(v)}"' for k, v in sorted(pairs)) + "}" if pairs else ""


def _labels_around(pairs, label: str) -> tuple[str, str]:
    """_labels_text of `pairs` and (`label`, value) cut where the value goes, the space after
    the labels included."""
    ordered = sorted(pairs)
    at = sum(1 for k, _ in ordered if k < label)
    before = "".join(f'{k}="{_value(v)}",' for k, v in ordered[:at])
    after = "".join(f',{k}="{_value(v)}"' for k, v in ordered[at:])
    return "{" + before + label + '="', '"' + after + "} "


_GO_SPECIAL = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}


def _go(value: float) -> str:
    """floatToGoString's text of a value (Go's exponent from 1e7 up), without its checks
    of each special value first: repr has no dot only for them and exponents."""
    text = repr(float(value))
    dot = text.find(".")
    if dot == -1:
        return _GO_SPECIAL.get(text, text)
    if dot > 6 and text[0] != "-":
        return floatToGoString(value)
    return text


# METRICS name -> (the name exposed, its own label names and whether a target's labels join them):
# what a label text kept for a target is keyed by, beside the values (the fleet's label names stay
# while a target's label texts are kept)
_FAMILIES = {name: (d.exposed_name, sys.intern(",".join(d.labels) + ("+" if d.target_labels else ""))) for name, d in METRICS.items()}


class TextFamilies(Families):
    """The collector's families written as text-format lines, family by family, in the
    form prometheus_client's generate_latest gives them (labels sorted by name, values as
    Go prints them): a render without a Metric object per family and a Sample per line.
    With `templates` (this render's and the last one's, by the series' label shape and
    values), a series of a target has its label text from a pattern shared by the targets
    (only the target's own label values differ from one target to another) with its
    target's values formatted in: a text kept for each target held 9 KB a pod, 90 MB at
    10,000. Without, and for the fleet's families (head and tail, whose series name
    targets of their own: routers), every text is built."""

    def __init__(self, windows: str, extra_label_names: tuple[str, ...], templates: tuple[dict, dict] | None = None):
        super().__init__(windows, extra_label_names)
        self.lines: defaultdict[str, list[str]] = defaultdict(list)  # METRICS name -> its sample lines
        self._used, self._known = templates if templates is not None else (None, None)
        self._target = None
        self._target_values: tuple[str, ...] = ()  # the target's label values, escaped, in the order of their names

    def _pairs(self, name: str, values: tuple, target) -> list[tuple[str, str]]:
        return list(zip(self.label_names(name), self._labels(name, values, target)))

    def _text_of(self, name: str, shape: str, values: tuple, target, cut: str = "") -> str | tuple[str, str]:
        """The series' label text (_labels_text), or with `cut` its text cut where that
        label's value goes (_labels_around)."""
        used = self._used
        if used is not None and target is not None:
            key = (shape, values, cut)
            pattern = used.get(key)
            if pattern is None:
                pattern = used[key] = self._pattern(name, key)
            if pattern is not False:
                if target is not self._target:
                    self._take(target)
                if cut:
                    before, count, after = pattern
                    args = self._target_values
                    return before % args[:count], after % args[count:]
                return pattern % self._target_values
        pairs = self._pairs(name, values, target)
        return _labels_around(pairs, cut) if cut else _labels_text(pairs)

    def _take(self, target) -> None:
        """The target whose series follow: its label values escaped, in the order of their names."""
        extra = dict(target.labels)
        escaped = (_value(target.name), *(_value(extra.get(k, "")) for k in self.extra))
        self._target, self._target_values = target, tuple(escaped[i] for i in self._slot_order)

    def _pattern(self, name: str, key: tuple):
        """The series' label text as a %-format of its target's label values in the order
        of their names (every pattern has them in that order: the text's labels are sorted
        by name), as (before, how many of the values it has, after) with `cut`; False
        where a value of its own could be taken for a slot. The last render's, if it had it."""
        pattern = self._known.get(key)
        if pattern is None:
            _, values, cut = key
            pattern = self._learn(name, [str(v) for v in values], cut)
        return pattern

    @functools.cached_property
    def _slot_order(self) -> tuple[int, ...]:
        """The target's label values (its name, then `extra`'s) in the order of their names."""
        names = ("target", *self.extra)
        return tuple(sorted(range(len(names)), key=names.__getitem__))

    def _learn(self, name: str, own: list[str], cut: str):
        """_pattern's pattern, from a text whose target values are marks that no label text holds."""
        if not METRICS[name].target_labels or any("\x00" in v for v in own):
            return False
        slots = [f"\x00{i}\x01" for i in range(1 + len(self.extra))]  # no text escapes or holds these
        pairs = list(zip(self.label_names(name), slots + own))
        texts = [text.replace("%", "%%") for text in (_labels_around(pairs, cut) if cut else (_labels_text(pairs),))]
        whole = "".join(texts)
        if len(slots) != len(pairs) - len(own) or sorted(range(len(slots)), key=lambda i: whole.find(slots[i])) != list(self._slot_order):
            return False  # not the label names this pattern expects: built anew each time
        count = sum(texts[0].count(slot) for slot in slots)
        for slot in slots:
            texts = [text.replace(slot, "%s") for text in texts]
        return (texts[0], count, texts[1]) if cut else texts[0]

    def add(self, name: str, values: tuple, value: float, target) -> None:
        exposed, shape = _FAMILIES[name]
        self.lines[name].append(f"{exposed}{self._text_of(name, shape, values, target)} {_go(value)}\n")

    def _complete(self, name: str, shape: str, values: tuple, target, totals: tuple[float, float]) -> None:
        text = self._text_of(name, shape, values, target)
        self.lines[name].extend((f"{name}_count{text} {_go(totals[0])}\n", f"{name}_sum{text} {_go(totals[1])}\n"))

    def histogram(self, name: str, values: tuple, buckets, total: float, target) -> None:
        shape = _FAMILIES[name][1]
        # one text for the series, cut where `le` goes, not a text for each of its buckets
        # (at 10,000 pods those were some 100 MB of the render's memory)
        before, after = self._text_of(name, shape, values, target, "le")
        self.lines[name].extend(f"{name}_bucket{before}{'+Inf' if math.isinf(le) else repr(float(le))}{after}{_go(c)}\n"
                                for le, c in buckets)
        if buckets and total is not None:
            self._complete(name, shape, values, target, (buckets[-1][1], total))

    def summary(self, name: str, values: tuple, quantiles, totals: tuple[float, float], target) -> None:
        shape = _FAMILIES[name][1]
        before, after = self._text_of(name, shape, values, target, "quantile")
        self.lines[name].extend(f"{name}{before}{repr(float(q))}{after}{_go(v)}\n" for q, v in quantiles)
        self._complete(name, shape, values, target, totals)

    def fragments(self) -> dict[str, bytes]:
        """METRICS name -> its sample lines, encoded: the answer is then joined from them as
        they are, in one copy, each family's HELP and TYPE lines before its first."""
        return {name: "".join(lines).encode("utf-8") for name, lines in self.lines.items()}


@functools.lru_cache(maxsize=1024)
def _header(name: str, windows: str) -> bytes:
    """A family's HELP and TYPE lines: one string shared by every render (not a copy of
    each family's help a target, formatted anew at every render of each)."""
    d = METRICS[name]
    help_text = d.help.replace("{windows}", windows).replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {d.exposed_name} {help_text}\n# TYPE {d.exposed_name} {d.kind}\n".encode("utf-8")


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


KEEP_AFTER = 4  # renders: a target's text is kept while its view was unchanged at one of its last that many
_KEPT_MASK = (1 << KEEP_AFTER) - 1
# the texts kept between renders, in bytes: every target's at 1,000 (15 MB). At 10,000 pods a scraper
# coming between two reads had every view found unchanged, and their 150 MB of text then stayed for
# KEEP_AFTER renders, beside the next reads' answers: 947 -> 1,132 MiB at its peak
KEEP_BYTES = 32 * 2**20


class FragmentRender:
    """Renders the collector's families with a cache of each target's fragment, straight
    into the gzip of the answer (familyzip.py): the answer's text is never whole. A
    target's text is kept for the next render while its view was found unchanged at one
    of its last KEEP_AFTER renders: at 10,000 pods read from Prometheus every view changes
    between two renders scraped every 15 s or more, and keeping their 150 MB of text bought
    nothing; a scraper coming between two reads finds them unchanged. At most
    `keep_bytes` of text are kept, the first targets' by name that fit (the same ones from
    render to render, so those kept are those found again). The label-text
    patterns (TextFamilies) the last render used stay: they are what a render anew saves,
    and they are the fleet's, not a target's."""

    def __init__(self, collector: PrefixCacheCollector, keep_bytes: int = KEEP_BYTES):
        self.collector = collector
        self.keep_bytes = keep_bytes
        # target -> ((its view, weakly; its target, per_target's items and the label names it was rendered
        # from), its text or None, at which of its last renders its view was unchanged: a bit each, the newest lowest)
        self._fragments: dict[str, tuple[tuple, dict[str, bytes] | None, int]] = {}
        self._templates: tuple[tuple[str, ...], dict] = ((), {})  # the label names and patterns of the last render
        self.rendered_targets = 0  # fragments rendered anew, for tests and benchmarks

    def _text(self, fill: Callable[[Families], None], extra: tuple[str, ...], templates: tuple[dict, dict] | None = None) -> dict[str, bytes]:
        families = TextFamilies(self.collector.windows, extra, templates)
        fill(families)
        return families.fragments()

    def render(self, between: Callable[[], None] = lambda: None) -> tuple[bytes, int]:
        """The answer as of one reading of the state, gzipped, and the size of its text;
        `between` is called after each target rendered anew (the render lets a burst of
        scrapes go first there)."""
        reading = self.collector.state.read()
        extra = label_names(reading)
        p = reading.published
        windows = self.collector.windows
        answer = FamilyGzip(lambda family: _header(family, windows))
        answer.add(self._text(lambda f: self.collector.head(f, reading), extra))
        templates = ({}, self._templates[1] if self._templates[0] == extra else {})
        fragments, room = {}, self.keep_bytes
        for view in sorted(reading.targets, key=lambda v: v.target.name):
            name = view.target.name
            more = self.collector.per_target(p, name)
            # taken out: the last render's fragment is freed as its target is rendered anew, not
            # after the whole render
            cached = self._fragments.pop(name, None)
            same = cached is not None and cached[0][0]() is view and cached[0][2:] == (more, extra)
            unchanged = ((cached[2] << 1) | same) & _KEPT_MASK if cached is not None else 0
            if same and cached[1] is not None:
                text = cached[1]
            else:
                text = self._text(lambda f, v=view, m=more: self.collector.target(f, v, *m), extra, templates)
                # the view by a weak reference: a view the state replaced since is freed with its history's
                # arrays (a history thinned since holds new ones), not kept until the next render
                cached = ((weakref.ref(view), view.target, more, extra), None, 0)
                self.rendered_targets += 1
                between()
            kept = None
            if unchanged:
                size = sum(map(len, text.values()))
                if size <= room:
                    kept, room = text, room - size
            fragments[name] = (cached[0], kept, unchanged)
            answer.add(text)
        self._fragments = fragments  # gone targets' fragments go with them (a render that failed: all of them)
        self._templates = (extra, templates[0])  # patterns no target used in this render go
        answer.add(self._text(lambda f: self.collector.tail(f, reading), extra))
        zipped = answer.finish()
        return zipped, answer.size


class WouldWait(Exception):
    """The scrape would wait for a render, or for its answer to be gunzipped: it is answered
    where waiting costs no one else."""


class Exposition:
    """/metrics for every scraper. With `collector` (the sidecar): our families rendered
    at most once per `min_interval` and only when the state changed, from cached
    fragments, on a thread of their own, shared by every scraper with their gzip; a
    scrape starts a render that is due and gets the last one while it was the state at
    most `max_age` seconds ago (twice `min_interval` unless given): scrapers that come
    often, or many at once, never wait for a render, and a render they start waits for a
    pause in their scrapes (`quiet`, at most `max_defer`). One whose last render is older waits
    for the render in progress at most `wait` seconds, then gets the last one, so
    /metrics answers at once however large the fleet and however busy the process; and it
    waits only where that render may end meanwhile, as long as the last one took: at 1,000
    targets on a busy 2-core machine a render took 2-4 s, and a scrape that waited its
    0.5 s got the last render anyway.
    The answer is kept gzipped, and as it is only while at most `plain_up_to` bytes: a
    scraper that asks for it plain (Prometheus always asks for gzip) gets a larger one
    gunzipped for it (150-210 MB of text at 10,000 pods, kept for nothing twice over).
    The `registry` (the runtime collectors) is read on every scrape, or shared by scrapes
    less than `runtime_max_age` apart (a burst of scrapers). Without `collector`
    (tests that register our collector in the registry): the whole registry, rendered in
    the request once per state change."""

    def __init__(self, state: State, registry: CollectorRegistry, min_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, collector: PrefixCacheCollector | None = None,
                 wait: float = 0.5, max_age: float | None = None, runtime_max_age: float = 0.1,
                 quiet: float = 0.02, max_defer: float = 0.25, plain_up_to: int = 8 * 2**20):
        self.state = state
        self.registry = registry
        # Each poll of each target is a state change: with many targets, renders are
        # coalesced to at most one per `min_interval` (data at most that old), so a busy
        # fleet does not turn every scrape into a render.
        self.min_interval = min_interval
        self.clock = clock
        self.wait = wait
        self._max_age = max_age  # None: twice min_interval, whatever it is set to later
        self.runtime_max_age = runtime_max_age
        self.quiet, self.max_defer = quiet, max_defer
        self.plain_up_to = plain_up_to
        self._scraped_at = -1e18
        self._burst_began = -1e18
        self._waiting = 0  # scrapes waiting for the render in progress
        self._asked_at, self._turns = -1e18, 0  # the render's deferral: since when, and its waits left
        self._runtime_lock = threading.Lock()
        self._runtime_reading: tuple[float, bytes, bytes] | None = None  # when, plain, gzipped
        # when the last render was last known to be the state (read by the render, or found
        # unchanged by a later scrape): the age of what a scrape gets
        self._read_at = -1e18
        self.fragments = FragmentRender(collector) if collector is not None else None
        self._lock = threading.Lock()
        self._generation = -1
        self._rendered_at = -1e18
        self._body: bytes | None = b""  # None: kept gzipped only (fragments mode)
        self._gzip: bytes | None = None
        self._changed = threading.Condition(self._lock)
        self._busy = False  # a render was asked for and has not finished
        self._asked = -1  # the state's generation it renders
        self._renders = 0  # renders finished (failed ones too)
        self._render_began = -1e18  # when the render in progress (or the last one) started, after its deferral
        self._took: float | None = None  # how long the last render that succeeded took, from its start
        self._renderer: threading.Thread | None = None
        self._failed = False  # the last render failed: a scrape that waited for it answers 500
        if self.fragments is not None:
            # at once, while the state is small: from then on a scrape never waits longer than `wait`,
            # even the first one after a thousand targets were polled
            self._render(state.generation)
            self._rendered_at = self._read_at = -1e18  # the first scrape renders what changed since, and waits for it

    @property
    def max_age(self) -> float:
        return 2 * self.min_interval if self._max_age is None else self._max_age

    def _due(self) -> bool:
        generation = self.state.generation
        return generation != self._generation and (self._generation == -1 or self.clock() - self._rendered_at >= self.min_interval)

    def get(self, gzipped: bool) -> bytes:
        return b"".join(self.parts(gzipped))

    def quiet_for(self) -> float:
        """Seconds since a scrape's answer was last ready (its bytes may still be on their way;
        the collections wait for a pause: gcpacer.py)."""
        return self.clock() - self._scraped_at

    def wait_for_pause(self, limit: float = 0.1) -> None:
        """Returns once scrapes have paused for `quiet` seconds, or `limit` seconds after the
        first scrape of the burst under way: work that can wait a little (a poll's parse)
        lets a burst of scrapers go first, and scrapers that never pause hold no one back."""
        for _ in range(math.ceil(limit / self.quiet) + 1 if self.quiet > 0 else 0):  # bounded by a stopped clock too
            now = self.clock()
            quiet_for, burst = now - self._scraped_at, now - self._burst_began
            if quiet_for >= self.quiet or burst >= limit:
                return
            time.sleep(min(self.quiet - quiet_for, limit - burst))

    def parts(self, gzipped: bool, wait: bool = True) -> tuple[bytes, bytes]:
        """Our families and the runtime collectors' (a gzip stream may hold several
        members, read as one: RFC 1952; Go's and Python's readers do), sent one after the
        other without joining them. With `wait` False, raises WouldWait where the scrape
        would wait for a render: the selector's thread answers only what is ready."""
        if self.fragments is None:
            return self._get_whole(gzipped), b""
        with self._lock:
            if not self._busy and self.state.generation == self._generation:
                # still the state: a poll round that lands just before a burst of scrapers
                # ages it from now, not from its render seconds ago, so the burst need not wait
                self._read_at = self.clock()
            if self._due() and not self._busy:
                self._busy, self._asked, self._asked_at = True, self.state.generation, self.clock()
                self._turns = math.ceil(self.max_defer / self.quiet) if self.quiet > 0 else 0  # bounded by a stopped clock too
                if self._renderer is None:
                    # one thread for every render: its allocations stay in one malloc arena (a thread per
                    # render spread the long-lived fragments over many, and the RSS with them)
                    self._renderer = threading.Thread(target=self._render_loop, name="render", daemon=True)
                    self._renderer.start()
                self._changed.notify_all()
            if self._busy and self.clock() - self._read_at > self.max_age and self._may_end_in_time():
                if not wait:
                    raise WouldWait()
                before = self._renders
                self._waiting += 1
                self._changed.notify_all()  # a render held back for a burst starts now
                try:
                    self._changed.wait_for(lambda: self._renders > before, None if self._gzip is None else self.wait)
                finally:
                    self._waiting -= 1
                if self._failed and self._renders > before:
                    raise RuntimeError("rendering /metrics failed")
            ours = self._gzip if gzipped else self._body
            if ours is None and not wait:
                raise WouldWait()  # to be gunzipped: not on the selector's thread
            zipped = self._gzip
            now = self.clock()
            if now - self._scraped_at >= self.quiet:
                self._burst_began = now  # the first scrape after a pause
            self._scraped_at = now
        if ours is None:
            ours = gzip.decompress(zipped)
        return ours, self._runtime(gzipped)

    def _may_end_in_time(self) -> bool:
        """Under the lock: whether the render in progress may end within `wait` from now,
        if it takes as long as the last one did (yes where there is none to go by, or no
        answer to give instead)."""
        if self._took is None or self._gzip is None:
            return True
        started = max(self._render_began, self._asked_at)  # asked for and still held back: not started
        return started + self._took - self.clock() <= self.wait

    def _runtime(self, gzipped: bool) -> bytes:
        """Process CPU and memory, GC: read as of this scrape, or of one less than
        `runtime_max_age` ago. A burst of scrapers shares one reading: each reading opens
        and reads files under /proc, and every such call lets the polls and the render take
        the interpreter lock, which a burst then waits for again and again."""
        now = self.clock()
        with self._runtime_lock:
            reading = self._runtime_reading
            if reading is None or not 0 <= now - reading[0] < self.runtime_max_age:
                plain = generate_latest(self.registry)
                reading = self._runtime_reading = (now, plain, gzip.compress(plain, compresslevel=1))
        return reading[2] if gzipped else reading[1]

    def _render_loop(self) -> None:
        while True:
            with self._lock:
                self._changed.wait_for(lambda: self._busy)
                self._after_the_burst()
                generation = self._asked
            self._render(generation)

    def _after_the_burst(self) -> None:
        """Holds a render back until scrapes have stopped coming for `quiet` seconds, at most
        `max_defer` seconds from when it was asked for in all, and not while a scrape waits
        for it; before it starts, and again after each target it renders. Scrapers that come
        at the same instant (one every second each) start a render with their first scrape:
        run beside them, its work took the interpreter lock from the thread answering them
        at each of its calls into the kernel, and the burst's last answers waited for the
        whole render (100 ms at 200 targets). A burst that comes while a render runs (or
        whose scrapes a poll round spaces out more than `quiet`) waits for one target's
        fragment, not for the rest of the render, while the render's `max_defer` lasts:
        once scrapes that never paused used it up, the rest of the render runs beside them."""
        while self._turns > 0:
            now = self.clock()
            quiet_for, deferred = now - self._scraped_at, now - self._asked_at
            if self._waiting or quiet_for >= self.quiet or deferred >= self.max_defer:
                return
            self._turns -= 1
            self._changed.wait(min(self.quiet - quiet_for, self.max_defer - deferred))

    def _between_targets(self) -> None:
        with self._lock:
            self._after_the_burst()

    def _render(self, generation: int) -> None:
        began = self._render_began = self.clock()
        try:
            zipped, size = self.fragments.render(self._between_targets)
            # the text kept beside its gzip only while small: no text of a large answer is ever whole
            body = gzip.decompress(zipped) if size <= self.plain_up_to else None
        except Exception:  # noqa: BLE001 - logged, counted, and the scrapes waiting for it answer 500
            log.exception("collect failed: /metrics answers 500 until a render succeeds")
            self.state.count(collect_errors=1)
            with self._lock:
                self._generation, self._failed, self._busy = -1, True, False
                self._renders += 1
                self._changed.notify_all()
            return
        with self._lock:
            self._body = body
            self._gzip, self._generation, self._rendered_at = zipped, generation, self.clock()
            self._failed, self._busy, self._read_at, self._took = False, False, began, self._rendered_at - began
            self._renders += 1
            self._changed.notify_all()

    def _get_whole(self, gzipped: bool) -> bytes:
        with self._lock:  # concurrent scrapers wait for one render instead of each rendering
            generation = self.state.generation
            if self._due():
                try:
                    body = generate_latest(self.registry)
                except Exception:
                    log.exception("collect failed: /metrics answers 500 until a render succeeds")
                    self.state.count(collect_errors=1)
                    self._generation = -1
                    raise
                self._body, self._gzip, self._generation, self._rendered_at = body, None, generation, self.clock()
            if gzipped and self._gzip is None:
                self._gzip = gzip.compress(self._body, compresslevel=1)
            return self._gzip if gzipped else self._body
