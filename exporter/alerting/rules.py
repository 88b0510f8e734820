"""Alert rules, each one unit: its config key, alert name, condition, look-back, runbook
anchor and the settings it takes, declared once in REGISTRY. Pure.

Each rule turns the facts about one (target, model) into a Condition; exporter/alerting/rules_state.py
moves the alert through its states. What discovers the rules from REGISTRY: config.py (the
`rules:` section read over exporter/config/default_rules.yml, the one home of their defaults, and
the look-back check), the engine (which rules run where, the runbook link), and the docs
and runbook tests.
"""
from __future__ import annotations

from datetime import datetime, timezone

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ..parse.snapshot import Snapshot
from ..series.samples import TargetSample
from ..series.hitratio import judged_counts, judged_ratio, judged_tokens, lookup_ratio, query_tokens, tier_shares
from ..series.window import WindowStats, last_hit_time, stats_between
from . import causes
from .analysis import token_rates
from ..parse import tiers
from .deploys import CHANGE_POINT, REPLICAS, ChangePointSettings, DeployEvent
from .rules_state import FALSE, INCONCLUSIVE, Condition
from .warmth import cold_restart, is_warm_after

DROP_AFTER_DEPLOY = "PrefixCacheHitRateDropAfterDeploy"
HIT_RATE_LOW = "PrefixCacheHitRateLow"
CACHING_DISABLED = "PrefixCachingDisabled"
HITS_STUCK_AT_ZERO = "PrefixCacheHitsStuckAtZero"
TTFT_REGRESSION = "PrefixCacheTTFTRegression"
TARGET_DOWN = "PrefixCacheTargetDown"
COUNTERS_DISAGREE = "PrefixCacheCountersDisagree"
ROUTER_PREDICTION_GAP = "PrefixCacheRouterPredictionGap"
# the drop after a deploy whose cause is a change of the traffic mix: nobody's breakage, a
# warning under a name of its own (one name, one severity: see Rule.by_cause)
TRAFFIC_MIX_CHANGED = "PrefixCacheTrafficMixChanged"


# --- settings ------------------------------------------------------------------------------
COMMON_SETTINGS = ("enabled", "severity", "for", "keep_firing_for")  # every rule takes these


@dataclass(frozen=True)
class RuleSettings:
    """One rule's settings as config.py reads them over exporter/config/default_rules.yml, their
    one home: no value is defaulted here. None: a setting the rule does not take."""

    enabled: bool
    severity: str
    for_: float
    keep_firing_for: float
    window: float | None = None
    baseline: float | None = None
    after: float | None = None
    reference: float | None = None
    below: float | None = None
    drop_points: float | None = None
    ratio: float | None = None
    min_query_tokens: float | None = None
    startup_grace: float | None = None


@dataclass(frozen=True)
class RulesConfig:
    cold_start_grace: float
    event_lookback: float
    runbook_url: str
    dashboard_url: str
    rules: dict[str, RuleSettings]  # alertname -> settings
    change_point: ChangePointSettings
    change_point_enabled: bool

    def cause_settings(self) -> causes.Settings:
        return causes.Settings(event_lookback=self.event_lookback, cold_start_grace=self.cold_start_grace)

    @property
    def anchored_reach(self) -> float:
        """How far back a read anchored at an event reaches: an event the look-back still
        watches, and a baseline before it (the deploy rule's, the causes' evidence). Not
        among them: the TTFT rule's reference, an hour-long window whose edges may move by
        a thirtieth like the hour's, and the TTFT from before the hits stopped, which the
        engine keeps from when the last hit was recent."""
        return self.event_lookback + max((s.baseline or 0.0 for s in self.rules.values()), default=0.0)

    @property
    def longest_hold(self) -> float:
        """The longest an alert's state rests on evaluations past: a rule's `for` (pending
        before firing) or keep_firing_for, of the enabled rules."""
        return max((max(s.for_, s.keep_firing_for) for s in self.rules.values() if s.enabled), default=0.0)


