"""Window math over one target's scrape history: pure functions of samples and `now`.

Semantics follow PromQL so that our numbers can be checked against a real Prometheus:
after a reset the new value is the increase since it (`increase()` without
extrapolation); quantiles are `histogram_quantile()`'s. One departure, on purpose: PromQL
takes every decrease for a reset, so a hits counter that steps back by one token adds
its whole value to the window (a ratio of 41 where it is 50%). Here a decrease is a
reset only when the process restarted (its start time or a `_created` changed) or the
counter fell to at most RESET_FRACTION of its last value, as a fresh process's counters
do; a smaller step back is held at the last value until the counter passes it again (an
increase of 0, never negative), counted, and reported. Every ratio is in [0, 1].
"""
from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from collections.abc import Sequence
from itertools import compress
from operator import add as operator_add
from operator import itemgetter, lt, ne, sub
from typing import Callable, NamedTuple

from .vllm_metrics import Snapshot

QUANTILES = (0.5, 0.9, 0.99)
# A counter that falls to at most this fraction of its last value was reset; one that
# falls less stepped back (a non-atomic read, float rounding in a sum of processes): the
# restart of a process that had counted for a while leaves far less than half behind.
RESET_FRACTION = 0.5


def is_reset(before: float, after: float) -> bool:
    """Whether a counter going from `before` to `after` (lower) was reset, with no other
    sign of a restart: see RESET_FRACTION."""
    return after <= before * RESET_FRACTION


def ratio(part: float, whole: float) -> float:
    """part / whole within [0, 1]: hits above queries (counters read at different
    moments) are all hits, never 150%."""
    return min(1.0, max(0.0, part / whole))


# Counters kept per series, in this order in every sample's value array.
COUNTERS = ("queries", "hits", "external_queries", "external_hits", "ttft_sum", "ttft_count", "prompt_tokens", "preemptions",
            # admitted prefill (vLLM 0.16 on): prompt_tokens_by_source, cached, recomputed
            "local_cache_hit", "recomputed", "prompt_cached", "external_transfer")
_GAUGES = ("kv_cache_usage",)
_FIXED = COUNTERS + _GAUGES
NAN = math.nan

SeriesKey = tuple  # (model_name, engine)


@dataclass(frozen=True, eq=False)
class Layout:
    """Where each series' values sit in a sample's array. Consecutive samples with the
    same series share one Layout object, so a sample costs one float array, and every
    lookup below is a dict hit, whatever the number of series."""

    keys: tuple[SeriesKey, ...]
    units: tuple[str | None, ...]
    bounds: tuple[tuple[float, ...] | None, ...]
    offsets: tuple[int, ...]
    size: int
    position: dict  # key -> index into keys
    by_model: dict  # model_name -> keys of that model, engines sorted
    gauges: tuple  # positions of gauge values, which are never reset-adjusted
    gauge_set: frozenset
    unit_of_model: dict  # model_name -> the unit all its series count in, or None if they differ
    single_base: dict  # model_name -> offset of its values, for models with one series (the usual case)
    counters_of: Callable  # values -> the counter slots of every series, series after series (len(COUNTERS) each)

    @staticmethod
    def build(keys, units, bounds) -> "Layout":
        offsets, pos = [], 0
        for b in bounds:
            offsets.append(pos)
            pos += len(_FIXED) + (len(b) if b else 0)
        keys = tuple(keys)
        by_model: dict[str, list] = {}
        for k in keys:
            by_model.setdefault(k[0], []).append(k)
        gauges = tuple(o + len(COUNTERS) for o in offsets)
        units = tuple(units)
        unit_sets: dict[str, set] = {}
        for k, u in zip(keys, units):
            if u is not None:
                unit_sets.setdefault(k[0], set()).add(u)
        unit_of_model = {m: (next(iter(unit_sets[m])) if len(unit_sets.get(m, ())) == 1 else None) for m in by_model}
        position = {k: i for i, k in enumerate(keys)}
        single_base = {m: offsets[position[ks[0]]] for m, ks in by_model.items() if len(ks) == 1}
        n = len(COUNTERS)
        slots = [o + j for o in offsets for j in range(n)]
        # windows only need the counters' differences, not every histogram bucket's
        getter = itemgetter(*slots) if len(slots) > 1 else (lambda values: tuple(values[s] for s in slots))
        return Layout(keys, units, tuple(bounds), tuple(offsets), pos, position,
                      {m: tuple(sorted(ks, key=lambda k: k[1] or "")) for m, ks in by_model.items()},
                      gauges, frozenset(gauges), unit_of_model, single_base, getter)


_SLOT = {name: i for i, name in enumerate(_FIXED)}


class TargetSample:
    """One scrape of one target. Counter values are reset-adjusted: each reset adds the
    value seen before it, so `last - first` over any two samples is PromQL's increase()
    without extrapolation, however many samples were thinned out between them."""

    __slots__ = ("t", "layout", "values")

    def __init__(self, t: float, layout: Layout, values: array):
        self.t = t
        self.layout = layout
        self.values = values

    def get(self, key: SeriesKey, name: str) -> float | None:
        i = self.layout.position.get(key)
        if i is None:
            return None
        v = self.values[self.layout.offsets[i] + _SLOT[name]]
        return None if v != v else v

    def buckets(self, key: SeriesKey) -> tuple[tuple[float, ...], list[float]] | None:
        i = self.layout.position.get(key)
        if i is None or not self.layout.bounds[i]:
            return None
        start = self.layout.offsets[i] + len(_FIXED)
        bounds = self.layout.bounds[i]
        return bounds, list(self.values[start:start + len(bounds)])

    def unit(self, key: SeriesKey) -> str | None:
        i = self.layout.position.get(key)
        return None if i is None else self.layout.units[i]


