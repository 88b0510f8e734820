"""The issue's scenarios: simulator recordings through `backtest`."""
import json
import subprocess
import sys

import pytest

from exporter.config import Config
from exporter.engine import Engine
from exporter.recording import backtest, read_lines, RecordingError
from exporter.simulator import Event, Scenario
from exporter import simulator

from scenarios import START, at, lines


def run(recording, config=None):
    config = config or Config()
    engine = Engine(config)
    warnings = []
    transitions = [t.to_json() for t in backtest(recording, config, warnings.append, engine=engine)]
    return transitions, engine, warnings


def paging(transitions):
    return [t for t in transitions if t["labels"].get("severity") in ("warning", "critical") and t["state"] in ("pending", "firing")]


def test_a_the_incident_fires_with_its_cause_within_30s_of_the_deploy():
    deploy = 300.0
    rec = lines(simulator.incident(at(deploy), request_rate=5.0), duration=600, deploys=[(deploy, None, "v42")])
    transitions, engine, warnings = run(rec)
    assert warnings == []
    firing = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateDropAfterDeploy" and t["state"] == "firing"]
    assert {t["labels"]["target"] for t in firing} == {"vllm-0", "vllm-1"}
    for t in firing:
        assert t["labels"]["cause"] == "prompt_prefix_change"
        assert t["t"] - (START + deploy) <= 30
        assert t["labels"]["severity"] == "critical" and t["labels"]["model_name"] == "demo/llama-3-8b"
        assert set(t["annotations"]) >= {"summary", "description", "runbook_url"}
        assert "v42" in t["annotations"]["summary"]


def test_b_a_restart_and_its_warm_up_page_nobody():
    rec = lines(Scenario(request_rate=5.0), duration=1200, per_replica_events={0: [Event(at(300), "restart")]})
    transitions, engine, _ = run(rec)
    assert paging(transitions) == []
    restarts = [e for e in engine.events if e.source == "restart"]
    assert [(e.target, e.t) for e in restarts] == [("vllm-0", START + 300)]


def test_c_traffic_under_the_token_minimum_is_inconclusive_and_fires_nothing():
    deploy = 300.0
    rec = lines(simulator.incident(at(deploy), request_rate=0.01), duration=600, deploys=[(deploy, None, "v42")])
    transitions, engine, _ = run(rec)
    assert transitions == []
    states = {(a.alertname, a.state) for a in engine.active_alerts()}
    assert ("PrefixCacheHitRateDropAfterDeploy", "inconclusive") in states


def test_d_a_harmless_deploy_fires_nothing():
    deploy = 300.0
    scenario = Scenario(request_rate=5.0, events=(Event(at(deploy), "prompt", "tail_edit"),))
    rec = lines(scenario, duration=900, deploys=[(deploy, None, "v42")])
    transitions, _, _ = run(rec)
    assert transitions == []


def test_e_kv_pressure_slide_is_low_hit_rate_from_eviction():
    rec = lines(simulator.kv_pressure(at(120), 600, request_rate=5.0), duration=1500)
    transitions, _, _ = run(rec)
    low = [t for t in transitions if t["alertname"] == "PrefixCacheHitRateLow" and t["state"] == "firing"]
    assert low and all(t["labels"]["cause"] == "eviction_pressure" for t in low)
    assert not [t for t in transitions if t["labels"]["cause"] == "prompt_prefix_change"]


def test_f_the_incident_without_a_deploy_event_is_caught_by_the_change_point():
    rec = lines(simulator.incident(at(300), request_rate=5.0), duration=600)
    transitions, engine, _ = run(rec)
    firing = [t for t in transitions if t["state"] == "firing" and t["labels"]["cause"] == "prompt_prefix_change"]
    assert firing
    assert {e.source for e in engine.events} == {"change_point"}


def test_g_an_hour_of_steady_85_percent_fires_nothing():
    rec = lines(Scenario(request_rate=5.0, user_tokens=(120, 330)), duration=3600)
    transitions, engine, _ = run(rec)
    assert transitions == []
    ratios = [w["5m"].hit_ratio for track in engine.tracks.values() for w in track.stats.values()]
    assert all(0.82 <= r <= 0.88 for r in ratios)


def test_backtest_is_deterministic_and_the_cli_prints_transitions(tmp_path):
    deploy = 120.0
    rec = lines(simulator.incident(at(deploy), request_rate=5.0), duration=300, deploys=[(deploy, "vllm-0", "v42")])
    path = tmp_path / "incident.jsonl"
    path.write_text("\n".join(rec) + "\n")
    outs = [subprocess.run([sys.executable, "-m", "exporter", "backtest", str(path)], capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert outs[0].returncode == 0 and outs[0].stdout == outs[1].stdout
    printed = [json.loads(l) for l in outs[0].stdout.splitlines()]
    assert printed and all(set(p) == {"t", "alertname", "state", "labels", "annotations"} for p in printed)
    assert any(p["alertname"] == "PrefixCacheHitRateDropAfterDeploy" and p["labels"]["target"] == "vllm-0" for p in printed)


@pytest.mark.parametrize("line, fragment", [
    pytest.param("{not json", "not JSON", id="bad-json"),
    pytest.param('{"target": "x", "body": ""}', "numeric `t`", id="no-t"),
    pytest.param('{"t": 1, "body": "x"}', "needs a `target`", id="no-target"),
    pytest.param('{"t": 1, "target": "x"}', "`body` or `error`", id="no-body-or-error"),
    pytest.param('{"t": 1, "event": "deploy", "target": 3, "version": "v"}', "deploy event", id="bad-deploy"),
])
def test_bad_recording_lines_are_reported_and_skipped(line, fragment):
    ((n, record),) = list(read_lines([line]))
    assert isinstance(record, RecordingError) and fragment in str(record)


def test_bad_lines_do_not_stop_the_replay():
    rec = lines(Scenario(request_rate=5.0), duration=60, replicas=1)
    rec.insert(3, "garbage")
    rec.insert(5, json.dumps({"t": START - 1000, "target": "vllm-0", "body": ""}))
    rec.append(json.dumps({"t": START + 65, "target": "vllm-0", "error": "timeout"}))
    transitions, engine, warnings = run(rec)
    assert len(warnings) == 2 and "goes back in time" in warnings[1]
    assert engine.tracks["vllm-0"].up is False and len(engine.tracks["vllm-0"].history) == 13
