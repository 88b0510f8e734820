"""Versions of one model side by side during a rollout, and the verdict a rollout
controller asks for. Pure: window stats of the replicas in, a verdict out.

Each replica may carry a version (a target label) and a scope: the labels that say what
owns it (exporter/alerting/rollouts.py compares versions within one scope only, and hands
this module the replicas of one scope). The new version's replicas, after
their cold start, are pooled token-weighted and compared with the baseline version's
replicas over the same window, with a traffic floor on both sides, as a canary analysis
does. Never a NaN: without enough tokens the verdict is `inconclusive`, with a reason.
How a rollout goes on over time (began, completed, forgotten) is exporter/alerting/rollouts.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

# (label, value) of the target labels that say what owns a replica (analysis.scope_labels):
# (("namespace", "prod"), ("owner", "vllm")); () for a target that has none of them
Scope = tuple[tuple[str, str], ...]

from ..series.hitratio import judged_counts
from ..series.window import WindowStats
from .causes import Evidence, traffic_mix

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


@dataclass(frozen=True)
class Member:
    target: str
    version: str | None
    stats: WindowStats | None  # the model's window on this replica
    cold: bool = False  # still in its cold-start grace: not yet comparable
    scope: Scope = ()  # what owns the replica: versions are compared within one scope only


@dataclass(frozen=True)
class Verdict:
    verdict: str
    model: str
    version: str
    baseline_version: str | None
    hit_ratio: float | None
    baseline_hit_ratio: float | None
    query_tokens: float
    baseline_query_tokens: float
    reason: str
    replicas: int = 0
    baseline_replicas: int = 0
    # set when the question has no answer to wait for (no replica runs the version at
    # all: a typo, a label never set): inconclusive, but never to be taken as a pass
    error: str | None = None
    scope: Scope = ()  # the replicas judged are those of this scope (namespace and owner)

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "model": self.model, "scope": dict(self.scope), "version": self.version,
                "baseline_version": self.baseline_version,
                "hit_ratio": self.hit_ratio, "baseline_hit_ratio": self.baseline_hit_ratio, "query_tokens": self.query_tokens,
                "baseline_query_tokens": self.baseline_query_tokens, "replicas": self.replicas,
                "baseline_replicas": self.baseline_replicas, "reason": self.reason, "error": self.error}


def _tokens(ws: WindowStats | None) -> tuple[float, float]:
    """(hit tokens, query tokens) of one replica's window, by the rules' ratio policy."""
    return judged_counts(ws)


def token_rates(ws: WindowStats | None) -> tuple[float, float] | None:
    """(hit, query) tokens per second of one window, from the counters its ratio is judged
    by; None where the window's span is unknown."""
    if ws is None or not ws.query_rate or not ws.query_increase:
        return None
    span = ws.query_increase / ws.query_rate
    hits, queries = _tokens(ws)
    return hits / span, queries / span


def pool_rates(members: Sequence[Member]) -> tuple[float, float] | None:
    """(hit, query) tokens per second of the warm members together: the fleet's traffic."""
    rates = [r for r in (token_rates(m.stats) for m in members if not m.cold) if r is not None]
    if not rates:
        return None
    return sum(h for h, _ in rates), sum(q for _, q in rates)


def _pool(members: Sequence[Member]) -> tuple[float, float, int]:
    hits = queries = 0.0
    for m in members:
        h, q = _tokens(m.stats)
        hits += h
        queries += q
    return hits, queries, len(members)


def analyze(members: Sequence[Member], model: str, version: str, baseline: str | None = None,
            min_query_tokens: float = 20000.0, drop_points: float = 0.25) -> Verdict:
    warm = [m for m in members if not m.cold]
    if baseline is None:
        baseline = busiest_version(warm, other_than=version)
    old = [m for m in warm if baseline is not None and m.version == baseline]
    bh, bq, bn = _pool(old)
    missing = ""
    if baseline is None or not old:
        missing = (f"no baseline: no other version of {model} serves traffic" if baseline is None
                   else f"no warm replica of {model} runs the baseline {baseline}")
    return judge(members, model, version, baseline, bh / bq if bq > 0 else None, bq, bn, missing, min_query_tokens, drop_points)