def _raw_values(s) -> tuple[list[float], tuple[float, ...] | None, str | None]:
    pc, ext, h = s.prefix_cache, s.external_prefix_cache, s.ttft
    complete = h is not None and bool(h.buckets) and math.isinf(h.buckets[-1][0])
    fixed = [
        pc.queries if pc else None, pc.hits if pc else None,
        ext.queries if ext else None, ext.hits if ext else None,
        h.sum if h else None, h.count if h else None,
        s.prompt_tokens, s.preemptions,
        None, s.prompt_tokens_recomputed, s.prompt_tokens_cached, None,
        s.kv_cache_usage,
    ]
    for source, value in s.prompt_tokens_by_source or ():
        if source == "local_cache_hit":
            fixed[8] = value
        elif source == "external_kv_transfer":
            fixed[11] = value
    values = [NAN if v is None else float(v) for v in fixed]
    bounds = None
    if complete:
        bounds, counts = zip(*h.buckets)
        values.extend(counts)
    return values, bounds, (pc.unit if pc else None)


class ModelLog:
    """Per poll, one model summed over its engines: what happened since the previous poll
    (query and hit tokens, the interval's hit ratio and mean TTFT) and the KV usage.
    Kept at poll resolution for the longest window, column-wise, so that correlation and
    KV maxima over a window cost O(1) per poll with running sums instead of a rescan.

    Arrays are only appended to; pruning moves `start`, and compaction builds new arrays,
    so a reader holding (arrays, end) from an earlier view never sees them shift."""

    __slots__ = ("t", "t_start", "q", "h", "x", "y", "kv", "start")

    def __init__(self) -> None:
        self.t, self.t_start, self.q, self.h = array("d"), array("d"), array("d"), array("d")
        self.x, self.y, self.kv = array("d"), array("d"), array("d")
        self.start = 0

    def append(self, t: float, t_start: float, q: float, h: float, x: float, y: float, kv: float) -> None:
        self.t.append(t)
        self.t_start.append(t_start)
        self.q.append(q)
        self.h.append(h)
        self.x.append(x)
        self.y.append(y)
        self.kv.append(kv)

    def __len__(self) -> int:
        return len(self.t)

    def prune(self, horizon: float) -> int:
        """Drop entries at or before `horizon`; returns how far indexes shifted (0 unless compacted)."""
        t, n = self.t, len(self.t)
        while self.start < n and t[self.start] <= horizon:
            self.start += 1
        if self.start < 256 or self.start * 2 < n:
            return 0
        shift = self.start
        for name in ModelLog.__slots__[:-1]:
            setattr(self, name, getattr(self, name)[shift:])
        self.start = 0
        return shift


class _Running:
    """Running sums over the log entries of one window, for one model."""

    __slots__ = ("seconds", "lo_start", "n", "sx", "sy", "sxy", "sxx", "syy", "kv", "removed")

    def __init__(self, seconds: float, lo: int):
        self.seconds = seconds
        self.lo_start = lo
        self.n = self.sx = self.sy = self.sxy = self.sxx = self.syy = 0.0
        self.kv: deque = deque()  # (t, kv), kv decreasing: the front is the window's max
        self.removed = 0

    def add(self, x: float, y: float, sign: float = 1.0) -> None:
        if x == x and y == y:
            self.n += sign
            self.sx += sign * x
            self.sy += sign * y
            self.sxy += sign * x * y
            self.sxx += sign * x * x
            self.syy += sign * y * y

    def update(self, log: ModelLog, i: int, now: float) -> None:
        """Entry i was just appended at `now`."""
        _advance((self,), log, i, now)

    def rebuild(self, log: ModelLog, i: int) -> None:
        """The sums afresh from the window's entries: bounds the drift of add-and-subtract."""
        self.removed = 0
        self.n = self.sx = self.sy = self.sxy = self.sxx = self.syy = 0.0
        for j in range(self.lo_start, i + 1):
            self.add(log.x[j], log.y[j])

    def shift(self, by: int) -> None:
        self.lo_start -= by

    def fit(self) -> tuple[float, float] | None:
        return _fit(self.n, self.sx, self.sy, self.sxy, self.sxx, self.syy)

    def kv_max(self) -> float | None:
        return self.kv[0][1] if self.kv else None


def _advance(runs, log: ModelLog, i: int, now: float) -> None:
    """Entry i was just appended at `now`: every window's running sums take it in and let
    go of the entries that slid out. One call for all windows of a model, reading the entry
    once (`_Running.add` inlined): this runs per model and poll."""
    x, y, kv, t = log.x[i], log.y[i], log.kv[i], log.t[i]
    valid = x == x and y == y
    xy, xx, yy = x * y, x * x, y * y
    t_start, xs, ys = log.t_start, log.x, log.y
    for r in runs:
        if valid:
            r.n += 1.0
            r.sx += x
            r.sy += y
            r.sxy += xy
            r.sxx += xx
            r.syy += yy
        edge = now - r.seconds
        lo = r.lo_start
        while lo <= i and t_start[lo] <= edge:
            ox, oy = xs[lo], ys[lo]
            if ox == ox and oy == oy:
                r.n -= 1.0
                r.sx -= ox
                r.sy -= oy
                r.sxy -= ox * oy
                r.sxx -= ox * ox
                r.syy -= oy * oy
            lo += 1
            r.removed += 1
        r.lo_start = lo
        peaks = r.kv
        if kv == kv:
            while peaks and peaks[-1][1] <= kv:
                peaks.pop()
            peaks.append((t, kv))
        while peaks and peaks[0][0] <= edge:
            peaks.popleft()
        if r.removed >= 512:
            r.rebuild(log, i)


