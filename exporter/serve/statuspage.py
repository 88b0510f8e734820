"""The status page at `/`: what an on-call reads at a glance, with no other tool.

Per target and model: up or down with the last error, the hit ratio of each window,
TTFT p50/p99, query tokens per second, KV-cache usage, the active alerts with their
cause, the last deploys, and the last hour's hit ratio drawn as inline SVG with the
deploys marked on it; the versions of a model side by side with the gate's verdict.

Plain HTML and inline SVG: no script, no external asset (it works air-gapped and through
a port-forward), readable on a phone. Every value a target or a user sent (names, labels,
versions, descriptions, errors) goes through `_e`. `render` is pure: the published state
and `now` in, bytes out; `StatusPage` renders it once per state change, like /metrics.
"""
from __future__ import annotations

import html
import math
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Sequence

from ..alerting import analysis
from ..alerting.rollouts import scope_text
from ..alerting.rules_state import FIRING, PENDING, Alert
from ..monitor.targetview import TargetView
from ..series.samples import Samples
from ..series.hitratio import shown_ratio, tier_shares, tiers_in_use, token_rates
from ..series.window import WindowStats
from .state import State

DETAIL_LIMIT = 50  # up to this many targets, every one is shown in full
WORST = 50  # beyond it: the worst targets by hit ratio, and every one with a firing alert
MAX_FIRING_CARDS = 50  # targets with a firing alert shown in full beyond the worst; the alert list names them all
MAX_DOWN_LISTED = 50
MAX_MODELS = 8  # models shown per target, worst first
MAX_PENDING = 50
MAX_DEPLOYS = 10
MAX_TEXT = 300  # characters of one description or error shown
TREND_SECONDS, TREND_STEP = 3600.0, 60.0
# Should escaping ever miss a value, the browser still runs no script, loads nothing and
# submits nowhere: the page needs only its inline style.
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
_SEVERITIES = ("critical", "warning", "info")  # CSS classes come from this list, never from a label's text


@dataclass(frozen=True)
class PageInput:
    """What the page is rendered from: the same published state as /metrics."""

    targets: tuple[TargetView, ...]
    alerts: tuple[Alert, ...] = ()
    deploys: tuple[dict, ...] = ()  # recent events, oldest first, as DeployEvent.to_json()
    verdicts: dict[tuple, analysis.Verdict] = field(default_factory=dict)  # (model, scope) -> the gate's verdict
    links: tuple[str, ...] = ()
    version: str = ""
    warning: str = ""
    source: str = ""  # where the samples come from when not from scraping the targets (the Prometheus source)


def gather(state: State, links: Sequence[str] = (), version: str = "", warning: str = "") -> PageInput:
    reading = state.read()  # once: the targets, alerts, deploys and verdicts of one moment
    p = reading.published
    return PageInput(reading.targets, p.alerts or (), p.deploys.recent if p.deploys is not None else (),
                     dict(p.verdicts), tuple(links), version, warning, p.samples_source)


