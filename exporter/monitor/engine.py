"""The monitoring core: scrapes and events in, windows, alert states and transitions out.

Live, each target's poll job calls `observe()` (work that grows with that target's size,
touching only its own Track), the poller adds the events it found under a small lock,
and the evaluation job calls `evaluate()` on the immutable views the tracks publish.
`backtest` drives the very same object from a recording on a simulated clock through
`ingest()`. No I/O, no threads, no clock: every call gets `now`.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from weakref import WeakValueDictionary

from ..alerting import analysis, causes, rollouts, router as routing
from ..alerting.deploys import (
    CHANGE_POINT,
    DeployEvent,
    SnapshotChangeDetector,
    change_point_has_traffic,
    detect_change_point,
)
from ..alerting.rules import (
    DROP_AFTER_DEPLOY,
    HIT_RATE_LOW,
    ROUTER_PREDICTION_GAP,
    Facts,
    evidence,
    hits_reference,
    registered,
    rules_to_run,
    runbook_anchor,
)
from ..alerting.warmth import warm_because, warmth_settings
from ..alerting.rules_state import FIRING, INACTIVE, PENDING, RESOLVED, Alert, Condition, Transition, step
from ..config.sections import Config, Target
from ..parse import roles
from ..parse.snapshot import Snapshot
from ..series.history import History
from ..series.samples import Samples
from ..series.window import WindowStats, interval_sums, recent_intervals, stats_between, summarize
from .fleetsize import ReplicaCounts, fleet_ratios
from .targetview import TargetView

# every sample of the last 5 minutes, one per 30 s to 15 minutes, one a minute to Config.anchored_seconds, then History.far_step
_FINE_SECONDS, _MID_SECONDS, _MID_STEP = 300.0, 900.0, 30.0
_MAX_EVENTS = 10000


@dataclass
class Track:
    """One target's machinery. `view` is what the rules (and, published, everyone else)
    read of it: replaced whole after each poll, never changed in place."""

    target: Target
    history: History
    detector: SnapshotChangeDetector
    view: TargetView
    router: routing.RouterHistory | None = None  # a prefix-aware router's predictions' counters

    @property
    def stats(self) -> dict[str, dict[str, WindowStats]]:
        return self.view.stats

    @property
    def up(self) -> bool:
        return self.view.up


def _with_ingest_notes(snapshot: Snapshot, track: Track) -> Snapshot:
    """The snapshot with what ingesting it refused (a counter stepping back, a start time
    flapping), counted and shown with the parser's own warnings."""
    steps, refused = track.history.steps_back, track.detector.refused
    if not steps and not refused:
        return snapshot
    counts = {"counter_step_back": len(steps)} if steps else {}
    if refused:
        counts["flapping_start_time"] = refused
    return snapshot.noted(steps + track.detector.notes, counts)


