"""The recording format of `record` and `backtest` (JSON Lines, ordered by `t`), and the
replay of a recording through the same engine the sidecar runs, on a simulated clock."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import IO, Iterable, Iterator, TextIO

from . import jsonlines
from .config import Config, Target
from .deploys import RECORDING, DeployEvent
from .engine import Engine
from .rules import Transition
from .vllm_metrics import parse


class RecordingError(ValueError):
    pass


@dataclass(frozen=True)
class Scrape:
    t: float
    target: str
    body: str | None
    error: str | None
    labels: tuple[tuple[str, str], ...] | None = None  # the target's labels, where the recording has them


def read_lines(lines: IO[bytes] | Iterable[str]) -> Iterator[tuple[int, Scrape | DeployEvent | RecordingError]]:
    """(line number, record) for every line of a binary stream (or of strings); a bad
    line (not UTF-8, too long, not JSON, nested too deep, no finite `t`) yields a
    RecordingError and the replay goes on."""
    for n, line in jsonlines.lines(lines):
        if isinstance(line, jsonlines.JSONInputError):
            yield n, RecordingError(f"line {n}: {line}")
            continue
        if not line.strip():
            continue
        try:
            obj = jsonlines.loads(line)
        except jsonlines.JSONInputError as exc:
            yield n, RecordingError(f"line {n}: not JSON ({exc})")
            continue
        yield n, _record(n, obj)


def _record(n: int, obj) -> Scrape | DeployEvent | RecordingError:
    t = jsonlines.finite_number(obj.get("t")) if isinstance(obj, dict) else None
    if t is None:
        return RecordingError(f"line {n}: an object with a numeric `t` is required (finite: Unix seconds)")
    if obj.get("event") == "deploy":
        target = obj.get("target")
        version = obj.get("version")
        if (target is not None and not isinstance(target, str)) or not isinstance(version, str):
            return RecordingError(f"line {n}: a deploy event needs a string `version` and a string or null `target`")
        return DeployEvent(t, target, version, RECORDING, str(obj.get("description", "")))
    target = obj.get("target")
    if not isinstance(target, str) or not target:
        return RecordingError(f"line {n}: a scrape needs a `target`")
    body, error = obj.get("body"), obj.get("error")
    if not isinstance(body, str) and not isinstance(error, str):
        return RecordingError(f"line {n}: a scrape needs a string `body` or `error`")
    labels = obj.get("labels")
    if labels is not None and (not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
        return RecordingError(f"line {n}: `labels` must map label names to strings")
    return Scrape(t, target, body if isinstance(body, str) else None, error if isinstance(error, str) else None,
                  tuple(sorted(labels.items())) if labels is not None else None)


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


def write_line(out: TextIO, obj: dict) -> None:
    out.write(json.dumps(obj, separators=(",", ":")) + "\n")
