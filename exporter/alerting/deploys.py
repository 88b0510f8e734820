"""Deploy events and their detection: one stream of (time, target or all, version, source).

Sources: the HTTP API, restarts and configuration changes seen in the scraped text, the
Kubernetes downward-API annotations file, and a change-point detector on the hit ratio
for deploys nobody announced. Pure: the annotations file is read by exporter/discovery/annotations.py.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from ..parse.snapshot import Snapshot, key_order
from ..series.history import is_reset
from ..series.hitratio import ratio, tokens
from ..series.window import Interval

API = "api"
RESTART = "restart"
CONFIG_CHANGE = "config_change"
ANNOTATIONS = "annotations_file"
CHANGE_POINT = "change_point"
RECORDING = "recording"
# events that are no deploy: the engine went to sleep, woke (its KV cache discarded, a cold
# start without a restart), or the number of replicas serving a model changed
SLEEP = "sleep"
WAKE = "wake"
REPLICAS = "replicas"
SOURCES = (API, RESTART, CONFIG_CHANGE, ANNOTATIONS, CHANGE_POINT, SLEEP, WAKE, REPLICAS)  # exported from zero; a recording adds its own
_COLD_STARTS = (RESTART, WAKE)
_NOT_DEPLOYS = (RESTART, WAKE, SLEEP, REPLICAS)


@dataclass(frozen=True)
class DeployEvent:
    t: float
    target: str | None  # None: every target (of `model`, where it names one)
    version: str
    source: str
    description: str = ""
    model: str | None = None  # an event of one model's replicas (REPLICAS), else None
    replicas: tuple[int, int] | None = None  # REPLICAS: (before, after)
    ratio_before: float | None = None  # REPLICAS: the model's judged ratio over its replicas before the change
    # REPLICAS: the scope whose replicas were counted ((label, value) of analysis.scope_labels): an
    # event of those replicas only, staging's count is none of prod's business
    scope: tuple[tuple[str, str], ...] = ()

    def concerns(self, model: str, scope: tuple[tuple[str, str], ...]) -> bool:
        """Whether the event is one of the replicas of `model` in `scope` (one that names no
        model is every model's)."""
        return self.model is None or (self.model == model and self.scope == scope)

    @property
    def is_restart(self) -> bool:
        """The cache started empty: a restart, a first start, or a wake from sleep mode
        (both sleep levels discard the KV cache): the cold-start grace of a restart."""
        return self.source in _COLD_STARTS

    @property
    def is_deploy(self) -> bool:
        """A change of what is served (announced, seen in the config, or a suspected
        change point): what the drop rule compares before and after."""
        return self.source not in _NOT_DEPLOYS

    def to_json(self) -> dict:
        out = {"t": self.t, "target": self.target, "version": self.version, "source": self.source, "description": self.description}
        if self.model is not None:
            out["model"] = self.model
        if self.scope:
            out["scope"] = dict(self.scope)
        if self.replicas is not None:
            out["replicas"] = {"before": self.replicas[0], "after": self.replicas[1]}
        return out


# --- restarts and configuration changes, from consecutive snapshots ------------------
class _Seen(NamedTuple):  # a tuple: made at every poll, where a frozen dataclass set each field through object.__setattr__
    process_start: float | None
    created: tuple
    queries: dict  # series key -> its queries counter: kept whole for the next poll, not rebuilt from pairs
    cache_config: tuple | None
    models: frozenset  # compared whole only: snap.model_names sorted 10,000 names in hash order every poll
    lora: tuple | None
    sleep: int | None  # the deepest sleep level of the target's engines (0 all awake), None if not said


def _seen(snap: Snapshot) -> _Seen:
    levels = [s.sleep_level for s in snap.series if s.sleep_level is not None]
    created = [(s.key, s.created) for s in snap.series if s.created is not None]
    if len(created) > 1:
        created.sort(key=lambda kc: key_order(kc[0]))
    return _Seen(
        process_start=snap.process_start_time,
        created=tuple(created),
        queries={s.key: s.prefix_cache.queries for s in snap.series if s.prefix_cache and s.prefix_cache.queries is not None},
        cache_config=snap.cache_config,
        models=frozenset(s.model_name for s in snap.series),
        lora=snap.lora_config,
        sleep=max(levels) if levels else None,
    )


_LEVELS = {1: "level 1: weights offloaded to CPU, KV cache discarded", 2: "level 2: weights and KV cache discarded"}


# A first scrape whose counters are below this many query tokens (summed over the
# target) has served almost nothing yet: its cache is as cold as after a restart.
COLD_COUNTERS_TOKENS = 20000.0


# Start times that change this often are no restarts: a URL in front of several
# processes (a Service round-robin over replicas) answers with each one's in turn. A real
# vLLM takes tens of seconds to load a model, and crash-loop back-off spaces restarts out.
FLAP_CHANGES = 3
FLAP_SECONDS = 300.0


class SnapshotChangeDetector:
    """Per target: a restart (a counter reset, changed `_created` or process start), a
    first start (the first scrape of a process started within the grace, or of counters
    near zero), or a configuration change (cache_config_info labels, model names, LoRA).

    A start time that goes back to an earlier one, or changes FLAP_CHANGES times within
    FLAP_SECONDS, is several processes behind one URL, not restarts: while that lasts no
    restart is reported (a restart grants the cold-start grace, which would silence every
    alert for good), `flapping` is true, and `notes` says so for the poll."""

    def __init__(self, target: str, grace: float):  # grace: rules.cold_start_grace
        self.target = target
        self.grace = grace
        self._last: _Seen | None = None
        # when the start time changed, within FLAP_SECONDS: a tuple, the empty one shared while the
        # start time stays (a deque a target was 760 bytes, some 8 MB at 10,000 pods)
        self._changes: tuple[float, ...] = ()
        self._flapped_at: float | None = None
        self.notes: list[str] = []  # what the last observe() refused, for the poll's warnings
        self.refused = 0  # start-time changes not taken for restarts by the last observe()
        self.asleep_since: float | None = None  # when we saw its engines go to sleep, while they sleep
        self._slept_at_level = 0

    @property
    def flapping(self) -> bool:
        return self._flapped_at is not None

    def observe(self, t: float, snap: Snapshot) -> list[DeployEvent]:
        seen = _seen(snap)
        last, self._last = self._last, seen
        self.notes, self.refused = [], 0
        if last is None:
            if seen.sleep:
                self.asleep_since, self._slept_at_level = t, seen.sleep  # asleep at our first look
            started, why = _cold_first_start(t, snap, self.grace)
            # the grace counts from the process start, as it does from a restart
            return [DeployEvent(started, self.target, f"start@{int(started)}", RESTART, why)] if why else []
        events = []
        why = self._restart(t, last, seen)
        if why:
            events.append(DeployEvent(t, self.target, f"restart@{int(t)}", RESTART, why))
        changed = [name for name, a, b in (("cache_config_info", last.cache_config, seen.cache_config),
                                           ("model names", last.models, seen.models),
                                           ("LoRA settings", last.lora, seen.lora)) if a != b and a is not None and b is not None]
        if changed:
            events.append(DeployEvent(t, self.target, f"config@{int(t)}", CONFIG_CHANGE, "changed: " + ", ".join(changed)))
        if not why:
            events += self._sleep_or_wake(t, last.sleep, seen.sleep)
        elif seen.sleep == 0:
            self.asleep_since = None
        return events

    def _sleep_or_wake(self, t: float, before: int | None, now: int | None) -> list[DeployEvent]:
        """vLLM's sleep mode: falling asleep is an event (the engine serves nothing, it is
        not down); waking is a cold start without a restart, both levels having discarded
        the KV cache, with the cold-start grace of a restart."""
        if before == 0 and now:
            self.asleep_since, self._slept_at_level = t, now
            return [DeployEvent(t, self.target, f"sleep@{int(t)}", SLEEP, f"the engine went to sleep ({_LEVELS.get(now, now)})")]
        if before and now == 0:
            since, self.asleep_since = self.asleep_since, None
            slept = f" after {t - since:.0f}s asleep" if since is not None else ""
            level = _LEVELS.get(self._slept_at_level or before, before)
            return [DeployEvent(t, self.target, f"wake@{int(t)}", WAKE,
                                f"the engine woke{slept} ({level}): its prefix cache starts empty, as after a restart")]
        if now and self.asleep_since is None:
            self.asleep_since, self._slept_at_level = t, now  # asleep at our first look
        return []

    def _restart(self, t: float, last: _Seen, seen: _Seen) -> str:
        """Why this poll is a restart, or "" (also for start times that flap)."""
        why, back = _start_change(last, seen)
        if self._changes and t - self._changes[0] > FLAP_SECONDS:
            self._changes = tuple(c for c in self._changes if t - c <= FLAP_SECONDS)
        if why:
            self._changes += (t,)
            if back or len(self._changes) >= FLAP_CHANGES:
                self._flapped_at = t
        if self._flapped_at is not None and t - self._flapped_at > FLAP_SECONDS:
            self._flapped_at = None  # quiet for FLAP_SECONDS: start times mean restarts again
        if self._flapped_at is not None:
            if why:
                self.refused = 1
                self.notes.append(f"{why}, {len(self._changes)} time(s) in {FLAP_SECONDS:.0f}s"
                                  f"{' and back to an earlier process' if back else ''}: several processes answer at "
                                  "this URL (a Service in front of replicas?); not taken for a restart, no cold-start grace")
            return ""
        if why:
            return why
        before = last.queries
        # a counter that steps back a little is no restart (see history.RESET_FRACTION)
        if any(q < b and is_reset(b, q) for key, q in seen.queries.items() if (b := before.get(key)) is not None):
            return "a counter decreased to at most half its value"
        return ""


def _cold_first_start(t: float, snap: Snapshot, grace: float) -> tuple[float, str]:
    """(when the process started, why it is a cold start) or (t, "") when it is not."""
    started = snap.process_start_time
    if started is None:
        created = [s.created for s in snap.series if s.created is not None]
        started = min(created) if created else None
    if started is not None and 0 <= t - started <= grace:
        return started, f"first scrape of a process started {t - started:.0f}s ago: the cache started cold"
    queries = [tokens(s.prefix_cache.queries, s.prefix_cache.unit, snap.block_size)
               for s in snap.series if s.prefix_cache is not None and s.prefix_cache.queries is not None]
    if started is None and queries and sum(queries) < COLD_COUNTERS_TOKENS:
        return t, f"first scrape with counters near zero ({sum(queries):.0f} query tokens): the cache starts cold"
    return t, ""


def _start_change(last: _Seen, seen: _Seen) -> tuple[str, bool]:
    """(what changed, whether it went back to an earlier start) of the process start
    time and the series' `_created`; a new process always starts later."""
    if last.process_start is not None and seen.process_start is not None and seen.process_start != last.process_start:
        return "process_start_time_seconds changed", seen.process_start < last.process_start
    before = dict(last.created)
    changed = [(before[key], created) for key, created in seen.created if key in before and before[key] != created]
    if changed:
        return "a counter's _created changed", any(new < old for old, new in changed)
    return "", False


# --- the Kubernetes downward-API annotations file ---------------------------------------
_ANNOTATION = re.compile(r'^([^=]+)="(.*)"$')


def parse_annotations(text: str) -> dict[str, str]:
    """The downward API writes `key="value"` lines, the value JSON-escaped."""
    out = {}
    for line in text.splitlines():
        m = _ANNOTATION.match(line.strip())
        if not m:
            continue
        try:
            out[m.group(1)] = json.loads('"' + m.group(2) + '"')
        except json.JSONDecodeError:
            out[m.group(1)] = m.group(2)
    return out


# --- a change point in the hit ratio, for deploys nobody announced ----------------------
@dataclass(frozen=True)
class ChangePointSettings:
    """`rules.change_point`, defaults in exporter/config/default_rules.yml."""

    recent: float  # seconds of low ratio that make a step
    reference: float  # seconds just before them that must have been high
    drop_points: float
    min_query_tokens: float  # on each side, in tokens
    kv_usage_ceiling: float  # above this a fall is eviction, not a new prompt


def detect_change_point(ivs: Sequence[Interval], now: float, settings: ChangePointSettings,
                        unit: str | None = None, block_size: int | None = None) -> float | None:
    """Per-poll intervals -> the time a sharp, sustained fall of the hit ratio began, or None.

    A step, not a slide: the recent ratio must sit `drop_points` under the ratio of the
    minute just before, every recent interval must be low, and KV memory must not be
    near full (that is eviction pressure, which slides). The intervals count in the
    lookup counters' `unit`; the traffic floor is in tokens of the target's `block_size`."""
    recent = [iv for iv in ivs if iv.end > now - settings.recent]
    reference = [iv for iv in ivs if now - settings.recent - settings.reference < iv.end <= now - settings.recent]
    if len(recent) < 2 or len(reference) < 3:
        return None
    rq, rh = sum(iv.query_tokens for iv in recent), sum(iv.hit_tokens for iv in recent)
    bq, bh = sum(iv.query_tokens for iv in reference), sum(iv.hit_tokens for iv in reference)
    if not change_point_has_traffic(rq, bq, settings, unit, block_size):
        return None
    before, after = ratio(bh, bq), ratio(rh, rq)
    if before - after < settings.drop_points:
        return None
    if any(iv.hit_ratio is not None and iv.hit_ratio > before - settings.drop_points / 2 for iv in recent):
        return None  # not sustained
    if any(iv.kv_cache_usage is not None and iv.kv_cache_usage >= settings.kv_usage_ceiling for iv in recent + reference):
        return None
    return recent[0].start


def change_point_has_traffic(recent_queries: float, reference_queries: float, settings: ChangePointSettings,
                             unit: str | None, block_size: int | None) -> bool:
    """Both sides of a change point served `min_query_tokens`, their query counts (in the
    counters' unit) taken in tokens of the target's block size."""
    floor = settings.min_query_tokens
    return tokens(recent_queries, unit, block_size) >= floor and tokens(reference_queries, unit, block_size) >= floor