def _fit(n, sx, sy, sxy, sxx, syy) -> tuple[float, float] | None:
    """(r, slope of y on x) from sums, or None with fewer than three points or no spread."""
    if n < 3:
        return None
    vx, vy, cov = sxx - sx * sx / n, syy - sy * sy / n, sxy - sx * sy / n
    scale = n * 1e-12
    if vx <= scale * max(1.0, sxx / n) or vy <= scale * max(1.0, syy / n):
        return None
    r = cov / math.sqrt(vx * vy)
    return max(-1.0, min(1.0, r)), cov / vx


class Samples(Sequence):
    """An immutable view of a History at one moment: the samples, their times, and the
    model logs as they were. Safe to read from another thread while the History grows."""

    def __init__(self, samples: tuple, logs: dict | None = None, running: dict | None = None):
        self._samples = samples
        self.times = [s.t for s in samples]
        self._runs: list[tuple[Layout, int, int]] | None = None
        # model -> (log arrays, end): entries past `end` were appended after this view
        self.logs = logs if logs is not None else {}
        self.running = running or {}

    def __getitem__(self, i):
        return self._samples[i]

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self):
        return iter(self._samples)

    def runs(self) -> list[tuple[Layout, int, int]]:
        """(layout, first index, last index) of each stretch of samples sharing a layout."""
        if self._runs is None:
            runs: list[tuple[Layout, int, int]] = []
            for i, s in enumerate(self._samples):
                if runs and runs[-1][0] is s.layout:
                    runs[-1] = (s.layout, runs[-1][1], i)
                else:
                    runs.append((s.layout, i, i))
            self._runs = runs
        return self._runs

    def span(self, since: float, until: float) -> tuple[int, int]:
        """Indexes [lo, hi) of samples in (since, until]."""
        return bisect_right(self.times, since), bisect_right(self.times, until)

    def clipped_runs(self, lo: int, hi: int) -> list[tuple[Layout, int, int]]:
        out = []
        for layout, a, b in self.runs():
            if b < lo or a >= hi:
                continue
            out.append((layout, max(a, lo), min(b, hi - 1)))
        return out

    def models(self, lo: int, hi: int) -> set[str]:
        out: set[str] = set()
        for layout, _, _ in self.clipped_runs(lo, hi):
            out.update(layout.by_model)
        return out


def _as_samples(samples) -> Samples:
    return samples if isinstance(samples, Samples) else Samples(tuple(samples))


