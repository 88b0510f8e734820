"""A prefix-aware router's prediction beside what the engines deliver.

A router (llm-d's EPP, formerly gateway-api-inference-extension's; Dynamo's KV router)
picks the replica it believes holds the longest cached prefix of each request, and says
how much it expected to hit. When it predicts far more than the engines then hit, its
index is stale (it credits blocks the engines evicted or never had): requests go where
the cache is not, and nothing else shows it. Pure: samples and `now` in, values out.

What each router sends, and how it is read, is in exporter/parse/router_metrics.py.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..parse.router_metrics import ALL_MODELS, RouterSnapshot
from ..series.history import is_reset
from ..series.hitratio import hit_tokens, query_tokens
from .causes import ROUTING_INDEX_STALE
from .rules_state import Condition

TOKENS = "tokens"
PER_REQUEST_MEAN = "per_request_mean"


@dataclass(frozen=True, slots=True)
class Prediction:
    """One model's predicted hit ratio over one window."""

    ratio: float
    weighting: str  # TOKENS or PER_REQUEST_MEAN
    requests: float | None  # routed requests in the window, where known
    input_tokens: float | None


_FIELDS = ("predicted_tokens", "input_tokens", "ratio_sum", "ratio_count")


class RouterHistory:
    """The router's counters over the longest window, reset-adjusted by the engines' one
    policy (exporter/series/history.py is_reset): a counter that fell to at most half its
    last value started again from zero; one that fell less stepped back and is held."""

    def __init__(self, keep_seconds: float):
        self.keep_seconds = keep_seconds
        self.samples: deque[tuple[float, dict[str, tuple[float | None, ...]]]] = deque()
        self._last: dict[str, tuple[float | None, ...]] = {}
        self._offset: dict[str, list[float]] = {}
        self.view: tuple[tuple[float, dict[str, tuple[float | None, ...]]], ...] = ()

    def append(self, t: float, snap: RouterSnapshot) -> None:
        if self.samples and t <= self.samples[-1][0]:
            return
        adjusted = {}
        for model, c in snap.models:
            raw = tuple(getattr(c, f) for f in _FIELDS)
            last = self._last.get(model)
            offset = self._offset.setdefault(model, [0.0] * len(_FIELDS))
            if last is not None:
                held = list(raw)
                for i, (a, b) in enumerate(zip(last, raw)):
                    if a is not None and b is not None and b < a:
                        if is_reset(a, b):
                            offset[i] += a
                        else:
                            held[i] = a  # the increase is 0 until the counter passes it again
                raw = tuple(held)
            self._last[model] = raw
            adjusted[model] = tuple(None if v is None else v + offset[i] for i, v in enumerate(raw))
        for model in [m for m in self._last if m not in adjusted]:
            del self._last[model], self._offset[model]  # a model the router no longer names
        self.samples.append((t, adjusted))
        while self.samples and t - self.samples[0][0] > self.keep_seconds:
            self.samples.popleft()
        # the poll thread appends while the evaluation reads: it reads this copy, never the deque
        self.view = tuple(self.samples)

    def predictions(self, now: float, windows, min_requests: float = 1.0) -> dict[str, dict[str, Prediction]]:
        """model -> window name -> Prediction over (now - seconds, now], the engines' windows'
        span; token-weighted where the window has predicted and input tokens, else the
        per-request mean."""
        out: dict[str, dict[str, Prediction]] = {}
        for name, seconds in windows:
            inside = [s for s in self.view if now - seconds < s[0] <= now]
            if len(inside) < 2:
                continue
            first, last = inside[0][1], inside[-1][1]
            for model, end in last.items():
                start = first.get(model)
                if start is None:
                    continue
                d = [None if a is None or b is None else max(0.0, b - a) for a, b in zip(start, end)]
                p = _prediction(*d, min_requests=min_requests)
                if p is not None:
                    out.setdefault(model, {})[name] = p
        return out


def _prediction(predicted, inputs, ratio_sum, ratio_count, min_requests: float) -> Prediction | None:
    if predicted is not None and inputs:
        return Prediction(min(1.0, predicted / inputs), TOKENS, ratio_count, inputs)
    if ratio_sum is not None and ratio_count and ratio_count >= min_requests:
        return Prediction(min(1.0, max(0.0, ratio_sum / ratio_count)), PER_REQUEST_MEAN, ratio_count, None)
    return None


@dataclass(frozen=True, slots=True)
class Delivered:
    """What the engines hit over the same window, token-weighted over their targets."""

    ratio: float | None
    query_tokens: float
    targets: int


def delivered(windows_by_target, model: str, window: str) -> Delivered:
    """Σ hits / Σ queries of `model` (every model for ALL_MODELS) over the engine
    targets' `window`, in tokens (a block-counting target's in its block size): the GPU
    prefix caches' lookups, what a router's index predicts."""
    hits = queries = 0.0
    targets = 0
    for stats in windows_by_target:
        counted = False
        for m, by_window in stats.items():
            if model != ALL_MODELS and m != model:
                continue
            ws = by_window.get(window)
            if ws is None or ws.unit is None or ws.hit_increase is None or not ws.query_increase:
                continue
            hits += hit_tokens(ws)
            queries += query_tokens(ws)
            counted = True
        targets += counted
    return Delivered(min(1.0, hits / queries) if queries > 0 else None, queries, targets)


@dataclass(frozen=True)
class GapSettings:
    gap_points: float = 0.3  # predicted this far above delivered...
    min_query_tokens: float = 20000.0  # ...over this many engine tokens...
    min_requests: float = 50.0  # ...and this many routed requests, where the router counts them


def gap(p: Prediction | None, d: Delivered, s: GapSettings) -> tuple[str, float | None]:
    """("true" | "false" | "inconclusive", predicted - delivered). Delivered above
    predicted is fine: engines may hit what the router did not know about."""
    if p is None or d.ratio is None or d.query_tokens < s.min_query_tokens or \
            (p.requests is not None and p.requests < s.min_requests):
        return "inconclusive", None
    difference = p.ratio - d.ratio
    return ("true" if difference >= s.gap_points else "false"), difference


def condition(p: Prediction | None, d: Delivered, s: GapSettings, window: str):
    """The alert's Condition for one model; its cause is always routing_index_stale."""

    state, difference = gap(p, d, s)
    what = f"{d.targets} engine target(s)"
    if p is None:
        return Condition("inconclusive", None, summary="the router predicted nothing in the window",
                         cause=(ROUTING_INDEX_STALE, ""))
    delivered = "n/a" if d.ratio is None else f"{d.ratio:.0%}"
    weighting = "token-weighted" if p.weighting == TOKENS else "mean per request"
    summary = f"The router predicts {p.ratio:.0%} prefix-cache hits ({weighting}) but the engines deliver {delivered} over {window}"
    why = (f"the router credits blocks the engines no longer hold (an index that missed evictions or restarts, "
           f"or a block size/hash that differs from the engines'): predicted {p.ratio:.0%}, delivered {delivered} "
           f"over {d.query_tokens:.0f} query tokens of {what}")
    return Condition(state, difference, summary=summary,
                     description=f"{summary}. Requests are sent where the cache is not.", cause=(ROUTING_INDEX_STALE, why))
