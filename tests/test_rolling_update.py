"""A rolling update in a real setup: a real Prometheus discovers simulated vLLM pods
from a file_sd file (with their version labels), the sidecar discovers them through
that Prometheus's targets API, and the pods are replaced one at a time."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from exporter.sim import simulator
from exporter.sim.server import Fleet

from conftest import free_port, wait_for
from prom import Prometheus

ROOT = Path(__file__).parent.parent
BROKEN_MODEL, OTHER_MODEL = "demo/llama-3-8b", "demo/qwen-2.5-7b"
EVERY = 20.0  # seconds between two replacements
# few system prompts, so that a new pod's cache fills within its warm-up at this pace
HEALTHY = simulator.Scenario(tenants=3)
BROKEN = simulator.incident(0.0, tenants=3)


class Pods:
    """The simulated pods and the file_sd file that lists them, as kubernetes_sd would."""

    def __init__(self, path: Path):
        self.path = path
        self.fleet = Fleet([], clock=time.time).start()
        self.versions: dict[str, tuple[str, str]] = {}  # pod -> (version, deployment)

    def add(self, name, version, deployment, scenario, model, warm=900.0, seed=0):
        self.fleet.add(simulator.Replica(name, scenario, start=time.time() - warm, seed=seed, model_names=[model]))
        self.versions[name] = (version, deployment)
        self._write()

    def remove(self, name):
        self.versions.pop(name)
        self._write()
        self.fleet.remove(name)

    def _write(self):
        groups = [{"targets": [f"127.0.0.1:{self.fleet.port}"],
                   "labels": {"pod": pod, "version": v, "deployment": d, "namespace": "llm", "__metrics_path__": f"/{pod}/metrics"}}
                  for pod, (v, d) in self.versions.items()]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.path)  # atomic, as a file_sd writer must be


def status(url):
    return requests.get(url + "/api/v1/status", timeout=5).json()


def version_alerts(url):
    return [a for a in status(url).get("alerts", []) if a["labels"].get("version")]


def polled(url):
    return sorted(t["name"] for t in status(url)["targets"])


@pytest.mark.slow
def test_a_rolling_update_is_caught_through_prometheus_discovery_before_half_the_fleet_rolls(tmp_path):
    pods = Pods(tmp_path / "vllm.json")
    for i in range(4):
        pods.add(f"llama-old-{i}", "v1", "llama", HEALTHY, BROKEN_MODEL, seed=i)
    for i in range(2):
        pods.add(f"qwen-old-{i}", "v6", "qwen", HEALTHY, OTHER_MODEL, seed=10 + i)
    prom = Prometheus(tmp_path, [{"job_name": "vllm", "file_sd_configs": [{"files": [str(pods.path)]}]}], scrape_interval="2s")
    port = free_port()
    sidecar_url = f"http://127.0.0.1:{port}"
    config = tmp_path / "sidecar.yml"
    config.write_text(yaml.safe_dump({
        "global": {"poll_interval": "1s", "connect_timeout": "500ms", "read_timeout": "1s", "jitter": "0s"},
        "discovery": {"refresh_interval": "1s", "prometheus": {"url": prom.url, "job": "vllm", "timeout": "2s"}},
        "analysis": {"window": "1m", "warmup": "8s", "min_query_tokens": 5000},
        "rules": {"hit_rate_drop_after_deploy": {"for": "3s", "min_query_tokens": 5000}},
    }))
    sidecar = None
    try:
        prom.start()
        sidecar = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={config}",
                                    f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"], cwd=ROOT,
                                   stderr=open(tmp_path / "sidecar.log", "w"))
        assert wait_for(lambda: len(polled(sidecar_url)) == 6, timeout=60, step=0.5), "the sidecar never discovered the 6 pods"
        time.sleep(5)  # some traffic on the old version
        # the rollout: llama's pods replaced by v2, whose prompt now starts with a timestamp;
        # qwen's by a harmless v7
        pods.add("qwen-new-0", "v7", "qwen", HEALTHY, OTHER_MODEL, warm=0.0, seed=30)
        pods.remove("qwen-old-0")
        started, replaced, fired_with = time.monotonic(), 0, None
        while time.monotonic() - started < 4 * EVERY and fired_with is None:
            if time.monotonic() - started >= replaced * EVERY:
                pods.add(f"llama-new-{replaced}", "v2", "llama", BROKEN, BROKEN_MODEL, warm=0.0, seed=20 + replaced)
                pods.remove(f"llama-old-{replaced}")
                replaced += 1
            firing = [a for a in version_alerts(sidecar_url) if a["state"] == "firing"]
            if firing:
                fired_with = (firing, replaced)
            time.sleep(0.5)
        assert fired_with is not None, "no version alert during the rollout; see " + str(tmp_path / "sidecar.log")
        (alert,), replaced_then = fired_with
        assert replaced_then <= 2, "must fire before half the fleet has rolled"
        assert {k: alert["labels"][k] for k in ("alertname", "version", "baseline_version", "model_name", "cause", "namespace")} == {
            "alertname": "PrefixCacheHitRateDropAfterDeploy", "version": "v2", "baseline_version": "v1",
            "model_name": BROKEN_MODEL, "cause": "prompt_prefix_change", "namespace": "llm"}
        gate = requests.get(sidecar_url + "/api/v1/analysis", params={"model": BROKEN_MODEL, "version": "v2"}, timeout=5)
        assert gate.status_code == 200 and gate.json()["verdict"] == "fail", gate.text
        assert wait_for(lambda: requests.get(sidecar_url + "/api/v1/analysis", params={"model": OTHER_MODEL, "version": "v7"},
                                             timeout=5).json()["verdict"] == "pass", timeout=30, step=1)
        flagger = requests.post(sidecar_url + "/api/v1/analysis/flagger", timeout=5,
                                json={"name": "llama", "namespace": "llm", "phase": "Progressing", "metadata": {"model": BROKEN_MODEL, "version": "v2"}})
        assert flagger.status_code == 409 and flagger.json()["verdict"] == "fail"
        # Prometheus goes away: the sidecar keeps polling what it last knew and says so
        before = polled(sidecar_url)
        prom.stop()
        assert wait_for(lambda: 'prefixcache_discovery_last_refresh_successful{source="prometheus"} 0.0'
                        in requests.get(sidecar_url + "/metrics", timeout=5).text, timeout=20, step=0.5)
        assert polled(sidecar_url) == before and len(before) == 6
        # a Prometheus shutting down may still answer 503 before its port closes: either is the failure, said once
        log = (tmp_path / "sidecar.log").read_text()
        assert re.search(r"discovery prometheus: .*(unreachable|HTTP 503)", log), log[-2000:]
    finally:
        if sidecar is not None:
            sidecar.terminate()
            sidecar.wait(timeout=20)
        prom.stop()
        pods.fleet.stop()