# --- facts and conditions ----------------------------------------------------------------------
@dataclass(frozen=True)
class Facts:
    """What the rules may look at for one (target, model) at `now`."""

    now: float
    target: str
    model: str
    up: bool
    down_since: float | None
    snapshot: Snapshot | None
    samples: Sequence[TargetSample]
    stats: dict[str, WindowStats]  # configured window name -> stats
    windows: dict[float, str]  # seconds -> configured window name
    events: tuple[DeployEvent, ...]  # this target's, oldest first
    fleet_ratios: tuple[tuple[str, float], ...] = ()  # (target, judged ratio) of the model on every target, this one's too
    peers_had_events: bool = False
    block_size: int | None = None
    ever_up: bool = True
    active_since: float | None = None  # when this alert became pending, while it is active
    anchor: float | None = None  # the event time an active alert measures against
    fleet_baseline: tuple[float, float] | None = None  # (the fleet's ratio for the model before this pod started, its start)
    anchor_baseline: float | None = None  # the ratio before `anchor`, kept by the active alert
    # (when the lookup hits last grew, TTFT p50 before that) while they stand still: kept
    # by the engine, so the evidence outlives the history it was read from
    hits_reference: tuple[float, float] | None = None
    last_error: str | None = None  # why the target's last poll failed (a pod read from Prometheus: its samples stopped)
    warm_since: float | None = None  # the newest restart's cache seen warm from this time on (exporter/alerting/warmth.py)
    kv: KVView | None = None  # its KV cache events (exporter/series/blockindex.py), where it publishes them

    def window(self, seconds: float) -> WindowStats:
        name = self.windows.get(seconds)
        if name is not None and name in self.stats:
            return self.stats[name]
        return stats_between(self.samples, self.model, self.now - seconds, self.now, 0.0, self.block_size)

    def query_tokens(self, ws: WindowStats) -> float:
        return judged_tokens(ws, self.block_size)


def _in_cold_start(f: Facts, grace: float) -> DeployEvent | None:
    return cold_restart(f.events, f.now, grace, f.warm_since)


def rule_drop_after_deploy(f: Facts, s: RuleSettings, rc: RulesConfig) -> Condition:
    deploys = [e for e in f.events if e.is_deploy and 0 <= f.now - e.t <= rc.event_lookback]
    if not deploys:
        if f.fleet_baseline is not None:
            return _against_fleet(f, s, rc)
        return _past_look_back(f, s, rc) if f.anchor is not None and f.anchor_baseline is not None else FALSE
    # an active alert keeps measuring against the deploy that raised it: a rollback
    # announced later must not become the baseline of the incident it ends
    anchored = [e for e in deploys if f.anchor is not None and e.t == f.anchor]
    ev = anchored[-1] if anchored else deploys[-1]
    emptied = [e for e in f.events if e.is_restart and e.t >= ev.t - 1.0]
    if _in_cold_start(f, rc.cold_start_grace) or (emptied and not is_warm_after(emptied[-1], f.warm_since)):
        return FALSE  # the cache was emptied: a cold start, not (yet) a prompt change
    fleet = [e for e in f.events if e.source == REPLICAS and e.replicas is not None and e.replicas[1] != e.replicas[0] and e.t >= ev.t]
    if fleet and (not anchored or ev.source == CHANGE_POINT and fleet[0].t - ev.t <= causes.FLEET_LAG):
        # the fleet grew or shrank since (a change point just before was its fall, seen before the new count):
        # before and after straddle it (the low-ratio rules judge that, replicas_changed)
        return FALSE
    baseline = stats_between(f.samples, f.model, ev.t - s.baseline, ev.t, 0.0, f.block_size)
    edge = max((x.t for x in f.samples if x.t <= ev.t), default=ev.t)
    start = max(edge - 1e-6, f.now - s.after)
    if emptied:  # refilled since the restart the deploy brought: judged on the warm cache, not its refill
        start = max(start, f.warm_since)
    after = stats_between(f.samples, f.model, start, f.now, 0.0, f.block_size)
    before_ratio, after_ratio = judged_ratio(baseline), judged_ratio(after)
    # an event we found ourselves is named `kind@epoch`: an on-call reads its time instead
    what = ev.version if "@" not in ev.version else f"{ev.version.split('@')[0]} at {utc_time(ev.t)[11:]}"
    who = f"{what} ({ev.source})"
    if f.query_tokens(baseline) < s.min_query_tokens or f.query_tokens(after) < s.min_query_tokens or before_ratio is None or after_ratio is None:
        return Condition(INCONCLUSIVE, None, f"Not enough traffic yet to judge deploy {who} on {f.target}",
                         f"Baseline {f.query_tokens(baseline):.0f} and post-deploy {f.query_tokens(after):.0f} query tokens; "
                         f"{s.min_query_tokens:.0f} needed in each.")
    dropped = _fell(before_ratio, after_ratio, s)
    if dropped and _hits_not_counted(f, after, replace(s, window=max(60.0, min(s.after, f.now - ev.t)))):
        dropped = False
    if anchored and not dropped and not recovered(before_ratio, after_ratio, s.drop_points, s.below):
        dropped = True  # still short of where it was: the incident is not over
    return Condition("true" if dropped else "false", after_ratio,
                     f"Prefix-cache hit rate of {f.model} on {f.target} fell from {before_ratio:.0%} to {after_ratio:.0%} after deploy {who}",
                     f"Token-weighted hit ratio {before_ratio:.1%} in the {s.baseline:.0f}s before the event at {utc_time(ev.t)}, "
                     f"{after_ratio:.1%} since. Uncached prompt tokens are prefilled again: TTFT and cost rise.",
                     anchor=ev.t, baseline=before_ratio)