class History:
    """A target's samples, reset-adjusted, kept as far back as the longest window needs.

    Samples newer than `fine_seconds` are all kept; older ones are thinned to one per
    `mid_step` up to `mid_seconds` of age and to one per `coarse_step` beyond, which the
    adjusted counters allow without changing any increase: only the left edges of the
    long windows become that coarse (30 s of 15 minutes, 60 s of an hour).
    Per model, a ModelLog keeps what happened at each poll, with running sums for the
    `windows` given, so that a poll costs O(series x windows) whatever the history holds.
    Not thread-safe for writers: one poll job per target appends; `samples()` gives
    readers a view that later appends do not change."""

    def __init__(self, keep_seconds: float, fine_seconds: float | None = None, coarse_step: float = 60.0,
                 windows: Sequence[float] = (), mid_seconds: float = 0.0, mid_step: float = 0.0):
        self.keep_seconds = keep_seconds
        self.fine_seconds = keep_seconds if fine_seconds is None else min(fine_seconds, keep_seconds)
        self.coarse_step = coarse_step
        self.mid_seconds, self.mid_step = mid_seconds, mid_step
        self.windows = tuple(sorted(set(windows)))
        self._samples: deque[TargetSample] = deque()
        self._layout: Layout | None = None
        self._last_raw: dict[tuple, float] = {}
        self._offset: dict[tuple, float] = {}
        self._prev = array("d")
        self._add = array("d")
        self._offsets = False  # whether any slot of _add is not 0: the usual poll skips adding
        self._started: tuple = (None, {})  # (process start, series key -> _created) last seen
        self.steps_back: list[str] = []  # the counters the last append held (see RESET_FRACTION)
        self.logs: dict[str, ModelLog] = {}
        self.running: dict[str, dict[float, _Running]] = {}
        self._view: Samples | None = None

    def append(self, t: float, snapshot: Snapshot) -> TargetSample | None:
        if self._samples and t <= self._samples[-1].t:
            return None  # out-of-order or duplicate time: the earlier sample stands
        keys, units, bounds, rows = [], [], [], []
        created = {}
        for s in snapshot.series:
            values, b, unit = _raw_values(s)
            keys.append(s.key)
            units.append(unit)
            bounds.append(b)
            rows.append(values)
            if s.created is not None:
                created[s.key] = s.created
        restarted = self._restarted(snapshot.process_start_time, created)
        layout = self._layout
        if layout is None or layout.keys != tuple(keys) or layout.units != tuple(units) or layout.bounds != tuple(bounds):
            self._save_adjustments()
            layout = self._layout = Layout.build(keys, units, bounds)
            self._load_adjustments(layout)
        raw = array("d")
        for values in rows:
            raw.extend(values)
        flat = self._adjusted(raw, layout, restarted)
        sample = TargetSample(t, layout, flat)
        previous = self._samples[-1] if self._samples else None
        self._samples.append(sample)
        self._log(previous, sample)
        self._prune(t)
        self._view = None
        return sample

    def _log(self, prev: TargetSample | None, cur: TargetSample) -> None:
        q_i, h_i, s_i, c_i, kv_i = _SLOT["queries"], _SLOT["hits"], _SLOT["ttft_sum"], _SLOT["ttft_count"], _SLOT["kv_cache_usage"]
        cur_layout, cv = cur.layout, cur.values
        # the usual poll: the same series as the one before, so one vector of differences
        same = prev is not None and prev.layout is cur_layout
        getter = cur_layout.counters_of
        delta = array("d", map(sub, getter(cv), getter(prev.values))) if same else None
        single_base, position, n = cur_layout.single_base, cur_layout.position, len(COUNTERS)
        for model, keys in cur_layout.by_model.items():
            dq = dh = ds = dc = 0.0
            kv = NAN
            base = single_base.get(model) if same else None
            if base is not None:
                at = position[keys[0]] * n  # where the series' counters sit in the compact delta
                a, b = delta[at + q_i], delta[at + h_i]
                if a == a and b == b:
                    dq, dh = a, b
                a, b = delta[at + s_i], delta[at + c_i]
                if a == a and b == b:
                    ds, dc = a, b
                kv = cv[base + kv_i]
                keys = ()
            for key in keys:
                base = cur_layout.offsets[cur_layout.position[key]]
                usage = cv[base + kv_i]
                if usage == usage and not usage <= kv:
                    kv = usage
                if prev is None:
                    continue
                j = prev.layout.position.get(key)
                if j is None:
                    continue
                pbase, pv = prev.layout.offsets[j], prev.values
                q0, q1, h0, h1 = pv[pbase + q_i], cv[base + q_i], pv[pbase + h_i], cv[base + h_i]
                if q0 == q0 and q1 == q1 and h0 == h0 and h1 == h1:
                    dq += q1 - q0
                    dh += h1 - h0
                s0, s1, c0, c1 = pv[pbase + s_i], cv[base + s_i], pv[pbase + c_i], cv[base + c_i]
                if s0 == s0 and s1 == s1 and c0 == c0 and c1 == c1:
                    ds += s1 - s0
                    dc += c1 - c0
            x = y = NAN
            if dq > 0 and dc > 0:
                x, y = min(1.0, max(0.0, dh / dq)), ds / dc
            log = self.logs.get(model)
            if log is None:
                log = self.logs[model] = ModelLog()
            log.append(cur.t, prev.t if prev is not None else cur.t, dq, dh, x, y, kv)
            running = self.running.get(model)
            if running is None:
                running = self.running[model] = {w: _Running(w, len(log) - 1) for w in self.windows}
            _advance(running.values(), log, len(log) - 1, cur.t)

    # Reset adjustment, vectorised over the layout: `_prev` holds the last raw value of
    # every slot (-inf for gauges, which are never adjusted), `_add` what resets added.
    # Between layout changes they are arrays aligned with the sample; at a change they
    # go through `_last_raw` / `_offset`, keyed by slot, so no series loses its offset.
    def _restarted(self, process_start: float | None, created: dict) -> bool:
        """Whether the target's process start time or a series' `_created` changed since
        the last append: then every decrease is a reset, however small."""
        before, before_created = self._started
        self._started = (process_start if process_start is not None else before, {**before_created, **created})
        if process_start is not None and before is not None and process_start != before:
            return True
        return any(key in before_created and before_created[key] != value for key, value in created.items())

    def _adjusted(self, raw: array, layout: Layout, restarted: bool = False) -> array:
        prev, add = self._prev, self._add
        self.steps_back = []
        if True in map(lt, raw, prev):  # a counter went down: a reset or a step back (rare)
            for i in [i for i, down in enumerate(map(lt, raw, prev)) if down]:
                if restarted or is_reset(prev[i], raw[i]):
                    add[i] += prev[i]
                    self._offsets = True
                else:
                    self.steps_back.append(self._describe_slot(layout, i, prev[i], raw[i]))
                    raw[i] = prev[i]  # held: the increase is 0 until the counter passes it again
        # sized exactly, kept for an hour; a copy alone while no counter of the layout was reset
        flat = array("d", list(map(operator_add, raw, add))) if self._offsets else raw[:]
        new_prev = raw
        # a value absent this time (NaN) keeps the last one seen; compress walks only the NaNs
        for i in compress(range(len(raw)), map(ne, raw, raw)):
            p = prev[i]
            if p == p:
                new_prev[i] = p
        for i in layout.gauges:
            new_prev[i] = -math.inf
        self._prev = new_prev
        return flat

    @staticmethod
    def _describe_slot(layout: Layout, pos: int, before: float, after: float) -> str:
        i = bisect_right(layout.offsets, pos) - 1
        j = pos - layout.offsets[i]
        name = COUNTERS[j] if j < len(COUNTERS) else "ttft bucket"
        model, engine = layout.keys[i]
        return (f"model_name={model!r} engine={engine!r}: the {name} counter stepped back from {before:.17g} to "
                f"{after:.17g} with no restart; held at {before:.17g}, not taken for a reset")

    def _slots(self, layout: Layout):
        for i, key in enumerate(layout.keys):
            base, b = layout.offsets[i], layout.bounds[i]
            for j in range(len(_FIXED) + (len(b) if b else 0)):
                yield base + j, ((key, j) if j < len(_FIXED) else (key, j, b))

    def _save_adjustments(self) -> None:
        layout = self._layout
        if layout is None:
            return
        for pos, slot in self._slots(layout):
            if pos in layout.gauge_set:
                continue
            if self._prev[pos] == self._prev[pos]:
                self._last_raw[slot] = self._prev[pos]
            if self._add[pos]:
                self._offset[slot] = self._add[pos]

    def _load_adjustments(self, layout: Layout) -> None:
        prev = array("d", [NAN]) * layout.size
        add = array("d", [0.0]) * layout.size
        for pos, slot in self._slots(layout):
            prev[pos] = self._last_raw.get(slot, NAN)
            add[pos] = self._offset.get(slot, 0.0)
        for pos in layout.gauges:
            prev[pos] = -math.inf
            add[pos] = 0.0
        self._prev, self._add = prev, add
        self._offsets = any(add)

    def _prune(self, now: float) -> None:
        samples = self._samples
        horizon = now - self.keep_seconds
        first_layout = samples[0].layout
        # keep one sample at or before the horizon so a full window has a left edge
        while len(samples) > 2 and samples[1].t <= horizon:
            samples.popleft()
        # thin the part older than the fine horizon to one sample per coarse step
        fine = now - self.fine_seconds
        if len(samples) >= 3 and samples[1].t <= fine:
            kept: list[TargetSample] = []
            while len(samples) > 1 and samples[0].t <= fine:
                s = samples.popleft()
                step = self.mid_step if now - s.t <= self.mid_seconds else self.coarse_step
                if not kept or s.t - kept[-1].t >= step or samples[0].t > fine:
                    kept.append(s)
            samples.extendleft(reversed(kept))
        for model in list(self.logs):
            log = self.logs[model]
            shift = log.prune(horizon)
            if shift:
                for r in self.running[model].values():
                    r.shift(shift)
            if log.start >= len(log):  # the model has not been seen for the whole history
                del self.logs[model]
                del self.running[model]
        if samples[0].layout is not first_layout:
            self._forget_gone_series()

    def _forget_gone_series(self) -> None:
        """Reset offsets of series no sample holds any more: a target whose models come
        and go must not grow these maps forever."""
        alive = set()
        seen_layouts = set()
        for s in self._samples:
            if id(s.layout) not in seen_layouts:
                seen_layouts.add(id(s.layout))
                alive.update(s.layout.keys)
        for slot in [k for k in self._last_raw if k[0] not in alive]:
            self._last_raw.pop(slot, None)
            self._offset.pop(slot, None)
        start, created = self._started
        self._started = (start, {k: v for k, v in created.items() if k in alive})

    def retarget(self, keep_seconds: float, windows: Sequence[float]) -> None:
        """A reload changed the windows: keep every sample, track the new windows."""
        self.keep_seconds = keep_seconds
        self.fine_seconds = min(self.fine_seconds, keep_seconds) if self.fine_seconds else keep_seconds
        windows = tuple(sorted(set(windows)))
        if windows == self.windows:
            return
        self.windows = windows
        for model, log in self.logs.items():
            running = self.running[model] = {}
            for w in windows:
                r = running[w] = _Running(w, log.start)
                for i in range(log.start, len(log)):
                    r.update(log, i, log.t[i])
        self._view = None

    def samples(self) -> Samples:
        if self._view is None:
            logs = {m: (log.t, log.t_start, log.q, log.h, log.x, log.y, log.kv, log.start, len(log)) for m, log in self.logs.items()}
            self._view = Samples(tuple(self._samples), logs, self.running)
        return self._view

    def __len__(self) -> int:
        return len(self._samples)


