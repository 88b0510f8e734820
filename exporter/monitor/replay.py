"""A recording replayed through the same engine the sidecar runs, on a simulated clock:
what `backtest` prints, and what the detection benchmark and scenario tests judge."""
from __future__ import annotations

from dataclasses import replace
from typing import IO, Iterable, Iterator

from ..alerting.deploys import DeployEvent
from ..alerting.rules_state import Transition
from ..config.sections import Config, Target
from ..parse.vllm_metrics import parse
from .engine import Engine
from .recording import RecordingError, read_lines

GONE_AFTER_POLLS = 3  # a target with no line for this many poll intervals has gone, as a pod does


def backtest(lines: IO[bytes] | Iterable[str], config: Config, warn=lambda msg: None, engine: Engine | None = None,
             on_record=lambda: None) -> Iterator[Transition]:
    """Replay a recording; yields every alert transition. Rules run after each time step.
    Targets appear with their first line (with its `labels`, if any) and are forgotten
    when they have had no line for GONE_AFTER_POLLS poll intervals, as discovered pods
    come and go. Pass an `engine` to look at its state (alerts, events) afterwards;
    `on_record` is called for each line that was a record, `warn` for each that was not."""
    engine = engine or Engine(replace(config, targets=()))
    gone_after = GONE_AFTER_POLLS * config.global_.poll_interval
    step_t: float | None = None
    last_t = float("-inf")
    seen: dict[str, float] = {}
    for n, record in read_lines(lines):
        if isinstance(record, RecordingError):
            warn(str(record))
            continue
        if record.t < last_t:
            warn(f"line {n}: t={record.t} goes back in time; skipped")
            continue
        on_record()
        if step_t is not None and record.t > step_t:
            yield from engine.evaluate(step_t)
            _forget(engine, seen, record.t - gone_after)
        last_t = step_t = record.t
        if isinstance(record, DeployEvent):
            engine.add_event(record)
            continue
        seen[record.target] = record.t
        known = engine.tracks.get(record.target)
        if known is None or (record.labels is not None and known.target.labels != record.labels):
            target = Target(record.target, f"http://recording.invalid/{record.target}", record.labels or ())
            others = tuple(t for t in engine.config.targets if t.name != record.target)
            engine.reconfigure(replace(engine.config, targets=others + (target,)))
        if record.body is None:
            engine.ingest_failure(record.target, record.t)
            continue
        snapshot = parse(record.body)
        if snapshot.series or snapshot.router is not None:  # a router target has predictions, no series
            engine.ingest(record.target, record.t, snapshot)
        else:
            warn(f"line {n}: no vLLM prefix-cache series in the body")
            engine.ingest_failure(record.target, record.t)
    if step_t is not None:
        yield from engine.evaluate(step_t)


def _forget(engine: Engine, seen: dict[str, float], before: float) -> None:
    gone = {name for name, t in seen.items() if t < before}
    if gone:
        for name in gone:
            seen.pop(name)
        engine.reconfigure(replace(engine.config, targets=tuple(t for t in engine.config.targets if t.name not in gone)))
