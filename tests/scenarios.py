"""Simulator recordings of the issue's scenarios, as JSON lines of the recording format."""
import json

from exporter.sim import simulator

START = 1_764_480_000.0  # 2025-11-30T05:20:00Z
WARM = 900.0  # simulated seconds before the recording starts: caches are warm


def lines(scenario, duration, replicas=2, interval=5.0, deploys=(), generation="current", per_replica_events=None):
    recording = simulator.scenario_recording(scenario, duration, START, WARM, replicas, interval, deploys, generation, per_replica_events)
    return [json.dumps(line) for line in recording]


def at(seconds_after_start: float) -> float:
    """Scenario events count from the replica's start, WARM before the recording."""
    return WARM + seconds_after_start