# --- PromQL building blocks ------------------------------------------------------------
def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile over (upper bound, cumulative count) pairs."""
    return histogram_quantiles((q,), buckets)[0]


def histogram_quantiles(qs: Sequence[float], buckets: Sequence[tuple[float, float]]) -> list[float]:
    """Several quantiles of one histogram: the buckets are sorted, merged and made
    monotonic once."""
    ordered = sorted(buckets, key=lambda b: b[0])
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return [_outside(q) if _outside(q) is not None else math.nan for q in qs]
    ordered = _monotonic(_coalesce(ordered))
    out = []
    for q in qs:
        edge = _outside(q)
        out.append(edge if edge is not None else _quantile(q, ordered))
    return out


def _outside(q: float) -> float | None:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    return None


def _quantile(q: float, ordered: list[tuple[float, float]]) -> float:
    if len(ordered) < 2:
        return math.nan
    observations = ordered[-1][1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    b = next(i for i, (_, c) in enumerate(ordered) if c >= rank)
    if b == len(ordered) - 1:
        return ordered[-2][0]
    if b == 0 and ordered[0][0] <= 0:
        return ordered[0][0]
    start, end, count = 0.0, ordered[b][0], ordered[b][1]
    if b > 0:
        start = ordered[b - 1][0]
        count -= ordered[b - 1][1]
        rank -= ordered[b - 1][1]
    if count == 0:
        return math.nan  # 0/0, as PromQL computes it (q=0 with an empty first bucket)
    return start + (end - start) * (rank / count)


def _coalesce(ordered: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for le, c in ordered:
        if out and out[-1][0] == le:
            out[-1] = (le, out[-1][1] + c)
        else:
            out.append((le, c))
    return out


def _monotonic(ordered: list[tuple[float, float]]) -> list[tuple[float, float]]:
    # Buckets scraped non-atomically can dip; PromQL lifts each to the running maximum.
    out = [ordered[0]]
    top = ordered[0][1]
    for le, c in ordered[1:]:
        if c > top:
            top = c
        elif c < top:
            c = top
        out.append((le, c))
    return out


def pearson(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """(r, slope of y on x), or None with fewer than three points or no spread."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    if sxx <= 0 or syy <= 0:
        return None
    return sxy / math.sqrt(sxx * syy), sxy / sxx


