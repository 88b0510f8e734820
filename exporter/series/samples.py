"""What a target's history is made of: the counters kept per series, the Layout that
says where each series' values sit, one sample (TargetSample) and an immutable view of
many (Samples), kept as columns. Pure data; History (history.py) fills them."""
from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Callable

from ..parse.snapshot import key_order

# Counters kept per series, in this order in every sample's value array.
COUNTERS = ("queries", "hits", "external_queries", "external_hits", "ttft_sum", "ttft_count", "prompt_tokens", "preemptions",
            # admitted prefill (vLLM 0.16 on): prompt_tokens_by_source, cached, recomputed
            "local_cache_hit", "recomputed", "prompt_cached", "external_transfer",
            # cached tokens by the tier the engine names (exporter/parse/tiers.py), one slot per TIER_SLOTS
            "tier_device", "tier_host", "tier_storage", "tier_external", "tier_unattributed")
# the engines' tier names -> the slot they are kept in: disk is storage; a transfer from
# another replica (p2p) and any tier we do not know are what came from outside the GPU
TIER_SLOTS = ("device", "host", "storage", "external", "unattributed")
TIER_BASE = COUNTERS.index("tier_device")
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
                      {m: tuple(sorted(ks, key=key_order)) for m, ks in by_model.items()},
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


def add_to_runs(runs: list[list], layout: Layout, values, index: int) -> None:
    """Adds the values of sample `index` to the last of `runs` ([layout, values, first
    index, samples]) where it has the same layout, else as a run of its own (a copy)."""
    if runs and runs[-1][0] is layout:
        runs[-1][1].extend(values)
        runs[-1][3] += 1
    else:
        runs.append([layout, array("d", values), index, 1])


class Samples(Sequence):
    """An immutable view of a History at one moment: the samples, their times, and the
    model logs as they were. Safe to read from another thread while the History grows.

    Kept as columns: the times in one float array, and per stretch of samples sharing a
    layout (a run) their values laid end to end in one float array, `layout.size` a
    sample. An element (a TargetSample) is made when asked for: windows read a few edges
    of the history, not every sample, and an object and an array a sample were half of
    what a target's hour of history held (at 10,000 pods, some 150 MB and 1.7 million
    objects for the collector to walk)."""

    def __init__(self, samples=(), logs: dict | None = None, running: dict | None = None):
        times, runs = array("d"), []
        for s in samples:
            add_to_runs(runs, s.layout, s.values, len(times))
            times.append(s.t)
        self._set(times, tuple(map(tuple, runs)), logs, running)

    @classmethod
    def of_columns(cls, times: array, runs: tuple, logs: dict | None, running: dict | None) -> "Samples":
        """From a History's columns: `runs` as (layout, values, first index, samples); a
        run's values may grow past its samples afterwards, never change within them."""
        view = cls.__new__(cls)
        view._set(times, runs, logs, running)
        return view

    def _set(self, times: array, runs: tuple, logs: dict | None, running: dict | None) -> None:
        self.times = times
        self._columns = runs
        self._starts = [r[2] for r in runs]
        self._runs: list[tuple[Layout, int, int]] | None = None
        # model -> (log arrays, end): entries past `end` were appended after this view
        self.logs = logs if logs is not None else {}
        self.running = running or {}

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self.times)))]
        n = len(self.times)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("sample index out of range")
        columns = self._columns
        layout, values, first, _ = columns[0] if len(columns) == 1 else columns[bisect_right(self._starts, i) - 1]
        at = (i - first) * layout.size
        return TargetSample(self.times[i], layout, values[at:at + layout.size])

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self):
        for i in range(len(self.times)):
            yield self[i]

    def runs(self) -> list[tuple[Layout, int, int]]:
        """(layout, first index, last index) of each stretch of samples sharing a layout."""
        if self._runs is None:
            self._runs = [(layout, first, first + count - 1) for layout, _, first, count in self._columns]
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