def utc_time(t: float) -> str:
    """An event's time as an on-call reads it (an epoch in an alert's text is a lookup)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _past_look_back(f: Facts, s: RuleSettings, rc: RulesConfig) -> Condition:
    """The deploy an active alert measures against has left the look-back (and maybe the
    history) while the ratio is still down: the incident is not over, so the alert keeps
    measuring against the ratio it kept from before the deploy until the ratio is back."""
    if _in_cold_start(f, rc.cold_start_grace):
        return FALSE  # the cache was emptied since: the cold-start rules take over
    before_ratio = f.anchor_baseline
    after = f.window(s.after)
    after_ratio = judged_ratio(after)
    if f.query_tokens(after) < s.min_query_tokens or after_ratio is None:
        return Condition(INCONCLUSIVE, None, f"Not enough traffic to tell whether {f.target} recovered",
                         f"{f.query_tokens(after):.0f} query tokens in the last {s.after:.0f}s; {s.min_query_tokens:.0f} needed.")
    down = not recovered(before_ratio, after_ratio, s.drop_points, s.below) and not _hits_not_counted(f, after, replace(s, window=60.0))
    return Condition("true" if down else "false", after_ratio,
                     f"Prefix-cache hit rate of {f.model} on {f.target} is still {after_ratio:.0%}, against {before_ratio:.0%} "
                     f"before the deploy at {f.anchor:.0f}",
                     f"Token-weighted hit ratio {after_ratio:.1%} over the last {s.after:.0f}s against {before_ratio:.1%} before "
                     f"the deploy at {f.anchor:.0f}, longer ago than the {rc.event_lookback:.0f}s look-back: the alert holds "
                     "until the ratio is back.", anchor=f.anchor, baseline=before_ratio)


def _against_fleet(f: Facts, s: RuleSettings, rc: RulesConfig) -> Condition:
    """A pod new to us has no before of its own: once its cold start is over (and for
    event_lookback after), its ratio against the fleet's for its model before it started."""
    before_ratio, started = f.fleet_baseline
    warm = started + rc.cold_start_grace
    if f.warm_since is not None and f.warm_since >= started:
        warm = min(warm, f.warm_since)  # its cache refilled before the grace ran out
    if f.now < warm or (f.now - warm > rc.event_lookback and f.anchor is None) or _in_cold_start(f, rc.cold_start_grace):
        return FALSE
    after = stats_between(f.samples, f.model, max(warm, f.now - s.after), f.now, 0.0, f.block_size)
    after_ratio = judged_ratio(after)
    if f.query_tokens(after) < s.min_query_tokens or after_ratio is None:
        return Condition(INCONCLUSIVE, None, f"Not enough traffic yet to compare {f.target} with the fleet",
                         f"{f.query_tokens(after):.0f} query tokens since the cold start; {s.min_query_tokens:.0f} needed.")
    dropped = _fell(before_ratio, after_ratio, s)
    if f.anchor is not None and not dropped and not recovered(before_ratio, after_ratio, s.drop_points, s.below):
        dropped = True
    marker = DeployEvent(warm, f.target, "new pod", "fleet_baseline", "a pod new to the fleet")
    cause = causes.classify(replace(evidence(f, rc), events=f.events + (marker,), baseline=before_ratio), rc.cause_settings())
    return Condition("true" if dropped else "false", after_ratio,
                     f"Prefix-cache hit rate of {f.model} on the new pod {f.target} is {after_ratio:.0%}, "
                     f"against {before_ratio:.0%} for the fleet before it started",
                     f"The fleet served {before_ratio:.1%} of {f.model}'s prompt tokens from the cache before {f.target} "
                     f"started (Prometheus, fleet_baseline.query); {f.target} serves {after_ratio:.1%} since its cold start ended.",
                     cause=cause, anchor=warm)


