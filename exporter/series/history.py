"""A target's scrape history: samples stored reset-adjusted, kept and thinned as far back
as the longest window needs, and per model a log of each poll with running sums. Pure:
samples and `now` in; no clock, no I/O.

Counters follow PromQL (after a reset the new value is the increase since it), with one
departure on purpose, explained at RESET_FRACTION: PromQL takes every decrease for a
reset, so a hits counter that steps back by one token adds its whole value to a window
(a ratio of 41 where it is 50%). Here a decrease is a reset only when the process
restarted (its start time or a `_created` changed) or the counter fell to at most
RESET_FRACTION of its last value, as a fresh process's counters do. A smaller step back
is held at the last value for one poll (an increase of 0, never negative): a misread
comes back to it at the next one. One still below it a poll later lost part of its sum
(a worker of several restarted): it counts on from its new value, never adding what it
had counted again, and never standing still until it passes the old value (which, for a
40% step of a counter a day old, would be most of a day of hits counted as none: a
"drop" the change point took for a prompt change). Both are listed in
`History.steps_back` for the poll's warnings.
"""
from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import MutableMapping, Sequence
from itertools import compress
from operator import add as operator_add
from operator import lt, ne, sub
from weakref import WeakValueDictionary

from ..parse.snapshot import Snapshot
from .modellog import ModelLog, RunningSums, advance
from .samples import _FIXED, _SLOT, COUNTERS, NAN, TIER_BASE, TIER_SLOTS, Layout, Samples, TargetSample, add_to_runs

# A counter that falls to at most this fraction of its last value was reset; one that
# falls less stepped back (a non-atomic read, float rounding in a sum of processes): the
# restart of a process that had counted for a while leaves far less than half behind.
RESET_FRACTION = 0.5


def is_reset(before: float, after: float) -> bool:
    """Whether a counter going from `before` to `after` (lower) was reset, with no other
    sign of a restart: see RESET_FRACTION."""
    return after <= before * RESET_FRACTION


_TIER_OF = {"device": "device", "host": "host", "storage": "storage", "disk": "storage", "unattributed": "unattributed"}


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
    if s.cached_tokens_by_tier:
        tiers = [None] * len(TIER_SLOTS)
        for name, value in s.cached_tokens_by_tier:
            k = TIER_SLOTS.index(_TIER_OF.get(name, "external"))
            tiers[k] = (tiers[k] or 0.0) + value
        fixed[TIER_BASE:TIER_BASE] = tiers
    else:
        fixed[TIER_BASE:TIER_BASE] = [None] * len(TIER_SLOTS)
    values = [NAN if v is None else float(v) for v in fixed]
    bounds = None
    if complete:
        bounds, counts = zip(*h.buckets)
        values.extend(counts)
    return values, bounds, (pc.unit if pc else None)


