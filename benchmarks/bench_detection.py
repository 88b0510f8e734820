"""Time to detect the incident: our deploy-aware rules (5 s polls, backtest) against the
plain PromQL rule `rate(hits[5m]) / rate(queries[5m]) < 0.5` with `for: 5m` at a 30 s
scrape interval, evaluated on the same simulated series by the real `promtool test rules`.
Also counts the alerts each raises on scenarios where nothing is wrong for a pager:
(b) restart + warm-up, (c) traffic under the token minimum, (d) a harmless deploy,
(g) one hour steady at ~85%."""
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from exporter.sim import simulator
from exporter.config.sections import Config
from exporter.monitor.replay import backtest
from exporter.sim.simulator import Event, Scenario
from exporter.parse.vllm_metrics import parse

START = 1_764_480_000.0
WARM = 900.0
DEPLOY = 600.0  # seconds into the recording
PROMQL_RULE = "rate(vllm:prefix_cache_hits_total[5m]) / rate(vllm:prefix_cache_queries_total[5m]) < 0.5"


def recording(scenario, duration, interval, deploys=(), per_replica_events=None):
    return simulator.scenario_recording(scenario, duration, START, WARM, 2, interval, deploys, per_replica_events=per_replica_events)


def ours(scenario, duration, deploys=(), per_replica_events=None):
    lines = [json.dumps(l) for l in recording(scenario, duration, 5.0, deploys, per_replica_events)]
    began = time.perf_counter()
    transitions = [t for t in backtest(lines, Config()) if t.state == "firing"]
    elapsed = time.perf_counter() - began
    paging = [t for t in transitions if dict(t.alert.labels).get("severity") in ("warning", "critical")]
    return paging, elapsed


def promql(scenario, duration, promtool, deploys=(), per_replica_events=None):
    """First minute (after the recording start) at which promtool sees the rule firing,
    and how many evaluation steps fire at all."""
    rec = [l for l in recording(scenario, duration, 30.0, deploys, per_replica_events) if "body" in l]
    series: dict[str, list[float]] = {}
    for line in rec:
        for s in parse(line["body"]).series:
            for name, value in (("vllm:prefix_cache_hits_total", s.prefix_cache.hits), ("vllm:prefix_cache_queries_total", s.prefix_cache.queries)):
                key = f'{name}{{instance="{line["target"]}",engine="{s.engine}",model_name="{s.model_name}"}}'
                series.setdefault(key, []).append(value)
    steps = len(next(iter(series.values())))
    rules = {"groups": [{"name": "plain", "interval": "30s", "rules": [
        {"alert": "PlainHitRateLow", "expr": PROMQL_RULE, "for": "5m"}]}]}
    evals = [{"eval_time": f"{i * 30}s", "alertname": "PlainHitRateLow", "exp_alerts": []} for i in range(steps)]
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "30s",
            "tests": [{"interval": "30s", "input_series": [{"series": k, "values": " ".join(repr(v) for v in vs)} for k, vs in series.items()],
                       "alert_rule_test": evals}]}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "rules.yml").write_text(yaml.safe_dump(rules))
        Path(tmp, "test.yml").write_text(yaml.safe_dump(test))
        out = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    # every failing step is one where the alert fired although the test expected none
    fired = sorted({_seconds(m) for m in re.findall(r"time: ([0-9hms.]+),", text)})
    return fired


def _seconds(text: str) -> float:
    total = 0.0
    for value, unit in re.findall(r"([0-9.]+)(h|m|s)", text):
        total += float(value) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


def main() -> dict:
    promtool = shutil.which("promtool")
    if promtool is None:
        sys.exit("promtool is missing: apt-get install prometheus (scripts/test installs it)")
    incident = simulator.incident(WARM + DEPLOY, request_rate=5.0)
    paging, elapsed = ours(incident, 1500, deploys=[(DEPLOY, None, "v42")])
    first_ours = min(t.t for t in paging) - (START + DEPLOY)
    fired = promql(incident, 1500, promtool)
    first_promql = min(fired) - DEPLOY if fired else float("inf")
    print(f"detection: incident at 10 req/s | ours {first_ours:.0f}s after the deploy (5 s polls) | "
          f"plain PromQL rule {first_promql:.0f}s (30 s scrapes, rate[5m] < 0.5, for 5m) | ours {first_promql / first_ours:.1f}x sooner (goal >= 10x)")
    print(f"backtest speed: 1500 s of 2 replicas replayed in {elapsed:.2f} s, {1500 / elapsed:.0f}x real time (goal >= 100x)")
    quiet = {
        "b restart+warm-up": (Scenario(request_rate=5.0), 1500, (), {0: [Event(WARM + 300, "restart")]}),
        "c under token minimum": (simulator.incident(WARM + 300, request_rate=0.01), 900, [(300.0, None, "v42")], None),
        "d harmless deploy": (Scenario(request_rate=5.0, events=(Event(WARM + 300, "prompt", "tail_edit"),)), 900, [(300.0, None, "v42")], None),
        "g 1h steady ~85%": (Scenario(request_rate=5.0, user_tokens=(120, 330)), 3600, (), None),
    }
    false_alerts = {}
    for name, (sc, duration, deploys, per_replica) in quiet.items():
        ours_paging, _ = ours(sc, duration, deploys, per_replica)
        plain = promql(sc, duration, promtool, deploys, per_replica)
        false_alerts[name] = (len(ours_paging), len(plain))
        print(f"false alerts, scenario {name}: ours {len(ours_paging)} | plain PromQL {len(plain)} firing steps (goal: ours 0)")
    return {"ours_s": first_ours, "promql_s": first_promql, "false_alerts": false_alerts, "backtest_speedup": 1500 / elapsed}


if __name__ == "__main__":
    main()
