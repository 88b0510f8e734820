"""Simulator recordings of the issue's scenarios, written as the recording format."""
import json

from exporter import simulator
from exporter.simulator import Event, Replica, Scenario

START = 1_764_480_000.0  # 2025-11-30T05:20:00Z
WARM = 900.0  # simulated seconds before the recording starts: caches are warm


def lines(scenario: Scenario, duration: float, replicas: int = 2, interval: float = 5.0, deploys=(), generation="current",
          per_replica_events=None):
    """JSON lines: every replica scraped every `interval`; deploy events at (seconds, target, version)."""
    reps = []
    for i in range(replicas):
        sc = scenario
        if per_replica_events and i in per_replica_events:
            sc = Scenario(**{**scenario.__dict__, "events": tuple(scenario.events) + tuple(per_replica_events[i])})
        r = Replica(f"vllm-{i}", sc, start=START - WARM, seed=100 + i, generation=generation)
        r.advance(START)
        reps.append(r)
    shifted = [(WARM + at, target, version) for at, target, version in deploys]
    out = []
    for line in simulator.recording_lines(reps, START, duration, interval, [(at - WARM, t, v) for at, t, v in shifted]):
        out.append(json.dumps(line))
    return out


def at(seconds_after_start: float) -> float:
    """Scenario events are relative to the replica's start, WARM before the recording."""
    return WARM + seconds_after_start