class History:
    """A target's samples, reset-adjusted, kept as far back as the longest window needs.

    Samples newer than `fine_seconds` are all kept; older ones are thinned to one per
    `mid_step` up to `mid_seconds` of age, to one per `coarse_step` up to a coarse step past
    `far_seconds` (far_edge), and beyond that to one per thirtieth of the shortest window
    reaching there (far_step), which the adjusted counters allow without changing any
    increase: only the left edges of the long windows become that coarse (30 s of 15
    minutes, 2 minutes of an hour). `far_seconds` is how far
    back reads that end before now reach (Config.anchored_seconds: a deploy's baseline before
    it): those keep one sample per `coarse_step` (a 5-minute baseline of 2 samples left a
    quiet pod's deploy inconclusive).
    Per model, a ModelLog keeps what happened at each poll, with running sums for the
    `windows` given, so that a poll costs O(series x windows) whatever the history holds.
    Not thread-safe for writers: one poll job per target appends; `samples()` gives
    readers a view that later appends do not change."""

    def __init__(self, keep_seconds: float, fine_seconds: float | None = None, coarse_step: float = 60.0,
                 windows: Sequence[float] = (), mid_seconds: float = 0.0, mid_step: float = 0.0,
                 layouts: MutableMapping | None = None, far_seconds: float = math.inf):
        self.keep_seconds = keep_seconds
        # (keys, units, bounds) -> its Layout, shared with the other histories given the same mapping: the
        # pods of a fleet have one layout, and one a target was some 2 KB of dicts and tuples each
        self.layouts = layouts if layouts is not None else WeakValueDictionary()
        self.fine_seconds = keep_seconds if fine_seconds is None else min(fine_seconds, keep_seconds)
        self.coarse_step = coarse_step
        self.mid_seconds, self.mid_step = mid_seconds, mid_step
        self.windows = tuple(sorted(set(windows)))
        self.far_seconds = far_seconds  # see far_edge
        self._times = array("d")
        # stretches of samples sharing a layout: [layout, values (layout.size a sample), first index, samples].
        # Values are only appended to; pruning builds new arrays, so a view's stay as they were
        self._runs: list[list] = []
        self._last: TargetSample | None = None
        self._pruned_at: float | None = None  # the `now` of the last prune: what it kept older than that stays kept
        self._layout: Layout | None = None
        self._last_raw: dict[tuple, float] = {}
        self._offset: dict[tuple, float] = {}
        self._prev = array("d")
        self._add = array("d")
        self._offsets = False  # whether any slot of _add is not 0: the usual poll skips adding
        self._held: dict[int, float] = {}  # slot -> the raw value it stepped back to, held since the last poll
        self._start: float | None = None  # the process start time last seen
        self._created: dict = {}  # series key -> its `_created` last seen
        self.steps_back: list[str] = []  # the counters the last append held (see RESET_FRACTION)
        self.logs: dict[str, ModelLog] = {}
        self.running: dict[str, dict[float, RunningSums]] = {}
        self._view: Samples | None = None

    def append(self, t: float, snapshot: Snapshot) -> TargetSample | None:
        if self._times and t <= self._times[-1]:
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
        shape = (tuple(keys), tuple(units), tuple(bounds))
        if layout is None or (layout.keys, layout.units, layout.bounds) != shape:
            self._save_adjustments()
            layout = self.layouts.get(shape)
            if layout is None:
                layout = self.layouts[shape] = Layout.build(*shape)
            self._layout = layout
            self._load_adjustments(layout)
        raw = array("d")
        for values in rows:
            raw.extend(values)
        flat = self._adjusted(raw, layout, restarted)
        sample = TargetSample(t, layout, flat)
        previous, self._last = self._last, sample
        add_to_runs(self._runs, layout, flat, len(self._times))
        self._times.append(t)
        self._log(previous, sample)
        self._prune(t)
        self._view = None
        return sample

    def _log(self, prev: TargetSample | None, cur: TargetSample) -> None:
        q_i, h_i, s_i, c_i, kv_i = _SLOT["queries"], _SLOT["hits"], _SLOT["ttft_sum"], _SLOT["ttft_count"], _SLOT["kv_cache_usage"]
        e_i = _SLOT["external_hits"]  # a connector's hits: the log's hits are every tier's (hitratio.py)
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
                    e = delta[at + e_i]
                    if e == e:
                        dh += e
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
                    e0, e1 = pv[pbase + e_i], cv[base + e_i]
                    if e0 == e0 and e1 == e1:
                        dh += e1 - e0
                s0, s1, c0, c1 = pv[pbase + s_i], cv[base + s_i], pv[pbase + c_i], cv[base + c_i]
                if s0 == s0 and s1 == s1 and c0 == c0 and c1 == c1:
                    ds += s1 - s0
                    dc += c1 - c0
            x = y = NAN
            if dq > 0 and dc > 0:
                x, y = dh / dq, ds / dc
                x = 1.0 if x > 1.0 else x  # hits above queries; no builtin call: this runs per model and poll
            log = self.logs.get(model)
            if log is None:
                log = self.logs[model] = ModelLog()
            log.append(cur.t, prev.t if prev is not None else cur.t, dq, dh, x, y, kv)
            running = self.running.get(model)
            if running is None:
                running = self.running[model] = {w: RunningSums(w, len(log) - 1) for w in self.windows}
            advance(running.values(), log, len(log) - 1, cur.t)

    # Reset adjustment, vectorised over the layout: `_prev` holds the last raw value of
    # every slot (-inf for gauges, which are never adjusted), `_add` what resets added.
    # Between layout changes they are arrays aligned with the sample; at a change they
    # go through `_last_raw` / `_offset`, keyed by slot, so no series loses its offset.
    def _restarted(self, process_start: float | None, created: dict) -> bool:
        """Whether the target's process start time or a series' `_created` changed since
        the last append: then every decrease is a reset, however small."""
        before, known = self._start, self._created
        changed = process_start is not None and before is not None and process_start != before
        if process_start is not None:
            self._start = process_start
        if created and created != known:  # a C-speed compare: the usual poll changes nothing
            changed = changed or any(key in known and known[key] != value for key, value in created.items())
            known.update(created)
        return changed

    def _adjusted(self, raw: array, layout: Layout, restarted: bool = False) -> array:
        prev, add, held = self._prev, self._add, self._held
        self.steps_back = []
        if held:  # a counter back at (or past) the value it stepped back from: that was a misread
            for i in [i for i in held if not raw[i] < prev[i]]:
                del held[i]
        if True in map(lt, raw, prev):  # a counter went down: a reset or a step back (rare)
            for i in [i for i, down in enumerate(map(lt, raw, prev)) if down]:
                if restarted or is_reset(prev[i], raw[i]):
                    add[i] += prev[i]
                    self._offsets = True
                    held.pop(i, None)
                elif i in held:
                    # still below a poll later: not a misread but part of a summed counter
                    # reset (a worker of several restarted). It counts on from its new
                    # value; held for good, its hits would stand still for as long as the
                    # lost part took to count, read as a drop of the ratio
                    stepped_to = min(held.pop(i), raw[i])
                    add[i] += prev[i] - stepped_to
                    self._offsets = True
                    self.steps_back.append(self._describe_slot(layout, i, prev[i], stepped_to, rebased=True))
                else:
                    self.steps_back.append(self._describe_slot(layout, i, prev[i], raw[i]))
                    held[i] = raw[i]
                    raw[i] = prev[i]  # held for this poll: a misread comes back at the next one
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
    def _describe_slot(layout: Layout, pos: int, before: float, after: float, rebased: bool = False) -> str:
        i = bisect_right(layout.offsets, pos) - 1
        j = pos - layout.offsets[i]
        name = COUNTERS[j] if j < len(COUNTERS) else "ttft bucket"
        model, engine = layout.keys[i]
        if rebased:
            return (f"model_name={model!r} engine={engine!r}: the {name} counter stayed below {before:.17g} a poll after "
                    f"stepping back to {after:.17g}: part of a summed counter was reset; it counts on from there")
        return (f"model_name={model!r} engine={engine!r}: the {name} counter stepped back from {before:.17g} to "
                f"{after:.17g} with no restart; held at {before:.17g} for a poll, not taken for a reset")

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
        self._held = {}  # slots of another layout: a hold across a layout change stays a hold
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
        times = self._times
        n = len(times)
        horizon = now - self.keep_seconds
        first_layout = self._runs[0][0]
        # keep one sample at or before the horizon so a full window has a left edge
        lo = 0
        while n - lo > 2 and times[lo + 1] <= horizon:
            lo += 1
        # thin the part older than the fine horizon to one sample per coarse step
        fine = now - self.fine_seconds
        dropped: list[int] = []
        if n - lo >= 3 and times[lo + 1] <= fine:
            i = lo
            before = self._pruned_at
            mid, far, far_step = self.mid_seconds, self.far_edge, self.far_step
            if before is not None and before <= now:
                # what the last prune kept stays kept up to the first sample whose step grew (it aged past
                # mid_seconds or far_edge since) or the last one it found past the fine horizon (kept for
                # being the last)
                grew = n
                for boundary in (mid, far):
                    aged = _first_within(times, before, boundary)
                    if aged < n and now - times[aged] > boundary:
                        grew = min(grew, aged)
                i = max(lo, min(grew, bisect_right(times, before - self.fine_seconds) - 1))
            last = i - 1 if i > lo else -1
            while n - i > 1 and times[i] <= fine:
                age = now - times[i]
                step = self.mid_step if age <= mid else self.coarse_step if age <= far else far_step
                if last < 0 or times[i] - times[last] >= step or times[i + 1] > fine:
                    last = i
                else:
                    dropped.append(i)
                i += 1
        self._pruned_at = now
        if lo or dropped:
            self._keep(_ranges(lo, dropped, n))
        for model in list(self.logs):
            log = self.logs[model]
            shift = log.prune(horizon)
            if shift:
                for r in self.running[model].values():
                    r.shift(shift)
            if log.start >= len(log):  # the model has not been seen for the whole history
                del self.logs[model]
                del self.running[model]
        if self._runs[0][0] is not first_layout:
            self._forget_gone_series()

    def _keep(self, ranges: list[tuple[int, int]]) -> None:
        """Keeps the samples of `ranges` ([a, b) index ranges, in order) in new arrays: a
        view holding the old ones sees them as they were."""
        times = array("d")
        for a, b in ranges:
            times += self._times[a:b]
        runs, at = [], 0
        for layout, values, first, count in self._runs:
            kept, size, samples = array("d"), layout.size, 0
            for a, b in ranges:
                a, b = max(a, first), min(b, first + count)
                if a < b:
                    kept += values[(a - first) * size:(b - first) * size]
                    samples += b - a
            if samples:  # counted, not told from the values: a target with no series (a router's) has none
                runs.append([layout, kept, at, samples])
                at += samples
        self._times, self._runs = times, runs

    def _forget_gone_series(self) -> None:
        """Reset offsets of series no sample holds any more: a target whose models come
        and go must not grow these maps forever."""
        alive = set()
        for run in self._runs:
            alive.update(run[0].keys)
        for slot in [k for k in self._last_raw if k[0] not in alive]:
            self._last_raw.pop(slot, None)
            self._offset.pop(slot, None)
        self._created = {k: v for k, v in self._created.items() if k in alive}

    @property
    def far_edge(self) -> float:
        """The age from which samples are one per far_step: past the mid tier, and a coarse step
        past `far_seconds`, so that the sample before an anchored window's left edge is there too."""
        return max(self.mid_seconds, self.far_seconds + self.coarse_step)

    @property
    def far_step(self) -> float:
        """The step beyond the far edge: a thirtieth of the shortest window whose left edge lies
        there (as the mid step is of 15 minutes), so that no window's edge moves by more."""
        edge = self.far_edge
        return max(self.coarse_step, min((w for w in self.windows if w > edge), default=0.0) / 30)

    def retarget(self, keep_seconds: float, windows: Sequence[float], far_seconds: float = math.inf) -> None:
        """A reload changed the windows (or the reach of the reads anchored at an event):
        keep every sample, track the new windows."""
        self.keep_seconds = keep_seconds
        self.far_seconds = far_seconds
        self.fine_seconds = min(self.fine_seconds, keep_seconds) if self.fine_seconds else keep_seconds
        self._pruned_at = None  # the next prune walks every sample again
        windows = tuple(sorted(set(windows)))
        if windows == self.windows:
            return
        self.windows = windows
        for model, log in self.logs.items():
            running = self.running[model] = {}
            for w in windows:
                r = running[w] = RunningSums(w, log.start)
                for i in range(log.start, len(log)):
                    r.update(log, i, log.t[i])
        self._view = None

    def samples(self) -> Samples:
        if self._view is None:
            logs = {m: (log.t, log.t_start, log.q, log.h, log.x, log.y, log.kv, log.start, len(log)) for m, log in self.logs.items()}
            self._view = Samples.of_columns(self._times[:], tuple(map(tuple, self._runs)), logs, self.running)
        return self._view

    def __len__(self) -> int:
        return len(self._times)


def _first_within(times: array, now: float, age: float) -> int:
    """The first of the sorted `times` with `now - t <= age`: the test the thinning's steps
    make, to the last bit (`t >= now - age` rounds differently at the edge)."""
    i = bisect_left(times, now - age) if age < math.inf else 0
    while i > 0 and now - times[i - 1] <= age:
        i -= 1
    while i < len(times) and now - times[i] > age:
        i += 1
    return i


def _ranges(lo: int, dropped: list[int], n: int) -> list[tuple[int, int]]:
    """[a, b) ranges of the indexes lo..n-1 but `dropped` (sorted)."""
    out: list[tuple[int, int]] = []
    for k in dropped:
        if k > lo:
            out.append((lo, k))
        lo = k + 1
    if lo < n:
        out.append((lo, n))
    return out