def busiest_version(members: Sequence[Member], other_than: str) -> str | None:
    """The version, other than `other_than`, whose warm replicas served the most query
    tokens: during a rollout, the one being replaced."""
    tokens: dict[str, float] = {}
    for m in members:
        if not m.cold and m.version is not None and m.version != other_than:
            tokens[m.version] = tokens.get(m.version, 0.0) + _tokens(m.stats)[1]
    return max(tokens, key=lambda v: (tokens[v], v)) if tokens else None


def judge(members: Sequence[Member], model: str, version: str, baseline: str | None, base_ratio: float | None,
          bq: float, bn: int, missing: str, min_query_tokens: float, drop_points: float,
          baseline_rates: tuple[float, float] | None = None) -> Verdict:
    """The warm replicas of `version` against a baseline ratio over `bq` query tokens
    (the baseline version's replicas now, or the model before its rollout began)."""
    new = [m for m in members if not m.cold and m.version == version]
    h, q, n = _pool(new)
    # more hits than queries is no 150%: counters read apart or wrong, reported as 100% and judged not at all
    overcounted = [v for v, part, whole in ((version, h, q), (baseline, base_ratio, 1.0)) if part is not None and whole > 0
                   and part > whole * (1 + 1e-9)]
    ratio = min(1.0, h / q) if q > 0 else None
    base_ratio = min(1.0, base_ratio) if base_ratio is not None else None

    def verdict(kind: str, reason: str, error: str | None = None) -> Verdict:
        return Verdict(kind, model, version, baseline, ratio, base_ratio, q, bq, reason, n, bn, error)

    cold = sum(1 for m in members if m.cold and m.version == version)
    if not new:
        if cold:
            return verdict(INCONCLUSIVE, f"{cold} replica(s) of {version} still in their cold start")
        why = f"no replica of {model} runs {version}"
        return verdict(INCONCLUSIVE, why, why)
    if missing or base_ratio is None:
        return verdict(INCONCLUSIVE, missing or f"no baseline ratio for {model}")
    if overcounted:
        return verdict(INCONCLUSIVE, f"the counters of {' and '.join(map(str, overcounted))} count more hits than queries: "
                                     "they cannot be judged (see prefixcache_hit_ratio_disagreement)")
    if q < min_query_tokens or bq < min_query_tokens or ratio is None:  # (a floor of 0 lets 0 tokens through)
        return verdict(INCONCLUSIVE, f"too little traffic to judge: {q:.0f} and {bq:.0f} query tokens, {min_query_tokens:.0f} needed on each side")
    drop = base_ratio - ratio
    # against the model before the rollout: the same hit tokens/s over more query tokens/s
    # is new traffic that shares no prefix, which no version of the model caused
    mix = traffic_mix(Evidence(0.0, None, ratio, None, base_ratio, None, None, token_rates=pool_rates(members),
                               baseline_token_rates=baseline_rates)) if drop >= drop_points else ""
    if mix:
        return verdict(INCONCLUSIVE, f"{version} hits {ratio:.1%} against {base_ratio:.1%} before the rollout, but the traffic "
                                     f"mix changed (traffic_mix): {mix}")
    if drop >= drop_points:
        return verdict(FAIL, f"{version} hits {ratio:.1%} of its prompt tokens against {base_ratio:.1%} for {baseline}: "
                             f"{drop * 100:.1f} points lower (the limit is {drop_points * 100:.0f})")
    return verdict(PASS, f"{version} hits {ratio:.1%} against {base_ratio:.1%} for {baseline}")


def pool_ratio(members: Sequence[Member]) -> tuple[float | None, float, int]:
    """(token-weighted hit ratio, query tokens, replicas) of the warm members."""
    h, q, n = _pool([m for m in members if not m.cold])
    return (h / q if q > 0 else None), q, n

