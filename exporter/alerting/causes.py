"""Probable cause of a low or fallen hit rate: a pure function of windows and events."""
from __future__ import annotations

from dataclasses import dataclass

from .deploys import DeployEvent

PROMPT_PREFIX_CHANGE = "prompt_prefix_change"
COLD_START = "cold_start"
EVICTION_PRESSURE = "eviction_pressure"
CACHING_DISABLED = "caching_disabled"
LOAD_BALANCER_SCATTER = "load_balancer_scatter"
INSTRUMENTATION = "instrumentation"  # the engine's own counters disagree: its bookkeeping, not its cache
TRAFFIC_MIX = "traffic_mix"  # as many tokens hit as before; more arrive that share no prefix (a new tenant, a batch job)
UNKNOWN = "unknown"
ROUTING_INDEX_STALE = "routing_index_stale"  # the router predicts far more hits than the engines deliver
CAUSES = (PROMPT_PREFIX_CHANGE, COLD_START, EVICTION_PRESSURE, CACHING_DISABLED, LOAD_BALANCER_SCATTER, INSTRUMENTATION,
          TRAFFIC_MIX, UNKNOWN, ROUTING_INDEX_STALE)


@dataclass(frozen=True)
class Evidence:
    now: float
    caching_enabled: bool | None
    ratio: float | None  # the short window
    ratio_earlier: float | None  # the short window just before it: is the ratio climbing?
    baseline: float | None  # before the drop (pre-deploy baseline or the long window)
    kv_usage_max: float | None
    preemptions: float | None  # increase over the window
    events: tuple[DeployEvent, ...] = ()  # this target's, newest last
    peer_ratios: tuple[float, ...] = ()  # the same model on the other targets
    peers_had_events: bool = False
    requests: float | None = None  # requests that got a first token in the short window
    # (hit tokens/s, query tokens/s) since the drop and before it (the baseline's time)
    token_rates: tuple[float, float] | None = None
    baseline_token_rates: tuple[float, float] | None = None


@dataclass(frozen=True)
class Settings:
    """What the rules are configured with (`rules:`, defaults in exporter/config/default_rules.yml)."""

    event_lookback: float  # a drop this long after an event is still "after" it
    cold_start_grace: float


# thresholds of the classification itself, not configurable
KV_USAGE_HIGH = 0.9
PREEMPTED_SHARE = 0.05  # of requests preempted, for preemptions alone to be pressure
SCATTER_LOW, SCATTER_HIGH, SCATTER_SPREAD = 0.1, 0.65, 0.15
# hit tokens/s at least this share of before while query tokens/s grew this much: the
# cache serves what it served, the new traffic shares no prefix (a Poisson minute of a
# few hundred requests moves the hits by well under 20%)
MIX_HITS_HELD, MIX_QUERIES_GREW = 0.8, 1.2


def classify(e: Evidence, s: Settings) -> tuple[str, str]:
    """-> (cause, one sentence of why)."""
    if e.caching_enabled is False:
        return CACHING_DISABLED, "vLLM reports enable_prefix_caching=False (or a V0 hit-rate gauge of -1)"
    recent = [ev for ev in e.events if e.now - ev.t <= s.event_lookback]
    restarts = [ev for ev in recent if ev.is_restart and e.now - ev.t <= s.cold_start_grace]
    if restarts:
        climbing = e.ratio is not None and e.ratio_earlier is not None and e.ratio >= e.ratio_earlier
        return COLD_START, (f"restart {e.now - restarts[-1].t:.0f}s ago ({restarts[-1].description}); "
                            f"the cache is {'refilling' if climbing else 'still cold'}")
    kv_full = e.kv_usage_max is not None and e.kv_usage_max >= KV_USAGE_HIGH
    mix = traffic_mix(e)
    if mix and not kv_full:  # new traffic that fills the KV cache evicts: capacity, not mix
        return TRAFFIC_MIX, mix
    preempted = _preempted_share(e)
    pressure = kv_full or preempted >= PREEMPTED_SHARE
    deploys = [ev for ev in recent if not ev.is_restart]
    drop = (e.baseline - e.ratio) if e.baseline is not None and e.ratio is not None else None
    # Weigh the explanations by how much of the drop each can account for: evicted
    # blocks cost at most the preempted requests' share of the hits, so a preemption
    # or two never outranks a deploy that the ratio fell right after; a full KV cache
    # evicts everywhere and can explain any drop.
    if deploys and pressure and not kv_full and drop is not None and preempted < drop / 2:
        pressure = False
    if deploys and not pressure:
        ev = deploys[-1]
        what = "a suspected unannounced change" if ev.source == "change_point" else f"deploy {ev.version} ({ev.source})"
        return PROMPT_PREFIX_CHANGE, (f"sharp drop right after {what} {e.now - ev.t:.0f}s ago, no restart, KV usage normal: "
                                      "the start of the prompt probably changed between requests")
    if pressure:
        kv = "n/a" if e.kv_usage_max is None else f"{e.kv_usage_max:.0%}"
        return EVICTION_PRESSURE, f"KV-cache usage up to {kv} and {e.preemptions or 0:.0f} preemptions: cached blocks are evicted before reuse"
    if (e.ratio is not None and len(e.peer_ratios) >= 1 and not e.peers_had_events
            and SCATTER_LOW <= e.ratio <= SCATTER_HIGH
            and all(SCATTER_LOW <= r <= SCATTER_HIGH for r in e.peer_ratios)
            and max(e.peer_ratios + (e.ratio,)) - min(e.peer_ratios + (e.ratio,)) <= SCATTER_SPREAD):
        n = len(e.peer_ratios) + 1
        return LOAD_BALANCER_SCATTER, (f"all {n} replicas of the model sit at a similar, moderate hit ratio with no deploy or restart: "
                                       "requests sharing a prefix are spread over replicas")
    return UNKNOWN, "no deploy, restart, eviction pressure or fleet-wide pattern explains it"


def traffic_mix(e: Evidence) -> str:
    """Why the fall is a change of the traffic mix, or "": the cache serves as many tokens
    per second as before while only the queries grew. A broken prompt prefix or evicted
    blocks lose hits; new traffic that shares no prefix with the old only dilutes them."""
    if e.token_rates is None or e.baseline_token_rates is None:
        return ""
    (hits, queries), (hits_before, queries_before) = e.token_rates, e.baseline_token_rates
    if hits_before <= 0 or queries_before <= 0:
        return ""
    if hits < MIX_HITS_HELD * hits_before or queries < MIX_QUERIES_GREW * queries_before:
        return ""
    return (f"hit tokens/s held ({hits:.0f} against {hits_before:.0f} before) while query tokens/s grew "
            f"{queries / queries_before - 1:.0%} ({queries_before:.0f} -> {queries:.0f}): new traffic that shares no "
            "prefix with the old, not a broken prompt")


def _preempted_share(e: Evidence) -> float:
    """Preempted requests as a share of the requests served; all of it when the request
    count is unknown and there were preemptions."""
    n = e.preemptions or 0.0
    if n <= 0:
        return 0.0
    if not e.requests:
        return 1.0
    return min(1.0, n / e.requests)