def _fell(before: float, after: float, s: RuleSettings) -> bool:
    """A drop: `drop_points` or more, or from at least `below` to under it."""
    return before - after >= s.drop_points or after < s.below <= before


def recovered(before: float, after: float, drop_points: float, below: float) -> bool:
    """An active drop alert ends when the ratio is back within half its threshold (and not
    under `below` where it was at or above it); the rollout gate's alert ends the same way."""
    return before - after < drop_points / 2 and not after < below <= before


def rule_hit_rate_low(f: Facts, s: RuleSettings, rc: RulesConfig) -> Condition:
    if _in_cold_start(f, rc.cold_start_grace):
        return FALSE
    ws = f.window(s.window)
    ratio = judged_ratio(ws)
    if ratio is None or f.query_tokens(ws) < s.min_query_tokens or ratio >= s.below or _hits_not_counted(f, ws, s):
        return FALSE
    return Condition("true", ratio, f"Prefix-cache hit rate of {f.model} on {f.target} is {ratio:.0%}",
                     f"Token-weighted hit ratio {ratio:.1%} over {s.window:.0f}s, under the {s.below:.0%} threshold.")


def rule_caching_disabled(f: Facts, s: RuleSettings, rc: RulesConfig) -> Condition:
    if f.snapshot is None or f.snapshot.prefix_caching_enabled is not False:
        return FALSE
    return Condition("true", 0.0, f"Prefix caching is disabled on {f.target}",
                     "vLLM reports enable_prefix_caching=False: no prompt prefix is reused. Start vLLM with --enable-prefix-caching.",
                     (causes.CACHING_DISABLED, "vLLM reports prefix caching off"))


def rule_hits_stuck_at_zero(f: Facts, s: RuleSettings, rc: RulesConfig) -> Condition:
    if f.snapshot is not None and f.snapshot.prefix_caching_enabled is False:
        return FALSE
    if _in_cold_start(f, rc.cold_start_grace):
        return FALSE  # an emptied cache refilling: the grace delays, and hits that never come fire after it
    ws = f.window(s.window)
    if ws.hit_increase != 0 or query_tokens(ws) < s.min_query_tokens:  # tokens, also of a target counting blocks
        return FALSE
    if _cache_works_by_other_evidence(f, ws, s):
        return FALSE  # the hit counter is not wired: PrefixCacheCountersDisagree says so
    return Condition("true", 0.0, f"Prefix-cache hits of {f.model} on {f.target} are stuck at zero",
                     f"{f.query_tokens(ws):.0f} query tokens and not one hit in {s.window:.0f}s. Known on some hardware backends; "
                     "also seen when every prompt is shorter than one block.")