# --- the summary of one window ---------------------------------------------------------
class _WindowValues(NamedTuple):
    window: str
    seconds: float
    query_increase: float | None
    hit_increase: float | None
    unit: str | None
    hit_ratio: float | None
    query_rate: float | None
    hit_rate: float | None
    external_hit_ratio: float | None
    ttft_mean: float | None
    ttft_count_increase: float | None
    correlation: float | None
    ttft_per_10_points: float | None
    prompt_token_increase: float | None
    preemption_increase: float | None
    kv_cache_usage_max: float | None
    samples: int
    admitted_hit_increase: float | None  # tokens served from cache, counted once per request as it is scheduled
    admitted_prompt_increase: float | None  # prompt tokens over the same time
    admitted_hit_ratio: float | None
    lazy_ttft: "_LazyTTFT"


class _TTFTSource:
    """What the windows of one summary share: the samples, the window's layout runs."""

    __slots__ = ("view", "runs", "lo", "hi")

    def __init__(self, view, runs, lo: int, hi: int):
        self.view, self.runs, self.lo, self.hi = view, runs, lo, hi


class _LazyTTFT:
    """Where a window's TTFT bucket increase comes from (a shared source and the model's
    series, or explicit edges), and its quantiles once asked for."""

    __slots__ = ("source", "keys", "quantiles")

    def __init__(self, source: _TTFTSource | None = None, keys=None):
        self.source, self.keys, self.quantiles = source, keys, None

    def compute(self) -> dict[float, float]:
        if self.quantiles is None:
            quantiles = {}
            src = self.source
            if src is not None:
                edges = self.keys if isinstance(self.keys, dict) else {k: (src.lo, src.hi - 1) for k in self.keys}
                buckets = _ttft_bucket_increase(src.view, src.runs, edges)
                if buckets is not None:
                    for q, value in zip(QUANTILES, histogram_quantiles(QUANTILES, buckets)):
                        if not math.isnan(value):
                            quantiles[q] = value
            self.quantiles = quantiles
            self.source = self.keys = None  # let the samples go
        return self.quantiles


class WindowStats(_WindowValues):
    """Derived values of one (model_name, window); None where there is too little data.

    Read-only (a tuple). TTFT quantiles are computed when first asked for (by the
    collector, or the TTFT rule once its cheap tests pass), not at every poll: most
    polls never need them, and at thousands of models they were most of a poll's cost."""

    __slots__ = ()

    def __new__(cls, ttft: _LazyTTFT | None = None, **values):
        return super().__new__(cls, lazy_ttft=ttft or _LazyTTFT(), **values)

    @property
    def ttft_quantiles(self) -> dict[float, float]:
        """p50/p90/p99 of the window's TTFT bucket increase (histogram_quantile)."""
        return self.lazy_ttft.compute()


def _key_edges(view: Samples, runs: list[tuple[Layout, int, int]], key: SeriesKey) -> tuple[int, int] | None:
    """First and last sample index holding `key` among the clipped runs."""
    first = last = None
    for layout, a, b in runs:
        if key in layout.position:
            if first is None:
                first = a
            last = b
    return None if first is None else (first, last)


def _increases(view: Samples, edges: dict) -> list[float | None]:
    """Increase of every counter slot, summed over engines, in one pass; None for a
    counter no engine has twice. The values are reset-adjusted already."""
    n = len(COUNTERS)
    totals = [0.0] * n
    seen = [False] * n
    for key, (a, b) in edges.items():
        if a == b:
            continue
        sa, sb = view[a], view[b]
        va, vb = sa.values, sb.values
        oa = sa.layout.offsets[sa.layout.position[key]]
        ob = sb.layout.offsets[sb.layout.position[key]]
        for j in range(n):
            x, y = va[oa + j], vb[ob + j]
            if x == x and y == y:
                totals[j] += y - x
                seen[j] = True
    return [t if s else None for t, s in zip(totals, seen)]


def _ttft_bucket_increase(view: Samples, runs, edges: dict) -> list[tuple[float, float]] | None:
    """Per-bucket increase summed over engines. A series whose bucket layout changed in
    the window (a restart with other buckets) contributes only its latest layout."""
    summed: dict[float, float] = {}
    seen = False
    for key in edges:
        holding = [(layout, a, b) for layout, a, b in runs if key in layout.position and layout.bounds[layout.position[key]]]
        if not holding:
            continue
        layout, _, last = holding[-1]
        bounds = layout.bounds[layout.position[key]]
        first = holding[-1][1]
        for other, a, _ in reversed(holding[:-1]):
            if other.bounds[other.position[key]] != bounds:
                break
            first = a
        if first == last:
            continue
        _, row_a = view[first].buckets(key)
        _, row_b = view[last].buckets(key)
        for le, a, b in zip(bounds, row_a, row_b):
            summed[le] = summed.get(le, 0.0) + (b - a)
        seen = True
    return sorted(summed.items()) if seen else None


@dataclass(frozen=True)
class Interval:
    """What happened between two consecutive polls of one model, summed over engines."""

    start: float
    end: float
    query_tokens: float
    hit_tokens: float
    ttft_sum: float
    ttft_count: float
    kv_cache_usage: float | None

    @property
    def hit_ratio(self) -> float | None:
        return ratio(self.hit_tokens, self.query_tokens) if self.query_tokens > 0 else None


def recent_intervals(view: Samples, model_name: str, since: float) -> list[Interval]:
    """The model's per-poll intervals that ended after `since`, from its log: O(intervals)."""
    log = view.logs.get(model_name)
    if log is None:
        return []
    t, t_start, q, h, _, _, kv, start, end = log
    lo = bisect_right(t, since, start, end)
    out = []
    for i in range(lo, end):
        if t_start[i] == t[i]:
            continue  # the model's first poll: no interval yet
        usage = kv[i]
        out.append(Interval(t_start[i], t[i], q[i], h[i], 0.0, 0.0, usage if usage == usage else None))
    return out


