"""Per model, a log of each poll (query and hit tokens, the interval's ratio and mean TTFT, KV usage) and,
per window, running sums over it: correlation and KV maxima over a window cost O(1) a poll instead of a
rescan. Pure; a History owns one log per model."""
from __future__ import annotations

import math
from array import array


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
        # compacted once the dropped entries are an eighth of what is held (at least 32): an hour
        # of 15 s polls held up to twice its 240 entries when it waited for half
        if self.start < 32 or self.start * 8 < n:
            return 0
        shift = self.start
        for name in ModelLog.__slots__[:-1]:
            setattr(self, name, getattr(self, name)[shift:])
        self.start = 0
        return shift


class RunningSums:
    """Running sums over the log entries of one window, for one model."""

    __slots__ = ("seconds", "lo_start", "n", "sx", "sy", "sxy", "sxx", "syy", "kv", "removed")

    def __init__(self, seconds: float, lo: int):
        self.seconds = seconds
        self.lo_start = lo
        self.n = self.sx = self.sy = self.sxy = self.sxx = self.syy = 0.0
        # t, kv, t, kv, ... with kv decreasing: the front's kv (kv[1]) is the window's max. Flat
        # floats, not (t, kv) tuples: no object the garbage collector walks, per model and window.
        # A list, not a deque: a deque starts at 760 bytes (four windows a model: 30 MB at 10,000
        # pods) and this one holds a few entries; the front's go with a short memmove
        self.kv: list[float] = []
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
        advance((self,), log, i, now)

    def rebuild(self, log: ModelLog, i: int) -> None:
        """The sums afresh from the window's entries: bounds the drift of add-and-subtract."""
        self.removed = 0
        self.n = self.sx = self.sy = self.sxy = self.sxx = self.syy = 0.0
        for j in range(self.lo_start, i + 1):
            self.add(log.x[j], log.y[j])

    def shift(self, by: int) -> None:
        self.lo_start -= by

    def fit(self) -> tuple[float, float] | None:
        return least_squares_fit(self.n, self.sx, self.sy, self.sxy, self.sxx, self.syy)

    def kv_max(self) -> float | None:
        return self.kv[1] if self.kv else None


def advance(runs, log: ModelLog, i: int, now: float) -> None:
    """Entry i was just appended at `now`: every window's running sums take it in and let
    go of the entries that slid out. One call for all windows of a model, reading the entry
    once (`RunningSums.add` inlined): this runs per model and poll."""
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
            while peaks and peaks[-1] <= kv:
                peaks.pop()
                peaks.pop()
            peaks.append(t)
            peaks.append(kv)
        if peaks and peaks[0] <= edge:
            drop = 2
            while drop < len(peaks) and peaks[drop] <= edge:
                drop += 2
            del peaks[:drop]
        if r.removed >= 512:
            r.rebuild(log, i)


def least_squares_fit(n, sx, sy, sxy, sxx, syy) -> tuple[float, float] | None:
    """(r, slope of y on x) from sums, or None with fewer than three points or no spread."""
    if n < 3:
        return None
    vx, vy, cov = sxx - sx * sx / n, syy - sy * sy / n, sxy - sx * sy / n
    scale = n * 1e-12
    if vx <= scale * max(1.0, sxx / n) or vy <= scale * max(1.0, syy / n):
        return None
    r = cov / math.sqrt(vx * vy)
    return max(-1.0, min(1.0, r)), cov / vx