class StatusPage:
    """The rendered page, shared by every reader and rendered again only once the state
    changed and `min_interval` has passed (a busy fleet changes it at every poll)."""

    def __init__(self, state: State, min_interval: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.state = state
        self.min_interval = min_interval
        self.clock = clock  # paces renders
        self.wall = wall  # the `now` the page is rendered at: the poller's clock
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._rendered_at = -math.inf
        self._body = b""

    def get(self, links: Sequence[str], version: str, warning: str = "") -> bytes:
        with self._lock:  # concurrent readers wait for one render
            key = (self.state.generation, tuple(links), version, warning)
            now = self.clock()
            if key != self._key and (self._key is None or key[1:] != self._key[1:] or now - self._rendered_at >= self.min_interval):
                self._body = render(gather(self.state, links, version, warning), self.wall())
                self._key, self._rendered_at = key, now
            return self._body


# --- formatting ------------------------------------------------------------------------
def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _pct(r: float | None) -> str:
    return "–" if r is None or not math.isfinite(r) else f"{r:.0%}" if r >= 0.1 or r == 0 else f"{r:.1%}"


def _secs(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "–"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def _num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x / 1000:.1f}k" if abs(x) >= 10000 else f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"


def _when(t: float | None, now: float) -> str:
    if t is None or not math.isfinite(t):
        return "–"
    stamp = datetime.fromtimestamp(t, timezone.utc)
    age = now - t
    ago = ("in the future" if age < -1 else f"{age:.0f} s ago" if age < 120 else f"{age / 60:.0f} min ago" if age < 7200
           else f"{age / 3600:.0f} h ago" if age < 172800 else f"{age / 86400:.0f} d ago")
    return f'<time datetime="{stamp.isoformat(timespec="seconds")}">{stamp:%H:%M:%S} UTC</time> <span class="dim">({ago})</span>'


def _severity(alert: Alert) -> str:
    s = dict(alert.labels).get("severity", "")
    return s if s in _SEVERITIES else "warning"


def ratio_of(ws: WindowStats | None) -> float | None:
    """The ratio the rules judge: the admitted-prefill one where the engine has it."""
    return shown_ratio(ws)


def rank_window(targets: Sequence[TargetView]) -> str | None:
    """The window targets are ranked by: the one nearest 5 minutes (every target has the
    same windows, so the first with stats tells)."""
    for view in targets:
        for windows in view.stats.values():
            names = {ws.window: ws.seconds for ws in windows.values()}
            if names:
                return min(names, key=lambda n: (abs(names[n] - 300.0), names[n]))
    return None


def worst_ratio(view: TargetView, window: str | None) -> float | None:
    """The lowest hit ratio among the target's models over `window`."""
    ratios = [r for windows in view.stats.values() if (r := ratio_of(windows.get(window))) is not None]
    return min(ratios) if ratios else None


# --- the last hour as a line -------------------------------------------------------------
def trend(samples: Samples | None, model: str, now: float, seconds: float = TREND_SECONDS,
          step: float = TREND_STEP) -> list[float | None]:
    """The model's hit ratio per `step` over the last `seconds` (oldest first: the lookup counters and a connector's), from
    the per-poll log the windows keep; None where a step saw no query."""
    if samples is None or model not in samples.logs:
        return []
    t, _, q, h, _, _, _, start, end = samples.logs[model]
    n = max(1, int(seconds // step))
    since = now - seconds
    # an interval counts in the step it ended in; slices summed in C, not entry by entry
    cuts = [bisect_right(t, since + step * k, start, end) for k in range(n)] + [bisect_right(t, now, start, end)]
    out: list[float | None] = []
    for lo, hi in zip(cuts, cuts[1:]):
        queries = sum(q[lo:hi])
        out.append(min(1.0, max(0.0, sum(h[lo:hi]) / queries)) if queries > 0 else None)
    return out


def sparkline(points: list[float | None], marks: Sequence[tuple[float, str]], width: int = 280, height: int = 64) -> str:
    """An inline SVG of ratios in [0, 1]; `marks` are (fraction of the span, label) drawn
    as vertical lines with the label as their tooltip."""
    top, bottom = 4, height - 4
    span = bottom - top
    n = len(points)
    x_of = (lambda i: width * i / (n - 1)) if n > 1 else (lambda i: width / 2)
    lines, run = [], []
    for i, r in enumerate(points + [None]):
        if r is None:
            if len(run) == 1:
                run.append((run[0][0] + 1.5, run[0][1]))
            if run:
                lines.append(" ".join(f"{x:.1f},{y:.1f}" for x, y in run))
            run = []
        else:
            run.append((x_of(i), bottom - r * span))
    parts = [f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'preserveAspectRatio="none" aria-label="hit ratio over the last hour">',
             f'<rect x="0" y="{top}" width="{width}" height="{span}" class="bg"/>',
             f'<line x1="0" x2="{width}" y1="{top + span / 2}" y2="{top + span / 2}" class="grid"/>']
    for frac, label in marks:
        x = min(width - 1.0, max(1.0, frac * width))
        parts.append(f'<g class="deploy"><title>{_e(label)}</title><line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height}"/>'
                     f'<polygon points="{x - 4:.1f},0 {x + 4:.1f},0 {x:.1f},6"/></g>')
    parts.extend(f'<polyline class="ratio" points="{p}"/>' for p in lines)
    parts.append("</svg>")
    return "".join(parts)


def _trend_caption(points: list[float | None]) -> str:
    known = [r for r in points if r is not None]
    if not known:
        return "no queries in the last hour"
    first, last = known[0], known[-1]
    arrow = "fell" if first - last >= 0.05 else "rose" if last - first >= 0.05 else "steady"
    return f"hit ratio per minute (every tier the lookups count), last hour: {_pct(first)} → {_pct(last)} ({arrow}), lowest {_pct(min(known))}"


# --- sections ------------------------------------------------------------------------------
def _deploys_of(deploys: Sequence[dict], target: str) -> list[dict]:
    return [d for d in deploys if d.get("target") in (None, target)]


def _alerts_section(alerts: Sequence[Alert], now: float) -> str:
    firing = [a for a in alerts if a.state == FIRING]
    pending = [a for a in alerts if a.state == PENDING]
    order = lambda a: (_SEVERITIES.index(_severity(a)), a.active_at or 0.0, a.key)  # noqa: E731
    shown = sorted(firing, key=order) + sorted(pending, key=order)[:MAX_PENDING]
    if not shown:
        return '<section><h2>Alerts</h2><p class="ok">No alert is firing or pending.</p></section>'
    rows = []
    for a in shown:
        labels, notes = dict(a.labels), dict(a.annotations)
        where = " · ".join(_e(x) for x in (a.target or "fleet", a.model, a.version) if x)
        desc = _clip(notes.get("description", ""))
        rows.append(
            f'<li class="alert {_e(a.state)} {_severity(a)}"><div><span class="badge {_e(a.state)}">{_e(a.state)}</span> '
            f'<span class="badge {_severity(a)}">{_severity(a)}</span> <strong>{_e(a.alertname)}</strong> '
            f'<span class="where">{where}</span></div>'
            f'<div>cause: <strong class="cause">{_e(labels.get("cause", "unknown"))}</strong> · since {_when(a.active_at, now)}</div>'
            f'<div class="summary">{_e(notes.get("summary", ""))}</div>'
            + (f'<details><summary>details</summary><p>{_e(desc)}</p>{_runbook(notes)}</details>' if desc else "")
            + "</li>")
    more = len(pending) - min(len(pending), MAX_PENDING)
    tail = f'<p class="dim">and {more} more pending</p>' if more > 0 else ""
    return (f'<section><h2>Alerts <span class="dim">({len(firing)} firing, {len(pending)} pending)</span></h2>'
            f'<ul class="alerts">{"".join(rows)}</ul>{tail}</section>')


def _runbook(notes: dict) -> str:
    links = []
    for key, name in (("runbook_url", "runbook"), ("dashboard_url", "dashboard")):
        url = notes.get(key, "")
        if url.startswith(("https://", "http://")):  # never a javascript: or data: link
            links.append(f'<a href="{_e(url)}" rel="noreferrer">{name}</a>')
    return f'<p>{" · ".join(links)}</p>' if links else ""


def _deploys_section(deploys: Sequence[dict], now: float) -> str:
    recent = list(reversed(deploys[-MAX_DEPLOYS:]))
    if not recent:
        return '<section><h2>Deploy events</h2><p class="dim">None announced or detected yet.</p></section>'
    rows = "".join(
        f'<tr><td>{_when(d.get("t"), now)}</td><td>{_e(d.get("target") or "all")}</td><td>{_e(d.get("source", ""))}</td>'
        f'<td>{_e(d.get("version", ""))}</td><td>{_e(_clip(d.get("description") or ""))}</td></tr>' for d in recent)
    return (f'<section><h2>Deploy events <span class="dim">(last {len(recent)})</span></h2><div class="scroll"><table>'
            f'<tr><th>when</th><th>target</th><th>source</th><th>version</th><th>description</th></tr>{rows}</table></div></section>')


def _fleet_section(verdicts: dict[tuple, analysis.Verdict]) -> str:
    if not verdicts:
        return ""
    blocks = []
    for v in sorted(verdicts.values(), key=lambda v: (v.model, v.scope)):
        kind = v.verdict if v.verdict in (analysis.PASS, analysis.FAIL, analysis.INCONCLUSIVE) else analysis.INCONCLUSIVE
        scope = f' <span class="dim">{_e(scope_text(v.scope))}</span>' if v.scope else ""
        blocks.append(
            f'<div class="card"><h3>{_e(v.model)}{scope} <span class="badge v-{kind}">gate: {kind}</span></h3>'
            f'<div class="scroll"><table><tr><th>version</th><th>replicas</th><th>hit ratio</th><th>query tokens</th></tr>'
            f'<tr><td>{_e(v.version)} <span class="dim">(new)</span></td><td>{v.replicas}</td><td>{_pct(v.hit_ratio)}</td><td>{_num(v.query_tokens)}</td></tr>'
            f'<tr><td>{_e(v.baseline_version or "–")} <span class="dim">(baseline)</span></td><td>{v.baseline_replicas}</td>'
            f'<td>{_pct(v.baseline_hit_ratio)}</td><td>{_num(v.baseline_query_tokens)}</td></tr></table></div>'
            f'<p class="summary">{_e(_clip(v.reason))}</p></div>')
    return f'<section><h2>Rollouts: versions side by side</h2><div class="grid">{"".join(blocks)}</div></section>'


def _model_block(view: TargetView, model: str, windows: dict[str, WindowStats], alerts: Sequence[Alert],
                 deploys: Sequence[dict], now: float) -> str:
    ordered = sorted(windows.values(), key=lambda ws: ws.seconds)
    head = "".join(f"<th>{_e(ws.window)}</th>" for ws in ordered)

    def row(name: str, cell) -> str:
        return f'<tr><th scope="row">{name}</th>{"".join(f"<td>{cell(ws)}</td>" for ws in ordered)}</tr>'

    rows = [row("hit ratio", lambda ws: _pct(ratio_of(ws)))]
    served = sorted(tiers_in_use(ordered))
    if len(served) > 1:  # every tier is what the rules judge; each tier's share beside it
        rows[0] = row("hit ratio (all tiers)", lambda ws: _pct(ratio_of(ws)))
        rows += [row(f"· {_e(tier)} tier", lambda ws, tier=tier: _pct(tier_shares(ws).get(tier, 0.0) if ratio_of(ws) is not None else None))
                 for tier in served]
    elif any(ws.admitted_hit_ratio is not None and ws.hit_ratio is not None and abs(ws.admitted_hit_ratio - ws.hit_ratio) >= 0.005
             for ws in ordered):
        rows[0] = row("hit ratio (admitted)", lambda ws: _pct(ws.admitted_hit_ratio))
        rows.append(row("hit ratio (lookup)", lambda ws: _pct(ws.hit_ratio)))
    rows.append(row("TTFT p50", lambda ws: _secs(ws.ttft_quantiles.get(0.5))))
    rows.append(row("TTFT p99", lambda ws: _secs(ws.ttft_quantiles.get(0.99))))
    rows.append(row("query tokens/s", lambda ws: _num(token_rates(ws)[0])))
    rows.append(row("KV-cache usage (max)", lambda ws: _pct(ws.kv_cache_usage_max)))
    mine = [a for a in alerts if a.target == view.target.name and a.model == model]
    badges = "".join(f'<li><span class="badge {_e(a.state)}">{_e(a.state)}</span> {_e(a.alertname)} · cause '
                     f'<strong>{_e(dict(a.labels).get("cause", "unknown"))}</strong></li>' for a in mine)
    labels = dict(view.target.labels)
    fleet = [d for d in deploys if d.get("source") == "replicas" and d.get("model") == model  # of its scope's replicas
             and all(labels.get(k) == v for k, v in (d.get("scope") or {}).items())
             and isinstance(d.get("t"), (int, float)) and 0 <= now - d["t"] <= TREND_SECONDS]
    note = (f'<p class="fleet">fleet: {_e(_clip(fleet[-1].get("description") or ""))} '
            f'<span class="dim">({_when(fleet[-1]["t"], now)})</span></p>') if fleet else ""
    points = trend(view.samples, model, now)
    since = now - TREND_SECONDS
    marks = [((d["t"] - since) / TREND_SECONDS, f"deploy {d.get('version', '')} ({d.get('source', '')}) at "
              f"{datetime.fromtimestamp(d['t'], timezone.utc):%H:%M:%S} UTC")
             for d in deploys if isinstance(d.get("t"), (int, float)) and since < d["t"] <= now]
    figure = ""
    if points:
        figure = (f'<figure>{sparkline(points, marks)}<div class="axis"><span>60 min ago</span><span>100% at the top, 0 at the bottom</span>'
                  f'<span>now</span></div><figcaption>{_trend_caption(points)}'
                  + (f' · {len(marks)} deploy(s) marked' if marks else "") + "</figcaption></figure>")
    return (f'<div class="model"><h4>{_e(model)}</h4>' + (f'<ul class="badges">{badges}</ul>' if badges else "") + note
            + f'<div class="scroll"><table class="windows"><tr><th></th>{head}</tr>{"".join(rows)}</table></div>{figure}</div>')


def _target_card(view: TargetView, alerts: Sequence[Alert], deploys: Sequence[dict], now: float, window: str | None) -> str:
    name = view.target.name
    sleep = asleep(view)
    state = "asleep" if sleep else "up" if view.up else "down" if view.polled else "pending"
    shown = f"asleep (sleep level {sleep})" if sleep else "up" if view.up else "down" if view.polled else "not polled yet"
    labels = " ".join(f'<span class="label">{_e(_clip(k, 60))}={_e(_clip(v, 120))}</span>' for k, v in view.target.labels)
    parts = [f'<article class="card {state}"><h3>{_e(name)} <span class="badge {state}">{shown}</span></h3>']
    if sleep:
        parts.append('<p class="dim">vLLM sleep mode: the engine serves nothing and its KV cache was discarded; it is '
                     'not down. Its wake is a cold start: no alert pages while its cache refills.</p>')
    if labels:
        parts.append(f'<p class="labels">{labels}</p>')
    if view.last_error:
        parts.append(f'<p class="error">last error ({_e(view.last_result or "")}): {_e(_clip(view.last_error))}</p>')
    parts.append(f'<p class="dim">last scrape {_when(view.last_scrape_time, now)}</p>')
    mine = _deploys_of(deploys, name)
    if mine:
        d = mine[-1]
        parts.append(f'<p>last event: <strong>{_e(d.get("version", ""))}</strong> ({_e(d.get("source", ""))}) '
                     f'{_when(d.get("t"), now)}</p>')
    down_alerts = [a for a in alerts if a.target == name and not a.model]
    if down_alerts:
        parts.append('<ul class="badges">' + "".join(
            f'<li><span class="badge {_e(a.state)}">{_e(a.state)}</span> {_e(a.alertname)}</li>' for a in down_alerts) + "</ul>")
    snap = view.snapshot
    if snap is not None and snap.prefix_caching_enabled is False:
        parts.append('<p class="error">prefix caching is disabled on this server</p>')
    if view.kv is not None:
        parts.append(_kv_block(view.kv, now))
    models = sorted(view.stats.items(), key=lambda kv: (_sort_ratio(ratio_of(kv[1].get(window or ""))), kv[0]))
    for model, windows in models[:MAX_MODELS]:
        parts.append(_model_block(view, model, windows, alerts, mine, now))
    if len(models) > MAX_MODELS:
        parts.append(f'<p class="dim">and {len(models) - MAX_MODELS} more models (see /api/v1/status)</p>')
    parts.append("</article>")
    return "".join(parts)


KV_ROWS = 5  # prompt groups, tenants and adapters shown on a card each; /metrics and /api/v1/status have more


def _kv_block(kv, now: float) -> str:
    """What vLLM's KV events say: the stream's health, where the prompt changes, and the
    tokens computed again by prompt group, cache_salt and LoRA over the short window."""
    state = "connected" if kv.connected else "not connected"
    parts = [f'<p>KV events: <strong>{state}</strong>, last batch {_when(kv.last_message, now)}; '
             f'{kv.received} received, {kv.dropped} lost, {kv.errors} refused, {kv.shed} shed</p>']
    if kv.last_error:
        parts.append(f'<p class="error">KV events: {_e(_clip(kv.last_error))}</p>')
    w = kv.recent
    if w is None:
        return "".join(parts)
    if kv.divergence_text:
        parts.append(f'<p class="error">{_e(_clip(kv.divergence_text))}</p>')
    span, labels = max(1.0, w.seconds), dict(kv.group_labels)
    rows = []
    for title, table, name in (("prompt group", w.counts.by_group, lambda k: labels.get(k, k)),
                               ("cache_salt", w.counts.by_salt, str), ("LoRA", w.counts.by_lora, str)):
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:KV_ROWS]
        rows += [f"<tr><td>{title}</td><td>{_e(_clip(name(k), 80))}</td><td>{n / span:.0f}</td></tr>" for k, n in ranked]
    if rows:
        parts.append(f'<div class="scroll"><table><tr><th>by</th><th></th><th>tokens computed/s ({span:.0f}s)</th></tr>'
                     + "".join(rows) + "</table></div>")
    return "".join(parts)


def asleep(view: TargetView) -> int:
    """The deepest sleep level of the target's engines (vLLM's sleep mode), 0 awake or not said."""
    snap = view.snapshot
    if snap is None or not view.up:
        return 0
    return max((s.sleep_level or 0 for s in snap.series), default=0)


def _sort_ratio(r: float | None) -> float:
    return 2.0 if r is None else r


def _targets_section(targets: Sequence[TargetView], alerts: Sequence[Alert], deploys: Sequence[dict], now: float) -> str:
    window = rank_window(targets)
    if len(targets) <= DETAIL_LIMIT:
        cards = "".join(_target_card(v, alerts, deploys, now, window) for v in sorted(targets, key=lambda v: v.target.name))
        return f'<section><h2>Targets</h2><div class="grid">{cards}</div></section>' if targets else ""
    firing_targets = {a.target for a in alerts if a.state == FIRING and a.target}
    ratios = {v.target.name: worst_ratio(v, window) for v in targets if v.up}
    ranked = sorted((r, name) for name, r in ratios.items() if r is not None)[:WORST]
    by_name = {v.target.name: v for v in targets}
    worst = [by_name[name] for _, name in ranked]
    shown = {v.target.name for v in worst}
    extra = [v for v in sorted(targets, key=lambda v: v.target.name) if v.target.name in firing_targets and v.target.name not in shown]
    down = sorted((v for v in targets if v.polled and not v.up), key=lambda v: v.target.name)
    parts = [f'<section><h2>Worst {len(worst)} targets by hit ratio</h2><p class="dim">{len(targets)} targets: '
             f'the page shows the worst by hit ratio and every target with a firing alert; /api/v1/status has them all.</p>'
             f'<div class="grid">{"".join(_target_card(v, alerts, deploys, now, window) for v in worst)}</div></section>']
    if extra:
        cards = "".join(_target_card(v, alerts, deploys, now, window) for v in extra[:MAX_FIRING_CARDS])
        more = len(extra) - min(len(extra), MAX_FIRING_CARDS)
        parts.append(f'<section><h2>Other targets with a firing alert ({len(extra)})</h2><div class="grid">{cards}</div>'
                     + (f'<p class="dim">and {more} more, each named in the alert list</p>' if more > 0 else "") + "</section>")
    if down:
        rows = "".join(f'<tr><td>{_e(v.target.name)}</td><td>{_e(v.last_result or "")}</td><td>{_e(_clip(v.last_error or "", 120))}</td></tr>'
                       for v in down[:MAX_DOWN_LISTED])
        more = len(down) - min(len(down), MAX_DOWN_LISTED)
        parts.append(f'<section><h2>Down targets ({len(down)})</h2><div class="scroll"><table><tr><th>target</th><th>result</th>'
                     f'<th>last error</th></tr>{rows}</table></div>' + (f'<p class="dim">and {more} more</p>' if more > 0 else "") + "</section>")
    return "".join(parts)


def _counts(targets: Sequence[TargetView], alerts: Sequence[Alert]) -> str:
    up = sum(1 for v in targets if v.up)
    down = sum(1 for v in targets if v.polled and not v.up)
    sleeping = sum(1 for v in targets if asleep(v))
    waiting = len(targets) - up - down
    firing = sum(1 for a in alerts if a.state == FIRING)
    pending = sum(1 for a in alerts if a.state == PENDING)
    firing_targets = len({a.target for a in alerts if a.state == FIRING and a.target})
    cells = [("target" if len(targets) == 1 else "targets", len(targets), ""), ("up", up, "up" if up else ""), ("down", down, "down" if down else ""),
             ("not polled yet", waiting, "")] + ([("of them asleep", sleeping, "")] if sleeping else []) + [
             ("alerts firing", firing, "firing" if firing else ""),
             ("pending", pending, "pending" if pending else ""),
             ("target with a firing alert" if firing_targets == 1 else "targets with a firing alert", firing_targets, "")]
    return '<ul class="counts">' + "".join(f'<li class="{cls}"><b>{n}</b> {label}</li>' for label, n, cls in cells) + "</ul>"


_CSS = """
:root{color-scheme:light dark;--fg:#1b1f24;--bg:#f6f7f9;--card:#fff;--dim:#5d6670;--line:#d9dde2;--up:#1a7f37;--down:#c62828;
--pending:#b26a00;--ratio:#1f6feb;--deploy:#d97706}
@media (prefers-color-scheme:dark){:root{--fg:#e6e8eb;--bg:#0f1216;--card:#181c21;--dim:#9aa4ae;--line:#2d333b;--ratio:#58a6ff}}
*{box-sizing:border-box}body{margin:0;padding:12px;font:15px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:var(--bg);overflow-wrap:anywhere}
header h1{font-size:1.25rem;margin:0 0 6px}h2{font-size:1.1rem;margin:18px 0 8px}h3{font-size:1rem;margin:0 0 6px}
h4{font-size:.95rem;margin:10px 0 4px}.dim{color:var(--dim);font-size:.9em}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,380px),1fr));gap:10px}
.card{background:var(--card);border:1px solid var(--line);border-left:4px solid var(--line);border-radius:6px;padding:10px}
.card.up{border-left-color:var(--up)}.card.down{border-left-color:var(--down)}.card.asleep{border-left-color:var(--dim)}
.fleet{font-size:.88rem;margin:4px 0}
.badge{display:inline-block;font-size:.75rem;font-weight:600;padding:1px 6px;border-radius:9px;color:#fff;background:var(--dim)}
.badge.up,.badge.v-pass{background:var(--up)}.badge.down,.badge.firing,.badge.critical,.badge.v-fail{background:var(--down)}
.badge.pending,.badge.warning,.badge.v-inconclusive{background:var(--pending)}
.counts{display:flex;flex-wrap:wrap;gap:6px;list-style:none;padding:0;margin:8px 0}
.counts li{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:4px 8px}
.counts li.down b,.counts li.firing b{color:var(--down)}.counts li.pending b{color:var(--pending)}.counts li.up b{color:var(--up)}
.alerts{list-style:none;padding:0;margin:0}.alert{background:var(--card);border:1px solid var(--line);border-left:4px solid var(--pending);
border-radius:6px;padding:8px;margin-bottom:6px}.alert.firing{border-left-color:var(--down)}.summary{margin:4px 0}
.badges{list-style:none;padding:0;margin:4px 0}.error{color:var(--down)}.ok{color:var(--up)}
.label{display:inline-block;font-size:.8rem;background:var(--bg);border:1px solid var(--line);border-radius:4px;padding:0 4px;margin:1px}
.scroll{overflow-x:auto}table{border-collapse:collapse;font-size:.88rem;width:100%}th,td{padding:3px 6px;border-bottom:1px solid var(--line);text-align:left}
table.windows td{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}figure{margin:6px 0 0}figcaption{font-size:.85rem;color:var(--dim)}
.spark{width:100%;height:64px;display:block}.axis{display:flex;justify-content:space-between;font-size:.75rem;color:var(--dim)}.spark .bg{fill:var(--bg)}.spark .grid{stroke:var(--line);stroke-dasharray:2 3}
.spark .ratio{fill:none;stroke:var(--ratio);stroke-width:2;vector-effect:non-scaling-stroke}
.spark .deploy line{stroke:var(--deploy);stroke-width:1.5;stroke-dasharray:3 2;vector-effect:non-scaling-stroke}.spark .deploy polygon{fill:var(--deploy)}
footer{margin-top:24px;font-size:.85rem;color:var(--dim)}footer ul{display:flex;flex-wrap:wrap;gap:4px 12px;list-style:none;padding:0}
a{color:var(--ratio)}.warn{background:#fff4e5;color:#5c3b00;border:1px solid var(--pending);border-radius:6px;padding:8px}
"""


def render(page: PageInput, now: float) -> bytes:
    """The whole page. Sizes are bounded: past DETAIL_LIMIT targets it summarises."""
    links = "".join(f'<li><a href="{_e(p)}">{_e(p)}</a></li>' for p in page.links)
    warning = f'<p class="warn"><strong>Warning:</strong> {_e(page.warning)}</p>' if page.warning else ""
    if page.source:
        warning += f'<p class="dim">{_e(page.source)}</p>'
    stamp = datetime.fromtimestamp(now, timezone.utc)
    body = (
        f'<header><h1>vLLM prefix cache: status</h1><p class="dim">exporter {_e(page.version)} · rendered '
        f'{stamp:%Y-%m-%d %H:%M:%S} UTC</p>{warning}{_counts(page.targets, page.alerts)}</header>'
        f"<main>{_alerts_section(page.alerts, now)}{_fleet_section(page.verdicts)}"
        f"{_targets_section(page.targets, page.alerts, page.deploys, now)}{_deploys_section(page.deploys, now)}</main>"
        f'<footer><p>Endpoints</p><ul>{links}</ul></footer>')
    doc = ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
           '<meta name="viewport" content="width=device-width,initial-scale=1">'
           f'<title>vLLM prefix-cache exporter</title><style>{_CSS}</style></head><body>{body}</body></html>')
    return doc.encode("utf-8", "replace")  # a lone surrogate in a label becomes "?", never a 500