def last_hit_time(view: Samples, model_name: str) -> float | None:
    """When the model's lookup hits last grew, from its log (the rare path of a rule)."""
    log = view.logs.get(model_name)
    if log is None:
        return None
    t, _, _, h, _, _, _, start, end = log
    for i in range(end - 1, start - 1, -1):
        if h[i] > 0:
            return t[i]
    return None


def interval_sums(view: Samples, model_name: str, *edges: float) -> list[tuple[float, float, int]]:
    """For consecutive spans (e0, e1], (e1, e2], ...: (query tokens, hit tokens, intervals)
    of the model's poll intervals that ended in each, from its log without building
    objects: a cheap first test."""
    log = view.logs.get(model_name)
    if log is None:
        return [(0.0, 0.0, 0)] * (len(edges) - 1)
    t, t_start, q, h, _, _, _, start, end = log
    cuts = [bisect_right(t, e, start, end) for e in edges]
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        # only a model's very first entry has no interval (its start is its own time)
        n = hi - lo - (1 if lo < hi and t_start[lo] == t[lo] else 0)
        queries = sum(q[lo:hi])
        out.append((queries, min(sum(h[lo:hi]), queries), n))  # hits above queries are all hits
    return out


def _log_fit_and_kv(view: Samples, model: str, now: float, seconds: float, with_kv: bool) -> tuple[tuple[float, float] | None, float | None]:
    """Correlation fit and KV max over (now - seconds, now]: running sums when this is the
    history's latest moment and a tracked window, else a scan of the log."""
    log = view.logs.get(model)
    if log is None:
        return None, None
    t, t_start, _, _, x, y, kv, start, end = log
    running = view.running.get(model, {}).get(seconds)
    if running is not None and end and t[end - 1] == now and view.times and view.times[-1] == now:
        return running.fit(), running.kv_max()
    edge = now - seconds
    hi = bisect_right(t, now, start, end)
    lo = bisect_right(t_start, edge, start, hi)  # starts are the previous poll times: sorted
    n = sx = sy = sxy = sxx = syy = 0.0
    for i in range(lo, hi):
        if t_start[i] <= edge:
            continue
        xi, yi = x[i], y[i]
        if xi == xi and yi == yi:
            n += 1
            sx += xi
            sy += yi
            sxy += xi * yi
            sxx += xi * xi
            syy += yi * yi
    kv_max = None
    if with_kv:
        for i in range(bisect_right(t, edge, start, hi), hi):
            v = kv[i]
            if v == v and (kv_max is None or v > kv_max):
                kv_max = v
    return _fit(n, sx, sy, sxy, sxx, syy), kv_max


def window_stats(
    samples,
    model_name: str,
    now: float,
    window: str,
    seconds: float,
    min_query_tokens: float,
    block_size: int | None = None,
    detailed: bool = True,
) -> WindowStats:
    """One (model, window) over (now - seconds, now]. Costs O(engines x layouts in the
    window), not O(samples): increases come from the first and last sample holding each
    series, since values are reset-adjusted. `detailed` adds the correlation and KV max."""
    view = _as_samples(samples)
    lo, hi = view.span(now - seconds, now)
    runs = view.clipped_runs(lo, hi)
    edges = {}
    units = set()
    for layout, _, _ in runs:
        for key in layout.by_model.get(model_name, ()):
            if key not in edges:
                edges[key] = _key_edges(view, runs, key)
            u = layout.units[layout.position[key]]
            if u is not None:
                units.add(u)
    unit = units.pop() if len(units) == 1 else None
    return _stats(view, model_name, now, window, seconds, lo, hi, _increases(view, edges), unit,
                  _LazyTTFT(_TTFTSource(view, runs, lo, hi), edges), min_query_tokens, block_size, detailed)


def _stats(view: Samples, model_name: str, now: float, window: str, seconds: float, lo: int, hi: int,
           increase: list[float | None], unit: str | None, ttft: "_LazyTTFT", min_query_tokens: float,
           block_size: int | None, detailed: bool) -> WindowStats:
    queries, hits = increase[0], increase[1]
    admitted_hits, admitted_prompt, admitted_ratio = _admitted(increase, min_query_tokens)
    span = view.times[hi - 1] - view.times[lo] if hi - lo >= 2 else 0.0
    # the floor is in tokens; a 0.8.x target counts blocks
    query_tokens = None if queries is None else queries * ((block_size or 16) if unit == "blocks" else 1)
    hit_ratio = None
    if queries is not None and hits is not None and query_tokens is not None and query_tokens >= max(min_query_tokens, 1e-12) and unit is not None:
        hit_ratio = ratio(hits, queries)
    ext_q, ext_h, ttft_sum, ttft_count = increase[2], increase[3], increase[4], increase[5]
    fit, kv_max = _log_fit_and_kv(view, model_name, now, seconds, detailed) if detailed else (None, None)
    return WindowStats(
        ttft=ttft,
        window=window,
        seconds=seconds,
        query_increase=queries,
        hit_increase=hits,
        unit=unit,
        hit_ratio=hit_ratio,
        query_rate=queries / span if queries is not None and span > 0 else None,
        hit_rate=hits / span if hits is not None and span > 0 else None,
        external_hit_ratio=ratio(ext_h, ext_q) if ext_q and ext_h is not None else None,
        ttft_mean=ttft_sum / ttft_count if ttft_sum is not None and ttft_count else None,
        ttft_count_increase=ttft_count,
        correlation=fit[0] if fit else None,
        ttft_per_10_points=fit[1] * 0.1 if fit else None,
        prompt_token_increase=increase[6],
        preemption_increase=increase[7],
        kv_cache_usage_max=kv_max,
        samples=hi - lo,
        admitted_hit_increase=admitted_hits,
        admitted_prompt_increase=admitted_prompt,
        admitted_hit_ratio=admitted_ratio,
    )