def _cache_works_by_other_evidence(f: Facts, ws: WindowStats, s: RuleSettings) -> str:
    """Why the cache works although its hit counter says zero, or "": the admitted-prefill
    counters count hits, or (without them) the recent TTFT stays at its level of the time
    before the hits stopped, however long ago that was (the engine keeps that level)."""
    if ws.admitted_hit_increase is not None:
        return f"admitted prefill counted {ws.admitted_hit_increase:.0f} cached tokens" if ws.admitted_hit_increase > 0 else ""
    ref = f.hits_reference or hits_reference(f.samples, f.model, f.block_size)
    if ref is None or ref[0] >= f.now:
        return ""
    last, p_before = ref
    # the recent TTFT, not all of it since the hits stopped: a cache that goes cold an
    # hour after its hit counter stopped shows at once
    since = stats_between(f.samples, f.model, max(last, f.now - max(s.window, 60.0)), f.now, 0.0, f.block_size)
    p_now = since.ttft_quantiles.get(0.5)
    if (since.ttft_count_increase or 0) < 10 or since.hit_increase != 0 or not since.query_increase or p_now is None:
        return ""
    if p_now <= 1.2 * p_before:
        return f"TTFT p50 stayed at {p_now * 1000:.0f} ms ({p_before * 1000:.0f} ms while hits were counted)"
    return ""


REFERENCE_SECONDS = 300.0  # TTFT before the hits stopped: long enough for a few hundred requests


def hits_reference(samples: Sequence[TargetSample], model: str, block_size: int | None) -> tuple[float, float] | None:
    """(when the lookup hits last grew, TTFT p50 over the REFERENCE_SECONDS before), or
    None where the history holds no such time with enough requests."""
    last = last_hit_time(samples, model)
    if last is None:
        return None
    before = stats_between(samples, model, last - REFERENCE_SECONDS, last, 0.0, block_size)
    p_before = before.ttft_quantiles.get(0.5)
    if (before.ttft_count_increase or 0) < 10 or (before.hit_increase or 0) <= 0 or p_before is None:
        return None
    return last, p_before


def _hits_not_counted(f: Facts, ws: WindowStats, s: RuleSettings) -> bool:
    """Lookup hits stopped while the cache demonstrably works: a ratio from such counters
    is their bookkeeping, not the cache (PrefixCacheCountersDisagree says so)."""
    return ws.admitted_hit_increase is None and bool(_cache_works_by_other_evidence(f, ws, s))


def rule_counters_disagree(f: Facts, s: RuleSettings, rc: RulesConfig) -> Condition:
    """The engine's counters contradict each other: the lookup ratio and the admitted
    ratio differ by `drop_points`, or hits sit at zero while the cache demonstrably works,
    or the lookup counters stand still while prompt tokens flow."""
    if f.snapshot is not None and f.snapshot.prefix_caching_enabled is False:
        return FALSE
    ws = f.window(s.window)
    lookup, admitted = lookup_ratio(ws), ws.admitted_hit_ratio
    why = ""
    if admitted is not None and (ws.admitted_prompt_increase or 0) >= s.min_query_tokens:
        if lookup is None and (ws.query_increase or 0) == 0:
            why = f"the lookup counters stood still while {ws.admitted_prompt_increase:.0f} prompt tokens were admitted"
        elif lookup is not None and query_tokens(ws) >= s.min_query_tokens and abs(lookup - admitted) >= s.drop_points:
            why = (f"lookups say {lookup:.0%} while admitted prefill says {admitted:.0%} "
                   f"({'lookups recorded again on scheduler retries under KV pressure' if lookup > admitted else 'hits not recorded by the lookup path'})")
    elif admitted is None and query_tokens(ws) >= s.min_query_tokens:
        works = _cache_works_by_other_evidence(f, ws, s)
        if works:
            why = f"prefix-cache hits stayed at zero while {works}"
    if not why:
        return FALSE
    return Condition("true", admitted if admitted is not None else lookup,
                     f"The prefix-cache counters of {f.model} on {f.target} disagree",
                     f"Over {s.window:.0f}s {why}. The engine's bookkeeping is wrong, not necessarily its cache: "
                     "alerts judge the admitted-prefill ratio where it exists.",
                     (causes.INSTRUMENTATION, why))


