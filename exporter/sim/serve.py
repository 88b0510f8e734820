"""The `simulate` command: a fleet of simulated vLLM replicas playing a scenario, served on 127.0.0.1."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

from ..exitcodes import EXIT_ERROR, EXIT_OK
from ..stopping import stop_event
from . import simulator, stories
from .server import Fleet

SCALE_OUT_FACTOR = 3  # scale_out: the fleet grows to this many times --replicas at --event-at


SCENARIOS = {
    "healthy": lambda a: simulator.Scenario(request_rate=a.rate),
    "incident": lambda a: simulator.incident(a.event_at, request_rate=a.rate),
    "kv_pressure": lambda a: simulator.kv_pressure(a.event_at, 300.0, request_rate=a.rate),
    # the stories of exporter/sim/stories.py, which the tests replay
    "tier_lost": lambda a: stories.with_connector(a.rate, a.event_at),
    "sleep_wake": lambda a: stories.sleeping(a.rate, a.event_at),
    # round-robin conversation turns; at --event-at the fleet grows SCALE_OUT_FACTOR times, the
    # same traffic spread over it (the new replicas are listed from the start, 404 until then)
    "scale_out": lambda a: replace(stories.conversations(a.rate), events=(simulator.Event(a.event_at, "request_rate", a.rate / SCALE_OUT_FACTOR),)),
}


def command(args) -> int:
    """`simulate`: simulated vLLM replicas on 127.0.0.1 until the duration ends or a signal comes."""
    now = time.time()
    scenario = SCENARIOS[args.scenario](args)
    conversations = simulator.Conversations(args.replicas * 20, scenario.conversation_tokens) if scenario.conversation_tokens else None
    replicas = [simulator.Replica(f"vllm-{i}", scenario, start=now, seed=i, generation=args.generation, conversations=conversations)
                for i in range(args.replicas)]
    later = [f"vllm-{i}" for i in range(args.replicas, args.replicas * SCALE_OUT_FACTOR)] if args.scenario == "scale_out" else []
    try:
        fleet = Fleet(replicas, clock=time.time, port=args.port).start()
    except OSError as exc:
        print(f"error: cannot listen on port {args.port}: {exc.strerror}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps({"port": fleet.port, "targets": [fleet.metrics_url(n) for n in [r.name for r in replicas] + later]}), flush=True)
    stop = stop_event()
    end = now + args.duration if args.duration > 0 else None
    if later and not stop.wait(max(0.0, min(now + args.event_at, end or float("inf")) - time.time())) and \
            (end is None or time.time() < end):
        grown = replace(scenario, request_rate=args.rate / SCALE_OUT_FACTOR, events=())
        for i, name in enumerate(later):  # new pods: cold caches, the same sessions
            fleet.add(simulator.Replica(name, grown, start=time.time(), seed=len(replicas) + i, generation=args.generation,
                                        conversations=conversations))
    stop.wait(None if end is None else max(0.0, end - time.time()))
    fleet.stop()
    return EXIT_OK
