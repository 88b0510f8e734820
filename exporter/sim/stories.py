"""The stories a fleet tells besides a deploy, as recordings (`record`'s format) that
`backtest`, the tests and the demo share: a scale-out under round-robin routing, a change
of the replica count under routers with affinity, a cache tier lost, an engine put to
sleep and woken. Each can carry the timestamp incident too,
for the tests that it is still caught in that setup.

Times are seconds after `start`, the recording's first line; replicas that serve before
it have served `warm` seconds already (warm caches).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from .simulator import Conversations, Event, Replica, Route, Scenario

WARM = 900.0
MODEL = "demo/llama-3-8b"


@dataclass(frozen=True)
class Pod:
    name: str
    scenario: Scenario  # its events count in seconds after the recording's start (shifted per pod below)
    started: float  # seconds after the recording's start its process started (negative: before it)
    seed: int
    stopped: float | None = None  # seconds after the recording's start it was removed (a scale-in), or never


def fleet_lines(pods: Sequence[Pod], start: float, duration: float, interval: float = 5.0,
                deploys: Sequence[tuple[float, str | None, str]] = (), conversations: Conversations | None = None) -> list[dict]:
    """Scrape every pod every `interval` seconds from its start on; `deploys` are (seconds
    after start, target or None, version) lines, as `record` writes announced deploys."""
    replicas = []
    for p in pods:
        shift = -p.started  # a replica's events count from its own start
        sc = replace(p.scenario, events=tuple(replace(e, at=e.at + shift) for e in p.scenario.events))
        replicas.append((p, Replica(p.name, sc, start=start + p.started, seed=p.seed, conversations=conversations)))
    events = sorted(deploys, key=lambda d: d[0])
    out = []
    for i in range(int(duration // interval) + 1):
        t = start + i * interval
        while events and start + events[0][0] <= t:
            at, target, version = events.pop(0)
            out.append({"t": start + at, "event": "deploy", "target": target, "version": version})
        for p, r in replicas:
            if start + p.started <= t and (p.stopped is None or t < start + p.stopped):
                r.advance(t)
                out.append({"t": t, "target": p.name, "body": r.render()})
    return out


def _timestamp(incident_at: float | None) -> tuple[Event, ...]:
    return () if incident_at is None else (Event(incident_at, "prompt", "timestamp"),)


# --- the scenarios, shared by the recordings below and `simulate` (exporter/sim/serve.py) ----------
def conversations(rate: float) -> Scenario:
    """Conversation turns: a 560-token system prompt (one of 10 tenants') every replica
    caches, then 2,000 tokens of the session's context, cached where its previous turn
    was served (simulator.Conversations), then a short user turn."""
    return Scenario(request_rate=rate, tenants=10, system_tokens=560, user_tokens=(40, 60), conversation_tokens=2000)


def with_connector(rate: float, lost_at: float | None = None) -> Scenario:
    """vLLM with a KV connector: the GPU cache holds about a third of the tenants' system
    prompts (~30% of prompt tokens hit it), the connector's store all of them (another
    ~60%): a healthy 89%. At `lost_at` the store goes away: its hits stop, TTFT climbs,
    the GPU-local ratio holds."""
    events = () if lost_at is None else (Event(lost_at, "connector", False),)
    return Scenario(request_rate=rate, kv_blocks=4000, external_kv_blocks=200000, events=events)


def sleeping(rate: float, sleep_at: float, asleep: float = 120.0, level: int = 1) -> Scenario:
    """vLLM's sleep mode, as RL rollouts and GPU sharing use it: asleep at `sleep_at` for
    `asleep` seconds (serving nothing, /metrics answering), then awake with its KV cache
    discarded; 200 tenants' prompts at 4 requests/s take it 90 s to hit most of them again
    (the refill whose TTFT paged as a regression); no restart."""
    return Scenario(request_rate=rate, tenants=200, kv_blocks=24000,
                    events=(Event(sleep_at, "sleep", level), Event(sleep_at + asleep, "wake")))


def scale_out(start: float, duration: float, at: float, before: int = 2, after: int = 6, total_rate: float = 4.0,
              interval: float = 5.0, incident_at: float | None = None) -> list[dict]:
    """Conversation turns (a 560-token system prompt every replica caches, 2,000 tokens of
    context cached where the previous turn was served) over `before` replicas at a total
    rate, round robin; at `at` the fleet grows to `after`: the new pods start cold, the
    old ones take their share of the same traffic and, with 1/`after` of each session's
    turns instead of 1/`before`, hit less. Nothing about the prompt changed."""
    base = conversations(total_rate / before)
    conv = Conversations(sessions=int(10 * total_rate), context_tokens=2000)
    old = replace(base, events=(Event(at, "request_rate", total_rate / after),) + _timestamp(incident_at))
    new = replace(base, request_rate=total_rate / after, events=_timestamp(incident_at))
    pods = [Pod(f"vllm-{i}", old, -WARM, 100 + i) for i in range(before)]
    pods += [Pod(f"vllm-{i}", new, at, 100 + i) for i in range(before, after)]
    deploys = [(incident_at, None, "v42")] if incident_at is not None else []
    return fleet_lines(pods, start, duration, interval, deploys, conv)


ROUTINGS = ("round_robin", "hash_mod", "consistent")


def rescale(start: float, duration: float, at: float, before: int = 4, after: int = 3, routing: str = "hash_mod",
            total_rate: float = 4.0, sessions: int = 800, interval: float = 5.0, incident_at: float | None = None) -> list[dict]:
    """Conversation turns over `before` replicas behind a router (ROUTINGS: round robin; a
    hash of the session modulo the replica count, as prefix-hash routing without a ring
    does; consistent hashing, as session affinity and ring-based prefix routers do); at
    `at` the count becomes `after`: pods leave (a scale-in) or come cold (a scale-out), the
    router spreads the same traffic over the new set, and each session whose owner changed
    finds its context nowhere on its first turn there: the ratio falls and refills as the
    sessions come back (every sessions / total_rate seconds each). No prompt changes."""
    conv = Conversations(sessions=sessions, context_tokens=2000)
    names = [f"vllm-{i}" for i in range(max(before, after))]
    route = (lambda members, me: None) if routing == "round_robin" else \
        (lambda members, me: Route(routing, me, tuple(members)))
    pods = []
    for i, name in enumerate(names):
        events = _timestamp(incident_at)
        base = replace(conversations(total_rate / before), tenants=10, kv_blocks=120000)
        if i < before:
            sc = replace(base, route=route(names[:before], name), events=events + (
                (Event(at, "request_rate", total_rate / after), Event(at, "route", route(names[:after], name))) if i < after else ()))
            pods.append(Pod(name, sc, -WARM, 100 + i, stopped=at if i >= after else None))
        else:
            pods.append(Pod(name, replace(base, request_rate=total_rate / after, route=route(names[:after], name), events=events),
                            at, 100 + i))
    deploys = [(incident_at, None, "v42")] if incident_at is not None else []
    return fleet_lines(pods, start, duration, interval, deploys, conv)


def tiered(start: float, duration: float, lost_at: float | None = None, replicas: int = 2, interval: float = 5.0,
           incident_at: float | None = None) -> list[dict]:
    """`with_connector` on `replicas` replicas, its store lost at `lost_at` (or never)."""
    sc = with_connector(5.0, lost_at)
    sc = replace(sc, events=sc.events + _timestamp(incident_at))
    pods = [Pod(f"vllm-{i}", sc, -WARM, 100 + i) for i in range(replicas)]
    deploys = [(incident_at, None, "v42")] if incident_at is not None else []
    return fleet_lines(pods, start, duration, interval, deploys)


def sleep_and_wake(start: float, duration: float, sleep_at: float, asleep: float = 120.0, level: int = 1,
                   replicas: int = 2, interval: float = 5.0, incident_at: float | None = None) -> list[dict]:
    """`sleeping` on every replica at once."""
    sc = sleeping(4.0, sleep_at, asleep, level)
    sc = replace(sc, events=sc.events + _timestamp(incident_at))
    pods = [Pod(f"vllm-{i}", sc, -WARM, 100 + i) for i in range(replicas)]
    deploys = [(incident_at, None, "v42")] if incident_at is not None else []
    return fleet_lines(pods, start, duration, interval, deploys)