def rule_ttft_regression(f: Facts, s: RuleSettings, rc: RulesConfig) -> Condition:
    if _in_cold_start(f, rc.cold_start_grace):
        return FALSE
    if any(e.is_restart and f.now - s.window < e.t <= f.now for e in f.events):
        return FALSE  # warm again, but the recent window still holds the refill's prefills: judged once it left them
    recent = f.window(s.window)
    r_now = judged_ratio(recent)
    if r_now is None or f.query_tokens(recent) < s.min_query_tokens:
        return FALSE
    # The reference is the time before the recent window, so a long regression cannot
    # become its own reference. It costs a pass over the history, and the quantiles a
    # pass over the buckets, so first a cheap test: the long window mixes reference and
    # recent time, at least half reference by default, so a drop of d points from the
    # reference shows as at least d/2 in it.
    longest = f.window(max(f.windows)) if f.windows else recent
    r_long = judged_ratio(longest)
    if f.active_since is None and (r_long is None or r_long - r_now < s.drop_points / 2):
        return FALSE
    p_now = recent.ttft_quantiles.get(0.99)
    if p_now is None:
        return FALSE
    # while the alert is active its reference stays the time before it began: a
    # baseline never slides into the incident it measures
    ref_end = f.now - s.window if f.active_since is None else min(f.now, f.active_since) - s.window
    reference = stats_between(f.samples, f.model, ref_end - s.reference, ref_end, 0.0, f.block_size)
    r_ref, p_ref = judged_ratio(reference), reference.ttft_quantiles.get(0.99)
    if r_ref is None or p_ref is None or p_ref <= 0 or f.query_tokens(reference) < s.min_query_tokens:
        return FALSE
    if p_now / p_ref < s.ratio or r_ref - r_now < s.drop_points:
        return FALSE
    # the reference as far as the history reaches back (a sidecar that started 8 minutes ago has no 55 before)
    covered = ref_end - max(ref_end - s.reference, f.samples[0].t) if len(f.samples) else s.reference
    return Condition("true", p_now, f"TTFT p99 of {f.model} on {f.target} is {p_now / p_ref:.1f}x its usual level as the hit rate fell",
                     f"TTFT p99 {p_now * 1000:.0f} ms over the last {s.window:.0f}s against {p_ref * 1000:.0f} ms in the "
                     f"{covered:.0f}s before, while the hit ratio went from {r_ref:.0%} to {r_now:.0%}.")


def rule_target_down(f: Facts, s: RuleSettings, rc: RulesConfig) -> Condition:
    if f.up or f.down_since is None:  # up, or not polled yet
        return FALSE
    if not f.ever_up and f.now - f.down_since < max(0.0, s.startup_grace - s.for_):
        return FALSE  # never answered yet: vLLM may still be loading its model (a startupProbe's grace)
    why = f" ({_clip(f.last_error)})" if f.last_error else ""
    return Condition("true", 0.0, f"vLLM target {f.target} cannot be polled",
                     f"The sidecar gets no vLLM metrics from the target{why}: it is down, slow, or not vLLM. Hit-rate alerts for it are blind.",
                     (causes.UNKNOWN, "target down"))


