"""A recording replayed through the same engine the sidecar runs, on a simulated clock:
what `backtest` prints, and what the detection benchmark and scenario tests judge."""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import IO, Iterable, Iterator

from ..alerting.deploys import DeployEvent
from ..alerting.rules_state import Transition
from ..config.sections import Config, Target
from ..parse.vllm_metrics import parse
from .engine import Engine
from .recording import RecordingError, Scrape, read_lines

GONE_AFTER_POLLS = 3  # a target with no line for this many of its own intervals has gone, as a pod does
CADENCE_GAPS = 8  # a target's cadence is the median of its last this many gaps between lines


class Cadences:
    """How often each target of a recording was scraped, read from the recording itself:
    a Prometheus at 20 s, `record` at the sidecar's 5 s. Until a target's second line, the
    recording's own step between distinct times stands in for it."""

    def __init__(self, poll_interval: float):
        self.poll_interval = poll_interval
        self.last: dict[str, float] = {}
        self.gaps: dict[str, list[float]] = {}
        self._steps: list[float] = []  # gaps between the recording's distinct times
        self._step_t: float | None = None

    def step(self, t: float) -> None:
        if self._step_t is not None and t > self._step_t:
            self._steps = (self._steps + [t - self._step_t])[-CADENCE_GAPS:]
        self._step_t = t

    def seen(self, target: str, t: float) -> None:
        last = self.last.get(target)
        if last is not None and t > last:
            self.gaps[target] = (self.gaps.get(target, []) + [t - last])[-CADENCE_GAPS:]
        self.last[target] = t

    def of(self, target: str) -> float | None:
        gaps = self.gaps.get(target)
        if gaps:
            return statistics.median(gaps)
        return statistics.median(self._steps) if self._steps else None

    def gone_after(self, target: str) -> float:
        return GONE_AFTER_POLLS * max(self.poll_interval, self.of(target) or 0.0)

    def forget(self, target: str) -> None:
        self.last.pop(target, None)
        self.gaps.pop(target, None)


def backtest(lines: IO[bytes] | Iterable[str], config: Config, warn=lambda msg: None, engine: Engine | None = None,
             on_record=lambda: None, note=None) -> Iterator[Transition]:
    """Replay a recording; yields every alert transition. Rules run after each time step.
    Targets appear with their first line (with its `labels`, if any) and are forgotten
    when they have had no line for GONE_AFTER_POLLS of their own intervals, as discovered
    pods come and go. Each target's interval is read from the recording: one scraped every
    20 s (a Prometheus scrape interval) is replayed at that cadence, and `warn` says so
    where it differs from global.poll_interval, which the engine is then run with (its
    change-point spans follow it). Pass an `engine` to look at its state (alerts, events)
    afterwards; `on_record` is called for each line that was a record, `warn` for each
    that was not, `note` (default: `warn`) for what the replay read from the recording."""
    note = note or warn
    engine = engine or Engine(replace(config, targets=()))
    poll = config.global_.poll_interval
    cadences = Cadences(poll)
    told: set[float] = set()
    step_t: float | None = None
    last_t = float("-inf")
    batch: list[tuple[int, Scrape | DeployEvent]] = []
    for n, record in read_lines(lines):
        if isinstance(record, RecordingError):
            warn(str(record))
            continue
        if record.t < last_t:
            warn(f"line {n}: t={record.t} goes back in time; skipped")
            continue
        on_record()
        cadences.step(record.t)
        if step_t is not None and record.t > step_t:
            _replay_batch(engine, cadences, batch, poll, told, warn, note)
            batch = []
            yield from engine.evaluate(step_t)
            _forget(engine, cadences, record.t)
        elif len(batch) >= MAX_BATCH:
            _replay_batch(engine, cadences, batch, poll, told, warn, note)
            batch = []
        last_t = step_t = record.t
        batch.append((n, record))
    _replay_batch(engine, cadences, batch, poll, told, warn, note)
    if step_t is not None:
        yield from engine.evaluate(step_t)


# The lines of one time step are replayed together: the engine is reconfigured once for the
# targets that appear in them (once per target, 5,000 appearing at once took minutes: each
# reconfiguration walks every target). A step of more lines is replayed in parts of this
# many, so memory holds at most these lines.
MAX_BATCH = 4096


def _replay_batch(engine: Engine, cadences: Cadences, batch: list[tuple[int, Scrape | DeployEvent]], poll: float,
                  told: set[float], warn, note) -> None:
    """The lines of one time step, in their order, after one reconfiguration that adds the
    targets they bring (or changes their labels). A target added a few lines early has an
    empty history until its line: no rule or event reads it before then."""
    arriving: dict[str, Target] = {}
    for _, record in batch:
        if isinstance(record, DeployEvent):
            continue
        known = engine.tracks.get(record.target)
        labels = arriving[record.target].labels if record.target in arriving else known.target.labels if known else None
        if known is None and record.target not in arriving or (record.labels is not None and labels != record.labels):
            arriving[record.target] = Target(record.target, f"http://recording.invalid/{record.target}", record.labels or ())
    if arriving:
        others = tuple(t for t in engine.config.targets if t.name not in arriving)
        engine.reconfigure(replace(engine.config, targets=others + tuple(arriving.values())))
    for n, record in batch:
        if isinstance(record, DeployEvent):
            engine.add_event(record)
            continue
        cadences.seen(record.target, record.t)
        _follow_cadence(engine, cadences, record.target, poll, told, note)
        if record.body is None:
            engine.ingest_failure(record.target, record.t)
            continue
        snapshot = parse(record.body)
        if snapshot.series or snapshot.router is not None:  # a router target has predictions, no series
            engine.ingest(record.target, record.t, snapshot)
        else:
            warn(f"line {n}: no vLLM prefix-cache series in the body")
            engine.ingest_failure(record.target, record.t)


def _follow_cadence(engine: Engine, cadences: Cadences, target: str, poll: float, told: set[float], warn) -> None:
    """Once a target's cadence is known and differs from the configured poll interval:
    say so (once per cadence) and run the engine at the slowest cadence seen."""
    if not cadences.gaps.get(target):
        return
    cadence = cadences.of(target)
    if cadence is None or abs(cadence - poll) <= 0.1 * poll:
        return
    if cadence not in told:
        told.add(cadence)
        warn(f"target {target} was recorded every {cadence:g}s, global.poll_interval is {poll:g}s: replayed at the "
             f"recording's cadence (a target is gone after {GONE_AFTER_POLLS * max(poll, cadence):g}s without a line, "
             "change points need two intervals)")
    g = engine.config.global_
    if cadence > g.poll_interval:
        engine.reconfigure(replace(engine.config, global_=replace(g, poll_interval=cadence)))


def _forget(engine: Engine, cadences: Cadences, now: float) -> None:
    gone = {name for name, t in cadences.last.items() if now - t > cadences.gone_after(name)}
    if gone:
        for name in gone:
            cadences.forget(name)
        engine.reconfigure(replace(engine.config, targets=tuple(t for t in engine.config.targets if t.name not in gone)))
