"""Probable cause of a low or fallen hit rate: a pure function of windows and events.

A cause needs evidence that points at it: a restart or a wake for a cold start, one tier's
hits stopping while the others hold for a lost tier, the model's replica count for a
changed fleet, a deploy (or a change point) for a prompt change. An event nobody can
explain is not a deploy, and a fleet that grew is not a prompt that changed.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from ..series.blockindex import KVView
from .deploys import CHANGE_POINT, REPLICAS, WAKE, DeployEvent
from .warmth import cold_restart, is_warm_after, warm_since_time

PROMPT_PREFIX_CHANGE = "prompt_prefix_change"
COLD_START = "cold_start"
EVICTION_PRESSURE = "eviction_pressure"
CACHING_DISABLED = "caching_disabled"
LOAD_BALANCER_SCATTER = "load_balancer_scatter"
INSTRUMENTATION = "instrumentation"  # the engine's own counters disagree: its bookkeeping, not its cache
TRAFFIC_MIX = "traffic_mix"  # as many tokens hit as before; more arrive that share no prefix (a new tenant, a batch job)
UNKNOWN = "unknown"
ROUTING_INDEX_STALE = "routing_index_stale"  # the router predicts far more hits than the engines deliver
CACHE_TIER_LOST = "cache_tier_lost"  # one cache tier (a KV connector, CPU offload) stopped serving while the others hold
REPLICAS_CHANGED = "replicas_changed"  # more or fewer replicas of the model: its prefixes are spread or moved
CAUSES = (PROMPT_PREFIX_CHANGE, COLD_START, EVICTION_PRESSURE, CACHING_DISABLED, LOAD_BALANCER_SCATTER, INSTRUMENTATION,
          TRAFFIC_MIX, UNKNOWN, ROUTING_INDEX_STALE, CACHE_TIER_LOST, REPLICAS_CHANGED)


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
    # each tier's share of the queried tokens, now and before (hitratio.tier_shares)
    tiers: tuple[tuple[str, float], ...] = ()
    baseline_tiers: tuple[tuple[str, float], ...] = ()
    # (hit tokens, query tokens) per request now, and before the newest change of the replica count
    per_request: tuple[float, float] | None = None
    per_request_before_fleet: tuple[float, float] | None = None
    evicted_before_reuse: bool | None = None  # vLLM's KV residency: blocks evicted sooner than they are reused
    warm_since: float | None = None  # the newest restart's cache seen warm from this time on (warmth.py)
    kv: KVView | None = None  # vLLM's own KV cache events, where the target publishes them: first-hand


@dataclass(frozen=True)
class Settings:
    """What the rules are configured with (`rules:`, defaults in exporter/config/default_rules.yml)."""

    event_lookback: float  # a drop this long after an event is still "after" it
    cold_start_grace: float


# thresholds of the classification itself, not configurable
KV_USAGE_HIGH = 0.9
# a tier that served at least TIER_MIN_SHARE of the queried tokens keeps at most
# TIER_LOST_LEFT of its share while the other tiers keep TIER_OTHERS_HELD of theirs: that
# tier is lost (a prompt change loses every tier at once)
TIER_MIN_SHARE, TIER_LOST_LEFT, TIER_OTHERS_HELD = 0.1, 0.2, 0.8
# more replicas without prefix or session affinity divide what each one can reuse by at
# most after/before; a fall well past that (FLEET_SLACK) is not the fleet, nor are requests
# whose size changed (a query tokens per request outside PER_REQUEST_HELD of before)
FLEET_SLACK, PER_REQUEST_HELD = 0.8, (0.8, 1.25)
# the fleet is seen changing a few polls (and a discovery refresh) after the router moved the
# traffic: a change point up to FLEET_LAG seconds before is that change's fall. Under routing
# with affinity the moved prefixes refill: a ratio that climbs FLEET_CLIMB over the short window,
# or, in the first FLEET_REFILL_GRACE seconds, keeps FLEET_COLLAPSED of its level before (a
# prompt change loses nearly all of it at once), is the fleet's refill
FLEET_LAG, FLEET_CLIMB, FLEET_REFILL_GRACE, FLEET_COLLAPSED = 120.0, 0.02, 180.0, 0.15
PREEMPTED_SHARE = 0.05  # of requests preempted, for preemptions alone to be pressure
SCATTER_LOW, SCATTER_HIGH, SCATTER_SPREAD = 0.1, 0.65, 0.15
# hit tokens/s at least this share of before while query tokens/s grew this much: the
# cache serves what it served, the new traffic shares no prefix (a Poisson minute of a
# few hundred requests moves the hits by well under 20%)
MIX_HITS_HELD, MIX_QUERIES_GREW = 0.8, 1.2
MIX_MIN_REQUESTS = 100  # fewer requests in the window move the rates by chance as much
# a restart whose cache refilled at least this far short of the ratio before it changed
# what the new process is sent (warmth.py says when the refill is over)
REFILLED_SHORT = 0.1
# of the requests that missed in the short window (BlockStored events), at least this share
# stored a block that differs from a cached sibling in a short span: the prompt carries a
# value that changes per request; of the blocks stored, at least RESTORED_SHARE had been
# removed shortly before: evicted before their reuse. Each needs KV_MIN_STORES stores.
# Such requests must come at least VOLATILE_ROSE times as often as in the windows before.
VOLATILE_SHARE, RESTORED_SHARE, KV_MIN_STORES, VOLATILE_ROSE = 0.5, 0.2, 3, 2.0


def changes(events: tuple[DeployEvent, ...] | list[DeployEvent], warm_since: float | None) -> list[DeployEvent]:
    """The events after which a fall is a change of what is served, oldest first: deploys,
    and a restart (not a wake) whose cache refilled since, unless a deploy came with it."""
    deploys = [ev for ev in events if ev.is_deploy]
    refilled = [ev for ev in events if ev.is_restart and ev.source != WAKE and is_warm_after(ev, warm_since)
                and not any(abs(d.t - ev.t) <= 1.0 for d in deploys)]
    return sorted(deploys + refilled, key=lambda ev: ev.t)


def classify(e: Evidence, s: Settings) -> tuple[str, str]:
    """-> (cause, one sentence of why)."""
    if e.caching_enabled is False:
        return CACHING_DISABLED, "vLLM reports enable_prefix_caching=False (or a V0 hit-rate gauge of -1)"
    seen = from_events(e, s)
    if seen is not None:
        return seen
    recent = [ev for ev in e.events if e.now - ev.t <= s.event_lookback]
    cold = cold_restart(recent, e.now, s.cold_start_grace, e.warm_since)
    if cold is not None:
        climbing = e.ratio is not None and e.ratio_earlier is not None and e.ratio >= e.ratio_earlier
        what = "wake from sleep mode" if cold.source == WAKE else "restart"
        return COLD_START, (f"{what} {e.now - cold.t:.0f}s ago ({cold.description}); "
                            f"the cache is {'refilling' if climbing else 'still cold'}")
    lost = tier_lost(e)
    if lost is not None:
        return CACHE_TIER_LOST, lost.why
    kv_full = e.kv_usage_max is not None and e.kv_usage_max >= KV_USAGE_HIGH
    deploys = changes(recent, e.warm_since)
    drop = (e.baseline - e.ratio) if e.baseline is not None and e.ratio is not None else None
    if deploys and deploys[-1].is_restart and (drop is None or drop < REFILLED_SHORT):
        deploys = deploys[:-1]  # refilled to about its level before: the restart changed nothing
    # a grown fleet moves hits and queries per replica (its share of the traffic too):
    # where it explains the fall, the rates are no evidence of a new traffic mix
    fleet = replicas_changed(e, recent, deploys)
    if fleet and not kv_full:
        return REPLICAS_CHANGED, fleet
    mix = traffic_mix(e)
    if mix and not kv_full:  # new traffic that fills the KV cache evicts: capacity, not mix
        return TRAFFIC_MIX, mix
    preempted = _preempted_share(e)
    pressure = kv_full or preempted >= PREEMPTED_SHARE or e.evicted_before_reuse is True
    # Weigh the explanations by how much of the drop each can account for: evicted
    # blocks cost at most the preempted requests' share of the hits, so a preemption
    # or two never outranks a deploy that the ratio fell right after; a full KV cache
    # evicts everywhere and can explain any drop.
    if deploys and pressure and not kv_full and drop is not None and preempted < drop / 2:
        pressure = False
    if deploys and not pressure:
        ev = deploys[-1]
        if ev.is_restart:
            return PROMPT_PREFIX_CHANGE, (f"the cache refilled after the restart {e.now - ev.t:.0f}s ago and stopped short of "
                                          "its level before, KV usage normal: what the new process is sent probably changed "
                                          "its prompt's start (a rollout brings its prompt along)")
        what = "a suspected unannounced change" if ev.source == "change_point" else f"deploy {ev.version} ({ev.source})"
        return PROMPT_PREFIX_CHANGE, (f"sharp drop right after {what} {e.now - ev.t:.0f}s ago, no restart, KV usage normal: "
                                      "the start of the prompt probably changed between requests")
    if pressure:
        kv = "n/a" if e.kv_usage_max is None else f"{e.kv_usage_max:.0%}"
        residency = (" and sampled KV blocks sit idle for less time before their eviction than between two uses (vLLM's "
                     "KV residency histograms)") if e.evicted_before_reuse else ""
        return EVICTION_PRESSURE, (f"KV-cache usage up to {kv}, {e.preemptions or 0:.0f} preemptions{residency}: "
                                   "cached blocks are evicted before reuse")
    if (e.ratio is not None and len(e.peer_ratios) >= 1 and not e.peers_had_events
            and SCATTER_LOW <= e.ratio <= SCATTER_HIGH
            and all(SCATTER_LOW <= r <= SCATTER_HIGH for r in e.peer_ratios)
            and max(e.peer_ratios + (e.ratio,)) - min(e.peer_ratios + (e.ratio,)) <= SCATTER_SPREAD):
        n = len(e.peer_ratios) + 1
        return LOAD_BALANCER_SCATTER, (f"all {n} replicas of the model sit at a similar, moderate hit ratio with no deploy or restart: "
                                       "requests sharing a prefix are spread over replicas")
    return UNKNOWN, "no deploy, restart, eviction pressure or fleet-wide pattern explains it"


def from_events(e: Evidence, s: Settings) -> tuple[str, str] | None:
    """The cause vLLM's KV events show, or None (no events, or none that point anywhere):
    what the engine says it computed and dropped outranks what the counters suggest."""
    kv = e.kv
    if kv is None or kv.recent is None:
        return None
    cleared = kv.recent.cleared_at
    if cleared is not None and e.now - cleared <= s.cold_start_grace and not warm_since_time(cleared, e.warm_since):
        return COLD_START, (f"vLLM's KV events: the whole cache was cleared {e.now - cleared:.0f}s ago (AllBlocksCleared: "
                            "sleep mode or reset_prefix_cache); it is refilling, the prompts did not change")
    if not kv.live(kv.recent.since):
        return None
    c, span = kv.recent.counts, kv.recent.seconds
    if c.stores < KV_MIN_STORES:
        return None
    if c.blocks and c.restored >= KV_MIN_STORES and c.restored >= RESTORED_SHARE * c.blocks:
        return EVICTION_PRESSURE, (f"vLLM's KV events: {c.restored} of the {c.blocks} blocks computed in the last {span:.0f}s "
                                   "had been removed from the cache shortly before: evicted before their reuse")
    before = kv.earlier.counts.volatile / kv.earlier.seconds if kv.earlier is not None and kv.earlier.seconds > 0 else 0.0
    # a client that always sends a timestamp is usual: only a rise of such requests is a change
    if c.volatile >= VOLATILE_SHARE * c.stores and c.volatile / span >= VOLATILE_ROSE * before:
        where = f"; {kv.divergence_text}" if kv.divergence_text else ""
        of = f"{c.volatile} of the {e.requests:.0f} requests" if e.requests and e.requests >= c.volatile else f"{c.volatile} requests"
        return PROMPT_PREFIX_CHANGE, (f"vLLM's KV events: {of} in the last {span:.0f}s computed a block that differs from a cached "
                                      f"one in a few tokens ({before * span:.1f} such requests in an average {span:.0f}s of the "
                                      f"{(kv.earlier.seconds if kv.earlier else 0) / 60:.0f} minutes before; {c.new_first} requests stored even their "
                                      f"first block){where}")
    return None


@dataclass(frozen=True)
class TierLoss:
    tier: str
    before: float  # its share of the queried tokens
    now: float
    carried: float  # its part of every tier's cached tokens before
    why: str


def tier_lost(e: Evidence) -> TierLoss | None:
    """One tier whose hits stopped while the other tiers held, or None."""
    before, now = dict(e.baseline_tiers), dict(e.tiers)
    if len(before) < 2 or not now:
        return None
    cached_before = sum(before.values())
    for tier, share in sorted(before.items(), key=lambda kv: -kv[1]):
        left = now.get(tier, 0.0)
        others_before = cached_before - share
        others_now = sum(v for t, v in now.items() if t != tier)
        if share < TIER_MIN_SHARE or left > TIER_LOST_LEFT * share or others_before <= 0 or \
                others_now < TIER_OTHERS_HELD * others_before:
            continue
        carried = share / cached_before
        held = ", ".join(f"{t} {now.get(t, 0.0):.0%}" for t in sorted(before) if t != tier)
        return TierLoss(tier, share, left, carried, (
            f"the {tier} cache tier served {share:.0%} of prompt tokens and serves {left:.0%} now, while the others hold "
            f"({held}): it carried {carried:.0%} of the cached tokens. "
            + ("The KV connector (LMCache, NIXL, offloading) or its store is gone or unreachable" if tier == "external"
               else f"The {tier} tier stopped serving") + "; its tokens are prefilled again"))
    return None


def replicas_changed(e: Evidence, recent, deploys) -> str:
    """Why the fall is the model's fleet changing size, or "": its replica count rose or
    fell (an event of every replica of the model), no deploy came after it (a change point
    that began up to FLEET_LAG before the new count was seen is that change's own fall),
    requests of the same size as before, and a fall the change explains: under routing
    without affinity, no deeper than spreading the turns over more replicas; under routing
    with affinity (a prefix hash modulo the count, consistent hashing, sessions), the moved
    prefixes are found nowhere at first and the ratio refills: it is climbing, or still
    within FLEET_REFILL_GRACE of the change and not collapsed (a prompt change breaks
    every prefix at once and stays down)."""
    # a change seen in steps (2 -> 4 -> 6, as discovery finds the pods) is one change
    steps = [ev for ev in recent if ev.source == REPLICAS and ev.replicas is not None]
    if not steps:
        return ""
    ev = steps[0]
    if any(d.t >= ev.t - (FLEET_LAG if d.source == CHANGE_POINT else 0.0) and not (d.source == CHANGE_POINT and d.t <= ev.t)
           for d in deploys):
        return ""
    was, now = ev.replicas[0], steps[-1].replicas[1]
    if now == was:
        return ""
    if e.per_request is not None and e.per_request_before_fleet is not None and e.per_request_before_fleet[1] > 0:
        low, high = PER_REQUEST_HELD
        if not low <= e.per_request[1] / e.per_request_before_fleet[1] <= high:
            return ""  # the requests changed, not only where they go
    if e.ratio is not None and ev.ratio_before is not None:
        spread = now > was and e.ratio >= ev.ratio_before * was / now * FLEET_SLACK
        climbing = e.ratio_earlier is not None and e.ratio - e.ratio_earlier >= FLEET_CLIMB
        early = e.now - ev.t <= FLEET_REFILL_GRACE and e.ratio >= ev.ratio_before * FLEET_COLLAPSED
        if not (spread or climbing or early):
            return ""  # deeper than the fleet explains, and not refilling
    since = datetime.fromtimestamp(ev.t, timezone.utc).strftime("%H:%M:%S")
    before = f" (the model hit {ev.ratio_before:.0%} before)" if ev.ratio_before is not None else ""
    if now > was:
        return (f"{now} replicas since {since} UTC (was {was}){before}: under routing without prefix or session affinity "
                f"each replica sees 1/{now} of a conversation's turns and holds the rest of its context nowhere it is asked for; "
                "prefix-hash or session-affinity routing gets the hits back (`whatif --routing` quantifies it); under a prefix "
                "hash modulo the replica count the prefixes that moved refill the caches with their next requests")
    return (f"{now} replicas since {since} UTC (was {was}){before}: the prefixes the router sent to the replicas that left "
            "(under a prefix hash modulo the replica count, most of the others' too) are cached nowhere they are asked for now, "
            "until their next requests refill the caches; consistent hashing moves only the departed replicas' share "
            "(`whatif --routing` quantifies it)")


def traffic_mix(e: Evidence) -> str:
    """Why the fall is a change of the traffic mix, or "": the cache serves as many tokens
    per second as before while only the queries grew. A broken prompt prefix or evicted
    blocks lose hits; new traffic that shares no prefix with the old only dilutes them."""
    if e.token_rates is None or e.baseline_token_rates is None or (e.requests is not None and e.requests < MIX_MIN_REQUESTS):
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