class Engine:
    def __init__(self, config: Config):
        self.config = config
        self.tracks: dict[str, Track] = {}
        self.layouts: WeakValueDictionary = WeakValueDictionary()  # the histories' layouts: one for targets alike
        self.events: deque[DeployEvent] = deque(maxlen=_MAX_EVENTS)
        self.event_counts: dict[tuple[str, str], int] = {}
        self.last_deploy_t: dict[str, float] = {}  # target ('' for all) -> newest deploy-like event
        self.last_event_t: dict[str, float] = {}  # target ('' for all) -> newest event of any kind
        self.last_restart_t: dict[str, float] = {}  # target ('' for all) -> newest restart
        self.alerts: dict[tuple, Alert] = {}  # Alert.key -> the alert
        self._decoding: dict[str, bool] | None = None  # target -> a decode pod, during an evaluation
        # (model, scope) -> its newest rollout there (exporter/alerting/rollouts.py): versions are compared within a scope only
        self.rollouts: dict[rollouts.Key, rollouts.Rollout] = {}
        self.verdicts: dict[rollouts.Key, analysis.Verdict] = {}  # the gate's verdict at the last evaluation, while versions are judged
        self.fleet_baselines: dict[tuple[str, str], tuple[float, float]] = {}  # (target, model) -> (ratio, pod start)
        # (target, model) -> (last lookup hit, TTFT p50 before it) while its hits stand still
        self.hits_references: dict[tuple[str, str], tuple[float, float]] = {}
        # router target -> model -> window -> (predicted, delivered), as of the last evaluation
        self.predictions: dict[str, dict[str, dict[str, tuple[routing.Prediction, routing.Delivered]]]] = {}
        self.replicas = ReplicaCounts()  # of each model
        self.reconfigure(config)

    # --- configuration ---------------------------------------------------------------
    def _new_history(self, config: Config) -> History:
        return History(config.history_seconds, _FINE_SECONDS, windows=[s for _, s in config.global_.windows],
                       mid_seconds=_MID_SECONDS, mid_step=_MID_STEP, layouts=self.layouts, far_seconds=config.anchored_seconds)

    def reconfigure(self, config: Config) -> None:
        """New targets get an empty history; kept targets keep theirs (and their
        detectors), also when the windows change. Alerts of removed targets or disabled
        rules are resolved by the next evaluation, not dropped."""
        self.config = config
        # `rules.change_point`, its spans at least as long as the polls need (every poll reads them): a step is
        # two intervals, its reference three (at a 20 s poll 15 s would never hold two)
        cp, poll = config.rules.change_point, config.global_.poll_interval
        self._change_point_spans = replace(cp, recent=max(cp.recent, 2 * poll), reference=max(cp.reference, 4 * poll))
        self._warmth = warmth_settings(config.rules.rules[DROP_AFTER_DEPLOY], poll)
        old = self.tracks
        tracks = {}
        for t in config.targets:
            track = old.get(t.name)
            if track is None:
                track = Track(t, self._new_history(config), SnapshotChangeDetector(t.name, config.rules.cold_start_grace), TargetView(t))
            else:
                track.target = t  # mutate: a poll in flight holds this object
                track.view = replace(track.view, target=t)
                track.history.retarget(config.history_seconds, [s for _, s in config.global_.windows], config.anchored_seconds)
                track.detector.grace = config.rules.cold_start_grace
            tracks[t.name] = track
        self.tracks = tracks
        self.predictions = {k: v for k, v in self.predictions.items() if k in tracks}
        self.fleet_baselines = {k: v for k, v in self.fleet_baselines.items() if k[0] in tracks}
        # everything keyed by a target goes with it ('' is the fleet): pods churn for ever
        self.last_deploy_t, self.last_event_t, self.last_restart_t = (
            {n: t for n, t in times.items() if not n or n in tracks} for times in (self.last_deploy_t, self.last_event_t, self.last_restart_t))
        for key in [k for k in self.event_counts if k[0] and k[0] not in tracks]:
            del self.event_counts[key]

    @property
    def routers(self) -> dict[str, routing.RouterHistory]:
        """Router target -> its predictions' counters (each lives on its target's Track)."""
        return {name: t.router for name, t in self.tracks.items() if t.router is not None}

    # --- input -------------------------------------------------------------------------
    def observe(self, target: str, now: float, snapshot: Snapshot) -> list[DeployEvent]:
        """A successful scrape: history, detectors, window stats, change point. Touches
        only this target's Track, so the poller runs it without the shared lock.
        Returns the events it revealed; the caller hands them to `add_event`."""
        track = self.tracks[target]
        if snapshot.router is not None:
            if track.router is None:
                track.router = routing.RouterHistory(self.config.history_seconds)
            track.router.append(now, snapshot.router)
        if track.history.append(now, snapshot) is None:
            return []
        found = track.detector.observe(now, snapshot)
        snapshot = _with_ingest_notes(snapshot, track)
        view, samples = track.view, track.history.samples()
        track.view = view.evolve(samples=samples, stats=self._summarize(samples, snapshot, now), snapshot=snapshot,
                                 up=True, down_since=None, ever_up=True, last_t=now, since=now if view.since is None else view.since)
        self._watch_warmth(track, now, found)
        point = self._change_point(track, now, found)
        if point is not None:
            found.append(point)
        return found

    def ingest(self, target: str, now: float, snapshot: Snapshot) -> list[DeployEvent]:
        """`observe` and `add_event` in one call, for single-threaded drivers."""
        found = self.observe(target, now, snapshot)
        for ev in found:
            self.add_event(ev)
        return found

    def set_fleet_baseline(self, target: str, model: str, ratio: float, started: float) -> None:
        """The fleet's ratio for `model` before `target` started (read from Prometheus)."""
        self.fleet_baselines[(target, model)] = (ratio, started)

    def ingest_failure(self, target: str, now: float) -> None:
        track = self.tracks[target]
        view = track.view
        down_since = now if view.up or view.down_since is None else view.down_since
        view = replace(view, up=False, down_since=down_since)
        track.view = replace(view, stats=self._summarize(view.samples, view.snapshot, now))

    def add_event(self, event: DeployEvent) -> None:
        self.events.append(event)
        key = (event.target or "", event.source)
        self.event_counts[key] = self.event_counts.get(key, 0) + 1
        # an event of one model's replicas (in one scope) is each of theirs (a fleet-wide one would
        # keep the change point of every other model quiet too)
        targets = [event.target or ""] if event.model is None or event.target else \
            [name for name, t in list(self.tracks.items()) if event.model in t.view.stats and self._scope(t) == event.scope]
        # observe() reads these two without the poller's engine lock: replaced whole, never changed in place
        self.last_event_t = {**self.last_event_t, **{n: max(self.last_event_t.get(n, event.t), event.t) for n in targets}}
        if event.is_restart:
            target = event.target or ""
            self.last_restart_t = {**self.last_restart_t, target: max(self.last_restart_t.get(target, event.t), event.t)}
        elif event.is_deploy:
            target = event.target or ""
            self.last_deploy_t[target] = max(self.last_deploy_t.get(target, event.t), event.t)

    def _summarize(self, samples: Samples, snapshot: Snapshot | None, now: float):
        g = self.config.global_
        return summarize(samples, now, g.windows, g.min_query_tokens, snapshot.block_size if snapshot else None)

    def _newest_restart(self, target: str, found: list[DeployEvent]) -> float:
        newest = max(self.last_restart_t.get(target, -math.inf), self.last_restart_t.get("", -math.inf))
        return max(newest, max((e.t for e in found if e.is_restart), default=-math.inf))

    def _watch_warmth(self, track: Track, now: float, found: list[DeployEvent]) -> None:
        """Within the cold-start grace of the target's newest restart, and until its cache is
        seen warm: is it warm now? The time is kept on the view, so the grace ends once."""
        name, view, s = track.target.name, track.view, self._warmth
        restart = self._newest_restart(name, found)
        if not 0 <= now - restart <= self.config.rules.cold_start_grace or (view.warm_since or -math.inf) >= restart:
            return
        levels = {model: ratio for (target, model), (ratio, _) in self.fleet_baselines.items() if target == name}
        if warm_because(view.samples, sorted(view.stats), restart, now, levels, s, view.snapshot.block_size if view.snapshot else None):
            track.view = view.evolve(warm_since=now - s.span)

    def _change_point(self, track: Track, now: float, found: list[DeployEvent]) -> DeployEvent | None:
        rc = self.config.rules
        if not rc.change_point_enabled:
            return None
        cp = self._change_point_spans
        span = cp.recent + cp.reference + 2 * self.config.global_.poll_interval
        name = track.target.name
        if self._explained(name, now, span, found):
            return None
        view = track.view.samples
        block_size = track.view.snapshot.block_size if track.view.snapshot else None
        for model in sorted(track.view.stats):
            # the same sums detect_change_point starts with, without building intervals:
            # almost every poll of almost every model stops here
            (bq, bh, bn), (rq, rh, rn) = interval_sums(view, model, now - cp.recent - cp.reference, now - cp.recent, now)
            if rn < 2 or bn < 3 or bq <= 0 or rq <= 0 or bh / bq - rh / rq < cp.drop_points:
                continue
            unit = next((ws.unit for ws in track.view.stats[model].values() if ws.unit), None)
            if not change_point_has_traffic(rq, bq, cp, unit, block_size):
                continue
            began = detect_change_point(recent_intervals(view, model, now - span), now, cp, unit, block_size)
            if began is not None:
                return DeployEvent(began, name, f"suspected@{int(began)}", CHANGE_POINT,
                                   f"hit ratio of {model} fell sharply with no deploy event")
        return None

    def _explained(self, target: str, now: float, span: float, found: list[DeployEvent]) -> bool:
        """An event of the target (or the fleet) within the span, or a restart within the
        cold-start grace, explains a fall. Dict lookups: this runs on every poll, without
        the shared lock, so it neither copies nor walks the event stream."""
        newest_event = max(self.last_event_t.get(target, -math.inf), self.last_event_t.get("", -math.inf))
        newest_restart = self._newest_restart(target, found)
        if found:  # the poll's own events (rare)
            newest_event = max(newest_event, max(e.t for e in found))
        if self._flapping(target):
            newest_restart = -math.inf  # its "restarts" were processes taking turns: no grace
        track = self.tracks.get(target)
        warm_since = track.view.warm_since if track is not None else None
        if warm_since is not None and warm_since >= newest_restart:
            newest_restart = -math.inf  # its cache refilled: a fall since is judged as any fall
        return now - newest_event <= span or now - newest_restart <= self.config.rules.cold_start_grace

    def _flapping(self, target: str) -> bool:
        """Start times of the target flap between processes (one URL, several replicas):
        its restarts grant no cold-start grace, which would otherwise never end."""
        track = self.tracks.get(target)
        return track is not None and track.detector.flapping

    # --- output ------------------------------------------------------------------------
    def last_deploy(self) -> dict[str, float]:
        """target ('' for all) -> time of the newest deploy-like event (not restarts)."""
        return dict(self.last_deploy_t)

    def take_events(self, now: float) -> tuple[DeployEvent, ...]:
        """Forget events older than every rule looks back; a copy of the rest, for
        `evaluate` (the poller calls this under its lock)."""
        horizon = max(self.config.rules.event_lookback, self.config.rules.cold_start_grace) + 60.0
        # events arrive close to time order; one older than every rule looks back is dead
        while self.events and now - self.events[0].t > horizon:
            self.events.popleft()
        return tuple(self.events)

    def evaluate(self, now: float, events: tuple[DeployEvent, ...] | None = None) -> list[Transition]:
        """Run every enabled rule on every (target, model). An alert whose key was not
        evaluated (target gone, rule disabled, model vanished, a TargetDown that was
        raised before the first scrape) resolves. Reads only the tracks' views."""
        self._decoding = {}  # each target's role judged once an evaluation, not once a question
        try:
            return self._evaluate(now, events)
        finally:
            self._decoding = None

    def _evaluate(self, now: float, events: tuple[DeployEvent, ...] | None) -> list[Transition]:
        if events is None:
            events = self.take_events(now)
        fleet = self._fleet_changes(now)
        for ev in fleet:
            self.add_event(ev)
        events = tuple(events) + tuple(fleet)
        rc = self.config.rules
        transitions: list[Transition] = []
        window_names = {secs: name for name, secs in self.config.global_.windows}
        scopes = {name: self._scope(track) for name, track in list(self.tracks.items())}
        by_model = self._fleet_ratios(scopes)
        by_target: dict[str, list[DeployEvent]] = {}
        for e in events:
            by_target.setdefault(e.target or "", []).append(e)
        horizon = max(rc.event_lookback, rc.cold_start_grace)
        events_of = {}
        for name in self.tracks:
            mine = [e for e in by_target.get(name, []) + by_target.get("", []) if 0 <= now - e.t <= horizon
                    and not (e.is_restart and self._flapping(name))]
            events_of[name] = tuple(sorted(mine, key=lambda e: e.t))
        evaluated: set[tuple] = set()  # the Alert.key of every alert evaluated
        references: dict[tuple[str, str], tuple[float, float]] = {}  # rebuilt: gone targets and models drop out
        # per model and scope, its fleet once (not a list of peers per target: that was quadratic in the targets)
        fleets = {key: tuple(ratios) for key, ratios in by_model.items()}
        with_events = {key: {other for other, _ in ratios if any(e.concerns(*key) for e in events_of.get(other, ()))}
                       for key, ratios in by_model.items()}
        target_rules, model_rules = rules_to_run(rc)
        for name, track in list(self.tracks.items()):
            view = track.view
            # a decode pod's prompt arrives as KV from prefill pods: its ratio is near zero by design
            for model in [""] + ([] if self._decode(track) else sorted(view.stats)):
                eventful = with_events.get((model, scopes[name]), ()) if model else ()
                mine = tuple(e for e in events_of[name] if e.concerns(model, scopes[name]))
                base = Facts(now=now, target=name, model=model, up=view.up, down_since=view.down_since,
                             snapshot=view.snapshot, samples=view.samples, stats=view.stats.get(model, {}),
                             windows=window_names, events=mine, fleet_ratios=fleets.get((model, scopes[name]), ()) if model else (),
                             peers_had_events=len(eventful) > (name in eventful),
                             block_size=view.snapshot.block_size if view.snapshot else None,
                             ever_up=view.ever_up, last_error=view.last_error, fleet_baseline=self.fleet_baselines.get((name, model)),
                             warm_since=view.warm_since, kv=view.kv,
                             hits_reference=self._hits_reference(name, model, view, references) if model else None)
                for rule, settings in model_rules if model else target_rules:
                    key = (rule.alertname, name, model, "", ())
                    evaluated.add(key)
                    alert = self.alerts.get(key)
                    facts = base if alert is None or alert.state not in (PENDING, FIRING) else replace(  # an inactive alert's: None each
                        base, active_since=alert.active_at, anchor=alert.anchor, anchor_baseline=alert.baseline)
                    cond = rule.condition(facts, settings, rc)
                    if alert is None and cond.state == "false":
                        continue  # no alert, and none to begin: the common case at fleet size, nothing to step
                    new, transition = step(alert or Alert(rule.alertname, name, model), cond, now, settings,
                                           lambda a, c, f=facts: self._describe(a, c, f),
                                           inconclusive_bound=rule.inconclusive_bound(settings, rc))
                    self._keep(key, new, transition, transitions)
        self.hits_references = references
        self._evaluate_routing(now, evaluated, transitions)
        self.verdicts = {}
        if rc.rules[DROP_AFTER_DEPLOY].enabled:
            self._evaluate_versions(now, evaluated, transitions)
        for key in [k for k in self.alerts if k not in evaluated]:
            alert = self.alerts.pop(key)
            if alert.state == FIRING:
                gone = replace(alert, state=INACTIVE, resolved_at=now)
                transitions.append(Transition(now, gone, RESOLVED))
            elif alert.state == PENDING:
                transitions.append(Transition(now, replace(alert, state=INACTIVE), INACTIVE))
        return transitions

    # --- the fleet of each model ----------------------------------------------------------
    def _fleet_changes(self, now: float) -> list[DeployEvent]:
        """An event of every replica of a model whose replica count changed: targets that
        serve it appeared or went (configured or discovered)."""
        serving: dict[rollouts.Key, list[str]] = {}
        views = {}
        for name, track in list(self.tracks.items()):
            if track.router is not None or self._decode(track):
                continue
            views[name] = track.view
            scope = self._scope(track)
            for model in track.view.stats:
                serving.setdefault((model, scope), []).append(name)
        return self.replicas.changes(now, serving, views, self.config.rules.rules[HIT_RATE_LOW].window)

    def _hits_reference(self, name: str, model: str, view: TargetView,
                        references: dict[tuple[str, str], tuple[float, float]]) -> tuple[float, float] | None:
        """TTFT from before the lookup hits stopped, kept while they stand still (or are not known:
        a gap, a shortest window shorter than the polls): the one found first, when the last hit
        was recent and its samples not thinned yet; once it has left the history, the rules
        still know how fast a working cache was."""
        stats = view.stats.get(model, {})
        hits = next((ws.hit_increase for w, _ in sorted(self.config.global_.windows, key=lambda w: w[1])
                     if (ws := stats.get(w)) is not None and ws.hit_increase is not None), None)  # the shortest known
        if hits is not None and hits != 0:
            return None  # hits are counted: nothing to remember
        ref = self.hits_references.get((name, model)) or (None if hits is None else hits_reference(
            view.samples, model, view.snapshot.block_size if view.snapshot else None))
        if ref is not None:
            references[(name, model)] = ref
        return ref

    def _decode(self, track: Track) -> bool:
        """A P/D decode pod (exporter/parse/roles.py): the hit-rate rules and the fleet leave it out."""
        memo, name = self._decoding if self._decoding is not None else {}, track.target.name
        if name not in memo:
            memo[name] = roles.role(track.target.labels, track.view.snapshot)[0] == roles.DECODE
        return memo[name]

    # --- a router's prediction against the engines ------------------------------------------
    def _evaluate_routing(self, now: float, evaluated: set, transitions: list[Transition]) -> None:
        """Each router target's predicted ratio per model and window beside what the engine
        targets delivered (exporter/alerting/router.py); a sustained gap is its own alert."""
        settings = self.config.rules.rules.get(ROUTER_PREDICTION_GAP)
        windows = self.config.global_.windows
        routers = self.routers
        engines = [t.view.stats for name, t in list(self.tracks.items()) if name not in routers and not self._decode(t)]
        window = next((n for n, secs in windows if settings is not None and secs == settings.window), None)
        gap = routing.GapSettings(settings.drop_points, settings.min_query_tokens) if settings is not None else None
        predictions = {}
        for name, history in routers.items():
            predicted = history.predictions(now, windows)
            predictions[name] = {m: {w: (p, routing.delivered(engines, m, w)) for w, p in by_window.items()}
                                 for m, by_window in predicted.items()}
            if settings is None or not settings.enabled or window is None:
                continue
            extra = dict(self.tracks[name].target.labels) if name in self.tracks else {}
            models = set(predicted) | {k[2] for k in self.alerts if k[0] == ROUTER_PREDICTION_GAP and k[1] == name}
            for model in sorted(models):
                p = predicted.get(model, {}).get(window)
                d = routing.delivered(engines, model, window)
                cond = routing.condition(p, d, gap, window)
                key = (ROUTER_PREDICTION_GAP, name, model, "", ())
                evaluated.add(key)
                alert = self.alerts.get(key) or Alert(ROUTER_PREDICTION_GAP, name, model)
                new, transition = step(alert, cond, now, settings,
                                       lambda a, c, e=extra, n=name: self._labelled(a, c, c.cause[0], c.cause[1], e, {"target": n}),
                                       inconclusive_bound=settings.window)  # the one span it reads
                self._keep(key, new, transition, transitions)
        self.predictions = predictions

    # --- versions of a model side by side --------------------------------------------------
    def _started(self, name: str, view: TargetView) -> float | None:
        """When the replica's cache last started empty: its process start, a restart we
        saw, or our first poll of it."""
        known = [t for t in (view.snapshot.process_start_time if view.snapshot else None,
                             self.last_restart_t.get(name)) if t is not None]
        return max(known) if known else view.since

    def members(self, now: float, model: str, window: float) -> list[analysis.Member]:
        """Every replica serving `model`, with its version, its scope and its window, less the
        first `analysis.warmup` seconds after its start (a cache filling up is not a verdict)."""
        cfg = self.config.analysis
        name_of = {secs: n for n, secs in self.config.global_.windows}
        out = []
        for name, track in list(self.tracks.items()):
            view = track.view
            if model not in view.stats or self._decode(track):
                continue
            started = self._started(name, view)
            warm_from = started + cfg.warmup if started is not None else -math.inf
            cold = now < warm_from
            ws = None
            if not cold:
                if warm_from <= now - window and window in name_of:
                    ws = view.stats[model].get(name_of[window])
                else:
                    block = view.snapshot.block_size if view.snapshot else None
                    ws = stats_between(view.samples, model, max(now - window, warm_from), now, 0.0, block)
            out.append(analysis.Member(name, dict(track.target.labels).get(cfg.version_label), ws, cold, self._scope(track)))
        return out

    def analyze(self, now: float, model: str, version: str, baseline: str | None = None,
                where: dict[str, str] | None = None) -> analysis.Verdict:
        """The rollout gate's verdict (GET /api/v1/analysis): `version` of `model` against
        `baseline` (default: the other version with the most traffic) within the scope of
        the replicas that run it; `where` narrows the scopes by their labels."""
        s = self._gate_settings()
        return rollouts.gate(self.rollouts, self.members(now, model, s.window), model, version, baseline, s, where)

    def _gate_settings(self) -> rollouts.Settings:
        cfg, rc = self.config.analysis, self.config.rules
        return rollouts.Settings(window=dict(self.config.global_.windows)[cfg.window], before=rc.rules[DROP_AFTER_DEPLOY].baseline,
                                 look_back=rc.event_lookback, min_query_tokens=cfg.min_query_tokens, drop_points=cfg.drop_points,
                                 scope_labels=cfg.scope_labels)

    def _version_starts(self) -> dict[rollouts.Key, dict[str, float]]:
        """(model, scope) -> version -> when its first replica there started."""
        label = self.config.analysis.version_label
        out: dict[rollouts.Key, dict[str, float]] = {}
        for name, track in list(self.tracks.items()):
            version = dict(track.target.labels).get(label)
            started = self._started(name, track.view)
            if version is None or started is None:
                continue
            scope = self._scope(track)
            for model in track.view.stats:
                starts = out.setdefault((model, scope), {})
                starts[version] = min(starts.get(version, math.inf), started)
        return out

    def _evaluate_versions(self, now: float, evaluated: set, transitions: list[Transition]) -> None:
        """Each model's rollout in each scope (exporter/alerting/rollouts.py) judged, and its version alert stepped."""
        settings = self.config.rules.rules[DROP_AFTER_DEPLOY]
        states = {(k[2], k[4], k[3]): a.state for k, a in self.alerts.items() if k[0] == DROP_AFTER_DEPLOY and k[3]}
        self.rollouts, judged = rollouts.observe(self.rollouts, now, self._version_starts(),
                                                 lambda model, window: self.members(now, model, window), states, self._gate_settings())
        for j in judged:
            v = j.verdict
            self.verdicts[(v.model, v.scope)] = v
            key = (DROP_AFTER_DEPLOY, "", v.model, v.version, v.scope)
            evaluated.add(key)
            alert = self.alerts.get(key) or Alert(DROP_AFTER_DEPLOY, "", v.model, version=v.version, scope=v.scope)
            new, transition = step(alert, j.condition, now, settings, lambda a, c, j=j: self._describe_version(a, c, j, now),
                                   inconclusive_bound=registered(DROP_AFTER_DEPLOY).inconclusive_bound(settings, self.config.rules))
            self._keep(key, new, transition, transitions)

    def _describe_version(self, alert: Alert, cond: Condition, judged: rollouts.Judged, now: float) -> Alert:
        rc = self.config.rules
        v = judged.verdict
        new = [m for m in judged.members if m.version == v.version]
        warm = [m.stats for m in new if m.stats is not None]
        began = judged.rollout.began
        snapshots = [self.tracks[m.target].view.snapshot for m in new if m.target in self.tracks]
        found = causes.Evidence(
            now=now,
            caching_enabled=False if any(s is not None and s.prefix_caching_enabled is False for s in snapshots) else None,
            ratio=v.hit_ratio, ratio_earlier=None, baseline=v.baseline_hit_ratio,
            kv_usage_max=max((w.kv_cache_usage_max for w in warm if w.kv_cache_usage_max is not None), default=None),
            preemptions=sum(w.preemption_increase or 0.0 for w in warm),
            events=(DeployEvent(began, None, v.version, "rollout", f"{v.version} replaced {v.baseline_version}"),),
            requests=sum(w.ttft_count_increase or 0.0 for w in warm) or None,
        )
        cause, why = causes.classify(found, rc.cause_settings())
        common = None
        for m in new:
            track = self.tracks.get(m.target)
            labels = set(track.target.labels) if track is not None else set()
            common = labels if common is None else common & labels
        extra = {k: val for k, val in (common or ()) if k != self.config.analysis.version_label}
        return self._labelled(alert, cond, cause, why, extra, {"version": v.version, "baseline_version": v.baseline_version or ""})

    def _keep(self, key, new: Alert, transition: Transition | None, transitions: list[Transition]) -> None:
        if transition is not None:
            transitions.append(transition)
        if new.state == INACTIVE:
            self.alerts.pop(key, None)
        else:
            self.alerts[key] = new

    def _fleet_ratios(self, scopes: dict[str, analysis.Scope]) -> dict[rollouts.Key, list[tuple[str, float]]]:
        """(model, scope) -> [(target, judged ratio over the hit-rate rule's window)] (config
        refuses a window the rule names that global.windows do not keep)."""
        seconds = self.config.rules.rules[HIT_RATE_LOW].window
        views = {name: t.view for name, t in list(self.tracks.items()) if name in scopes and not self._decode(t)}
        return fleet_ratios(views, scopes, next((n for n, s in self.config.global_.windows if s == seconds), None))

    def _scope(self, track: Track) -> analysis.Scope:
        """What owns the target (analysis.scope_labels): its replicas are its peers and its rollouts'."""
        return rollouts.scope_of(dict(track.target.labels), self.config.analysis.scope_labels)

    def _describe(self, alert: Alert, cond: Condition, facts: Facts) -> Alert:
        """Labels and annotations from the evidence now. `step` calls this while an alert
        is pending and once as it starts firing; from then on only annotations change."""
        rc = self.config.rules
        if cond.cause is not None:
            cause, why = cond.cause
        else:
            cause, why = causes.classify(evidence(facts, rc), rc.cause_settings())
        track = self.tracks.get(alert.target)
        extra = dict(track.target.labels) if track is not None else {}
        return self._labelled(alert, cond, cause, why, extra, {"target": alert.target})

    def _labelled(self, alert: Alert, cond: Condition, cause: str, why: str, extra: dict[str, str],
                  identity: dict[str, str]) -> Alert:
        """The alert with its labels (the targets' `extra` ones, then ours and what
        `identity` names it by) and its annotations, for a target's alert and a version's."""
        rc = self.config.rules
        rule = registered(alert.alertname)  # the alert may carry a name its rule gives a cause
        name, severity = rule.delivered_as(cause, rc.rules[rule.alertname].severity)
        labels = {**extra, "alertname": name, "severity": severity, **identity,
                  "model_name": alert.model, "cause": cause}
        runbook = rc.runbook_url + "#" + runbook_anchor(name) if rc.runbook_url else ""
        description = cond.description + (f" Probable cause: {cause} ({why})." if why else "")
        annotations = {"summary": cond.summary, "description": description.strip(),
                       "runbook_url": runbook, "dashboard_url": rc.dashboard_url}
        return replace(alert, alertname=name, labels=tuple(sorted(labels.items())), annotations=tuple(sorted(annotations.items())),
                       anchor=cond.anchor if cond.anchor is not None else alert.anchor,
                       baseline=cond.baseline if cond.baseline is not None else alert.baseline)

    def active_alerts(self) -> list[Alert]:
        return sorted(self.alerts.values(), key=lambda a: a.key)

    def firing(self) -> list[Alert]:
        return [a for a in self.active_alerts() if a.state == FIRING]