def _clip(text: str, limit: int = 200) -> str:
    """An error as far as an alert's description needs it (a target's body can be long)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- the registry: each rule declared once --------------------------------------------------
PER_MODEL, PER_TARGET, ACROSS_TARGETS = "per_model", "per_target", "across_targets"


@dataclass(frozen=True)
class Rule:
    """One alert rule. Its defaults live in exporter/config/default_rules.yml under `key`, which
    holds exactly COMMON_SETTINGS and `settings`; its runbook section is `### <anchor>`
    in alerts/runbook.md."""

    key: str  # under `rules:` in the config
    alertname: str
    settings: tuple[str, ...]  # the keys it takes besides COMMON_SETTINGS
    # None: the engine judges it across targets (a router against its engines: exporter/alerting/router.py)
    condition: Callable[[Facts, RuleSettings, RulesConfig], Condition] | None
    look_back: tuple[str, ...] = ()  # the settings whose sum is how far back it reads the history
    scope: str = PER_MODEL  # each (target, model); PER_TARGET: each target once, model ""
    # (cause, alert name, severity): a firing alert of this cause is delivered under that name,
    # at that severity at most. One name has one severity, so an inhibition that is equal on
    # alertname (kube-prometheus-stack's critical over warning) never lets one pod's critical
    # silence another pod's warning of a milder cause.
    by_cause: tuple[tuple[str, str, str], ...] = ()
    # its `window` must be one of global.windows: it reads that window's stats as every
    # poll keeps them (a router's predictions, the fleet's ratios), never its own span
    global_window: bool = False

    @property
    def runbook_anchor(self) -> str:
        return self.alertname.lower()

    @property
    def alertnames(self) -> tuple[str, ...]:
        """Every name this rule's alerts are delivered under: its own first."""
        return (self.alertname,) + tuple(name for _, name, _ in self.by_cause)

    def delivered_as(self, cause: str, severity: str) -> tuple[str, str]:
        """(alert name, severity) of this rule's alert with `cause`, the rule configured at `severity`."""
        for c, name, at_most in self.by_cause:
            if c == cause:
                return name, min(severity, at_most, key=SEVERITIES.index)
        return self.alertname, severity

    def looks_back(self, s: RuleSettings) -> float:
        return sum(getattr(s, name) for name in self.look_back)

    def inconclusive_bound(self, s: RuleSettings, rc: RulesConfig) -> float:
        """How long a firing alert of this rule holds on `inconclusive` (too little traffic)
        after its condition was last true: its look-back, after which nothing that made it
        fire is left in what it reads (a rule that reads no span: the events' look-back)."""
        return self.looks_back(s) or rc.event_lookback


SEVERITIES = ("info", "warning", "critical")  # mildest first


REGISTRY: tuple[Rule, ...] = (
    Rule("hit_rate_drop_after_deploy", DROP_AFTER_DEPLOY, ("baseline", "after", "below", "drop_points", "min_query_tokens"),
         rule_drop_after_deploy, look_back=("baseline", "after"), by_cause=((causes.TRAFFIC_MIX, TRAFFIC_MIX_CHANGED, "warning"),)),
    # its window's ratios of every replica of a model are the fleet's, for load_balancer_scatter
    Rule("hit_rate_low", HIT_RATE_LOW, ("window", "below", "min_query_tokens"), rule_hit_rate_low, look_back=("window",),
         global_window=True),
    Rule("caching_disabled", CACHING_DISABLED, (), rule_caching_disabled),
    Rule("hits_stuck_at_zero", HITS_STUCK_AT_ZERO, ("window", "min_query_tokens"), rule_hits_stuck_at_zero,
         look_back=("window",)),
    Rule("ttft_regression", TTFT_REGRESSION, ("window", "reference", "ratio", "drop_points", "min_query_tokens"),
         rule_ttft_regression, look_back=("window", "reference")),
    Rule("target_down", TARGET_DOWN, ("startup_grace",), rule_target_down, scope=PER_TARGET),
    Rule("counters_disagree", COUNTERS_DISAGREE, ("window", "drop_points", "min_query_tokens"), rule_counters_disagree,
         look_back=("window",)),
    # its window is one of global.windows, read from the engines' window stats, not the history
    Rule("router_prediction_gap", ROUTER_PREDICTION_GAP, ("window", "drop_points", "min_query_tokens"), None,
         scope=ACROSS_TARGETS, global_window=True),
)
# static views of the registry, for readers that list the alerts (the runbook's tests, the relay rules):
# every name an alert of the sidecar is delivered under
ALERT_NAMES = tuple(name for rule in REGISTRY for name in rule.alertnames)
RUNBOOK_ANCHORS = {name: name.lower() for name in ALERT_NAMES}


def registered(alertname: str) -> Rule:
    """The rule whose alerts are delivered under `alertname` (its own name or a cause's)."""
    return next(rule for rule in REGISTRY if alertname in rule.alertnames)


def runbook_anchor(alertname: str) -> str:
    registered(alertname)  # a name no rule delivers has no section
    return alertname.lower()