def _admitted(increase: list[float | None], min_tokens: float) -> tuple[float | None, float | None, float | None]:
    """(hit tokens, prompt tokens, ratio) from the admitted-prefill counters: local cache
    hits by source (less the recomputed last token of 0.16-0.19), else all cached tokens
    less those an external connector brought; None where the target has neither."""
    prompt, local, recomputed, cached, external = increase[6], increase[8], increase[9], increase[10], increase[11]
    if local is not None:
        hits = local - (recomputed or 0.0)
    elif cached is not None:
        hits = cached - (external or 0.0)
    else:
        return None, None, None
    if prompt is None:
        return hits, None, None
    return hits, prompt, (ratio(hits, prompt) if prompt >= max(min_tokens, 1e-12) else None)


def _window_of_one_layout(view: Samples, now: float, window: str, seconds: float, lo: int, hi: int, layout: Layout,
                          models, min_query_tokens: float, block_size: int | None) -> dict[str, WindowStats]:
    """Every model of a window whose samples share one layout (the usual case): the
    increases of all series come from one vector of last - first, and the correlation
    and KV maximum from the running sums when `now` is the latest sample."""
    first, last = view[lo], view[hi - 1]
    getter = layout.counters_of
    delta = array("d", map(sub, getter(last.values), getter(first.values)))
    n = len(COUNTERS)
    position = layout.position
    span = view.times[hi - 1] - view.times[lo]
    floor = max(min_query_tokens, 1e-12)
    latest = bool(view.times) and view.times[-1] == now
    source = _TTFTSource(view, [(layout, lo, hi - 1)], lo, hi)
    running_of = view.running if latest else {}
    by_model, unit_of_model = layout.by_model, layout.unit_of_model
    blocks = block_size or 16
    increases = [d if d == d else None for d in delta]  # one pass for every series; a model slices its own
    out = {}
    for model in models:
        keys = by_model.get(model)
        if not keys:
            continue
        if len(keys) == 1:
            base = position[keys[0]] * n
            increase = increases[base:base + n]
        else:
            totals = [0.0] * n
            seen = [False] * n
            for key in keys:
                base = position[key] * n
                for j in range(n):
                    d = delta[base + j]
                    if d == d:
                        totals[j] += d
                        seen[j] = True
            increase = [t if s else None for t, s in zip(totals, seen)]
        queries, hits, ext_q, ext_h, ttft_sum, ttft_count, prompt, preempt = increase[:8]
        a_hits, a_prompt, a_ratio = _admitted(increase, min_query_tokens)
        unit = unit_of_model[model]
        hit_ratio = None
        if queries is not None and hits is not None and unit is not None and \
                queries * (blocks if unit == "blocks" else 1) >= floor:
            hit_ratio = min(1.0, max(0.0, hits / queries))
        running = running_of.get(model)
        running = running.get(seconds) if running is not None else None
        if running is not None:
            fit = _fit(running.n, running.sx, running.sy, running.sxy, running.sxx, running.syy) if running.n >= 3 else None
            kv_max = running.kv[0][1] if running.kv else None
        else:
            fit, kv_max = _log_fit_and_kv(view, model, now, seconds, True)
        # positional, in _WindowValues' field order: the hot path of a poll
        out[model] = tuple.__new__(WindowStats, (
            window, seconds, queries, hits, unit, hit_ratio,
            queries / span if queries is not None and span > 0 else None,
            hits / span if hits is not None and span > 0 else None,
            min(1.0, max(0.0, ext_h / ext_q)) if ext_q and ext_h is not None else None,
            ttft_sum / ttft_count if ttft_sum is not None and ttft_count else None,
            ttft_count, fit[0] if fit else None, fit[1] * 0.1 if fit else None, prompt, preempt, kv_max, hi - lo,
            a_hits, a_prompt, a_ratio, _LazyTTFT(source, keys)))
    return out


def stats_between(samples, model_name: str, start: float, end: float,
                  min_query_tokens: float, block_size: int | None = None, detailed: bool = False) -> WindowStats:
    """The window (start, end]: for baselines before an event and the time after it."""
    return window_stats(samples, model_name, end, "", max(end - start, 1e-9), min_query_tokens, block_size, detailed)


def summarize(
    samples,
    now: float,
    windows: Sequence[tuple[str, float]],
    min_query_tokens: float,
    block_size: int | None = None,
) -> dict[str, dict[str, WindowStats]]:
    """model_name -> window name -> WindowStats, for every model seen in the longest
    window: a model that vanished drops out once no window holds it."""
    view = _as_samples(samples)
    if not windows:
        return {}
    longest = max(s for _, s in windows)
    models = sorted(view.models(*view.span(now - longest, now)))
    out: dict[str, dict[str, WindowStats]] = {m: {} for m in models}
    for name, secs in windows:
        lo, hi = view.span(now - secs, now)
        runs = view.clipped_runs(lo, hi)
        fast = {}
        if len(runs) == 1 and hi - lo >= 2:
            fast = _window_of_one_layout(view, now, name, secs, lo, hi, runs[0][0], models, min_query_tokens, block_size)
        for m in models:
            out[m][name] = fast.get(m) or window_stats(view, m, now, name, secs, min_query_tokens, block_size)
    return out
