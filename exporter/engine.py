"""The monitoring core: scrapes and events in, windows, alert states and transitions out.

Live, the poller feeds it (under its lock) and an evaluation job calls `evaluate()`;
`backtest` drives the very same object from a recording on a simulated clock. No I/O,
no threads, no clock: every call gets `now`.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from . import causes
from .config import Config, Target
from .deploys import CHANGE_POINT, DeployEvent, SnapshotChangeDetector, detect_change_point
from .rules import (
    FIRING,
    INACTIVE,
    RULE_KEYS,
    RULES,
    RUNBOOK_ANCHORS,
    TARGET_DOWN,
    Alert,
    Condition,
    Facts,
    Transition,
    evidence,
    step,
)
from .vllm_metrics import Snapshot
from .window import History, WindowStats, intervals, model_keys, summarize

_FINE_SECONDS = 900.0  # windows up to 15m see every sample; older ones are thinned
_MAX_EVENTS = 10000


@dataclass
class Track:
    target: Target
    history: History
    detector: SnapshotChangeDetector
    snapshot: Snapshot | None = None
    stats: dict[str, dict[str, WindowStats]] = field(default_factory=dict)
    up: bool = False
    down_since: float | None = None
    last_t: float | None = None


class Engine:
    def __init__(self, config: Config):
        self.config = config
        self.tracks: dict[str, Track] = {}
        self.events: deque[DeployEvent] = deque(maxlen=_MAX_EVENTS)
        self.event_counts: dict[tuple[str, str], int] = {}
        self.last_deploy_t: dict[str, float] = {}  # target ('' for all) -> newest deploy-like event
        self.alerts: dict[tuple[str, str, str], Alert] = {}
        self.reconfigure(config)

    # --- configuration ---------------------------------------------------------------
    def reconfigure(self, config: Config) -> None:
        """New targets get an empty history; kept targets keep theirs if the windows did."""
        same_windows = config.global_.windows == self.config.global_.windows
        old = self.tracks
        self.config = config
        self.tracks = {}
        for t in config.targets:
            if t.name in old and same_windows:
                self.tracks[t.name] = replace(old[t.name], target=t)
            else:
                self.tracks[t.name] = Track(t, History(config.longest_window + config.global_.poll_interval, _FINE_SECONDS),
                                            SnapshotChangeDetector(t.name))
        self.alerts = {k: a for k, a in self.alerts.items() if a.target in self.tracks}

    # --- input -------------------------------------------------------------------------
    def ingest(self, target: str, now: float, snapshot: Snapshot) -> list[DeployEvent]:
        """A successful scrape. Returns the events it revealed (restart, config change,
        suspected change point)."""
        track = self.tracks[target]
        if track.history.append(now, snapshot) is None:
            return []
        track.snapshot, track.up, track.down_since, track.last_t = snapshot, True, None, now
        found = track.detector.observe(now, snapshot)
        for ev in found:
            self.add_event(ev)
        track.stats = self._summarize(track, now)
        point = self._change_point(track, now)
        if point is not None:
            self.add_event(point)
            found.append(point)
        return found

    def ingest_failure(self, target: str, now: float) -> None:
        track = self.tracks[target]
        if track.up or track.down_since is None:
            track.down_since = now
        track.up = False
        track.stats = self._summarize(track, now)

    def add_event(self, event: DeployEvent) -> None:
        self.events.append(event)
        key = (event.target or "", event.source)
        self.event_counts[key] = self.event_counts.get(key, 0) + 1
        if not event.is_restart:
            target = event.target or ""
            self.last_deploy_t[target] = max(self.last_deploy_t.get(target, event.t), event.t)

    def _summarize(self, track: Track, now: float):
        g = self.config.global_
        block_size = track.snapshot.block_size if track.snapshot else None
        return summarize(track.history.samples(), now, g.windows, g.min_query_tokens, block_size)

    def _change_point(self, track: Track, now: float) -> DeployEvent | None:
        rc = self.config.rules
        if not rc.change_point_enabled:
            return None
        cp = rc.change_point
        span = cp.recent + cp.reference + 2 * self.config.global_.poll_interval
        for e in self.events:
            if not e.applies_to(track.target.name):
                continue
            if (e.is_restart and now - e.t <= rc.cold_start_grace) or now - e.t <= span:
                return None  # a cold start, or already explained by an event
        samples = [s for s in track.history.samples() if s.t >= now - span]
        for model in sorted({k[0] for s in samples for k in s.layout.keys}):
            began = detect_change_point(intervals(samples, model_keys(samples, model)), now, cp)
            if began is not None:
                return DeployEvent(began, track.target.name, f"suspected@{int(began)}", CHANGE_POINT,
                                   f"hit ratio of {model} fell sharply with no deploy event")
        return None

    # --- output ------------------------------------------------------------------------
    def target_events(self, target: str, now: float) -> tuple[DeployEvent, ...]:
        horizon = max(self.config.rules.event_lookback, self.config.rules.cold_start_grace)
        return tuple(sorted((e for e in self.events if e.applies_to(target) and 0 <= now - e.t <= horizon), key=lambda e: e.t))

    def last_deploy(self) -> dict[str, float]:
        """target ('' for all) -> time of the newest deploy-like event (not restarts)."""
        return dict(self.last_deploy_t)

    def _forget_old_events(self, now: float) -> None:
        # events arrive close to time order; one older than every rule looks back is dead
        horizon = max(self.config.rules.event_lookback, self.config.rules.cold_start_grace) + 60.0
        while self.events and now - self.events[0].t > horizon:
            self.events.popleft()

    def evaluate(self, now: float) -> list[Transition]:
        rc = self.config.rules
        transitions: list[Transition] = []
        window_names = {secs: name for name, secs in self.config.global_.windows}
        self._forget_old_events(now)
        by_model = self._fleet_ratios()
        events_of = {name: self.target_events(name, now) for name in self.tracks}
        for name, track in self.tracks.items():
            samples = track.history.samples()
            for model in sorted(track.stats) or [""]:
                peers = [(other, r) for other, r in by_model.get(model, ()) if other != name]
                facts = Facts(now=now, target=name, model=model, up=track.up, down_since=track.down_since,
                              snapshot=track.snapshot, samples=samples, stats=track.stats.get(model, {}),
                              windows=window_names, events=events_of[name], peer_ratios=tuple(r for _, r in peers),
                              peers_had_events=any(events_of[other] for other, _ in peers),
                              block_size=track.snapshot.block_size if track.snapshot else None)
                for alertname, settings in rc.rules.items():
                    if not settings.enabled or (alertname != TARGET_DOWN and model == ""):
                        continue
                    cond = RULES[alertname](facts, settings, rc)
                    key = (alertname, name, model)
                    alert = self.alerts.get(key) or Alert(alertname, name, model)
                    new, transition = step(alert, cond, now, settings, lambda a, c: self._describe(a, c, facts))
                    if new.state == INACTIVE and transition is None:
                        self.alerts.pop(key, None)
                    else:
                        self.alerts[key] = new
                    if transition is not None:
                        transitions.append(transition)
                        if new.state == INACTIVE:
                            self.alerts.pop(key, None)
        return transitions

    def _fleet_ratios(self) -> dict[str, list[tuple[str, float]]]:
        """model -> [(target, hit ratio over the hit-rate rule's window)]."""
        seconds = self.config.rules.rules[RULE_KEYS["hit_rate_low"]].window
        name = next((n for n, s in self.config.global_.windows if s == seconds), None)
        out: dict[str, list[tuple[str, float]]] = {}
        for target, track in self.tracks.items():
            for model, windows in track.stats.items():
                ws = windows.get(name) if name else None
                if ws is not None and ws.hit_ratio is not None:
                    out.setdefault(model, []).append((target, ws.hit_ratio))
        return out

    def _describe(self, alert: Alert, cond: Condition, facts: Facts) -> Alert:
        rc = self.config.rules
        settings = rc.rules[alert.alertname]
        if cond.cause is not None:
            cause, why = cond.cause
        else:
            cause, why = causes.classify(evidence(facts, rc), rc.cause_settings())
        severity = causes.severity_for(cause, settings.severity)
        labels = dict(alert.labels) if alert.labels else {
            "alertname": alert.alertname, "severity": severity, "target": alert.target,
            "model_name": alert.model, "cause": cause, **dict(self.tracks[alert.target].target.labels)}
        runbook = rc.runbook_url + "#" + RUNBOOK_ANCHORS[alert.alertname] if rc.runbook_url else ""
        description = cond.description + (f" Probable cause: {cause} ({why})." if why else "")
        annotations = {"summary": cond.summary, "description": description.strip(),
                       "runbook_url": runbook, "dashboard_url": rc.dashboard_url}
        return replace(alert, labels=tuple(sorted(labels.items())), annotations=tuple(sorted(annotations.items())))

    def active_alerts(self) -> list[Alert]:
        return sorted(self.alerts.values(), key=lambda a: a.key)

    def firing(self) -> list[Alert]:
        return [a for a in self.active_alerts() if a.state == FIRING]
