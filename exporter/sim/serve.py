"""The `simulate` command: a fleet of simulated vLLM replicas playing a scenario, served on 127.0.0.1."""
from __future__ import annotations

import json
import sys
import time

from ..exitcodes import EXIT_ERROR, EXIT_OK
from ..stopping import stop_event
from . import simulator
from .server import Fleet


SCENARIOS = {
    "healthy": lambda a: simulator.Scenario(request_rate=a.rate),
    "incident": lambda a: simulator.incident(a.event_at, request_rate=a.rate),
    "kv_pressure": lambda a: simulator.kv_pressure(a.event_at, 300.0, request_rate=a.rate),
}


def command(args) -> int:
    """`simulate`: simulated vLLM replicas on 127.0.0.1 until the duration ends or a signal comes."""
    now = time.time()
    replicas = [simulator.Replica(f"vllm-{i}", SCENARIOS[args.scenario](args), start=now, seed=i, generation=args.generation)
                for i in range(args.replicas)]
    try:
        fleet = Fleet(replicas, clock=time.time, port=args.port).start()
    except OSError as exc:
        print(f"error: cannot listen on port {args.port}: {exc.strerror}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps({"port": fleet.port, "targets": [fleet.metrics_url(r.name) for r in replicas]}), flush=True)
    stop = stop_event()
    stop.wait(args.duration if args.duration > 0 else None)
    fleet.stop()
    return EXIT_OK