def rules_to_run(rc: RulesConfig) -> tuple[list[tuple[Rule, RuleSettings]], list[tuple[Rule, RuleSettings]]]:
    """The enabled rules the engine runs: (those on each target once, those on each of its
    models), in registry order."""
    enabled = [(rule, rc.rules[rule.alertname]) for rule in REGISTRY
               if rule.condition is not None and rule.alertname in rc.rules and rc.rules[rule.alertname].enabled]
    return [r for r in enabled if r[0].scope == PER_TARGET], [r for r in enabled if r[0].scope == PER_MODEL]


def evidence(f: Facts, rc: RulesConfig) -> causes.Evidence:
    short = min(f.windows) if f.windows else 60.0
    now_ws = f.window(short)
    earlier = stats_between(f.samples, f.model, f.now - 2 * short, f.now - short, 0.0, f.block_size)
    long_ws = f.window(max(f.windows)) if f.windows else now_ws
    recent = [e for e in f.events if 0 <= f.now - e.t <= rc.event_lookback]
    deploys = causes.changes(recent, f.warm_since)
    baseline = None
    drop = rc.rules[DROP_AFTER_DEPLOY]
    rates, baseline_rates = token_rates(now_ws), token_rates(long_ws)
    before_tiers, after_tiers = long_ws, now_ws
    if deploys:
        ev = next((e for e in deploys if e.t == f.anchor), deploys[-1])
        before = before_tiers = stats_between(f.samples, f.model, ev.t - drop.baseline, ev.t, 0.0, f.block_size)
        baseline = judged_ratio(before)
        # the traffic since the event against the traffic before it, as the deploy rule compares
        edge = max((x.t for x in f.samples if x.t <= ev.t), default=ev.t)
        if ev.is_restart:  # after the refill, not during it
            edge = max(edge, f.warm_since)
        since = stats_between(f.samples, f.model, max(edge - 1e-6, f.now - drop.after), f.now, 0.0, f.block_size)
        rates, baseline_rates = token_rates(since), token_rates(before)
        after_tiers = since
    fleet = [e for e in recent if e.source == REPLICAS]
    before_fleet = stats_between(f.samples, f.model, fleet[0].t - drop.baseline, fleet[0].t, 0.0, f.block_size) if fleet else None
    return causes.Evidence(
        now=f.now,
        caching_enabled=f.snapshot.prefix_caching_enabled if f.snapshot else None,
        ratio=judged_ratio(now_ws), ratio_earlier=judged_ratio(earlier),
        baseline=baseline if baseline is not None else judged_ratio(long_ws),
        # after a deploy, KV usage around it matters; with none, a slide over the long window
        kv_usage_max=now_ws.kv_cache_usage_max if deploys else long_ws.kv_cache_usage_max,
        preemptions=now_ws.preemption_increase,
        events=f.events, peer_ratios=tuple(r for other, r in f.fleet_ratios if other != f.target),
        peers_had_events=f.peers_had_events,
        requests=now_ws.ttft_count_increase,
        token_rates=rates, baseline_token_rates=baseline_rates,
        tiers=tuple(tier_shares(after_tiers).items()), baseline_tiers=tuple(tier_shares(before_tiers).items()),
        per_request=_per_request(now_ws), per_request_before_fleet=_per_request(before_fleet),
        evicted_before_reuse=_evicted_before_reuse(f),
        warm_since=f.warm_since, kv=f.kv,
    )


def _per_request(ws: WindowStats | None) -> tuple[float, float] | None:
    """(hit tokens, query tokens) per request that got its first token, of the judged counters."""
    if ws is None or not ws.ttft_count_increase:
        return None
    hits, queries = judged_counts(ws)
    return (hits / ws.ttft_count_increase, queries / ws.ttft_count_increase) if queries > 0 else None


def _evicted_before_reuse(f: Facts) -> bool | None:
    """vLLM's KV residency histograms of the model's engines (since they started): blocks
    evicted sooner than they are reused on any engine; None without them."""
    if f.snapshot is None:
        return None
    found = [tiers.evicted_before_reuse(s.kv_idle_before_evict, s.kv_reuse_gap) for s in f.snapshot.series if s.model_name == f.model]
    known = [x for x in found if x is not None]
    return any(known) if known else None
