"""The recording format of `record` and `backtest`: JSON Lines ordered by `t`, each a
scrape of one target or a deploy event. Reading and writing only; exporter/monitor/replay.py
plays a recording through the engine."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO, Iterable, Iterator, TextIO

from ..alerting.deploys import RECORDING, DeployEvent
from ..peers import jsonlines


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


def write_line(out: TextIO, obj: dict) -> None:
    out.write(json.dumps(obj, separators=(",", ":")) + "\n")
