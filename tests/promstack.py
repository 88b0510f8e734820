"""A simulated vLLM fleet, the real sidecar and a real Prometheus scraping both, with
our rules loaded: the setup a team runs, on 127.0.0.1, for the tests that need data in
Prometheus (PromQL equivalence, dashboard queries, recording rules)."""
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from exporter.sim import simulator
from exporter.sim.server import Fleet

from conftest import free_port
from fakeserver import FakeServer, reply
from prom import Prometheus

ROOT = Path(__file__).parent.parent
MODEL = "demo/llama-3-8b"
OTHER_MODEL = "demo/qwen-2.5-7b"
V0_MODEL = "demo/opt-125m"
INCIDENT_AFTER = 75.0  # seconds after the fleet starts, vllm-0's prompt gets a timestamp


@dataclass
class FleetSetup:
    prometheus: Prometheus
    fleet: Fleet
    sidecar_url: str
    started: float
    router: FakeServer | None = None


ROUTER_INPUT_TOKENS_PER_SECOND = 4000.0
ROUTER_PREDICTS = 0.8


def _epp(started: float) -> FakeServer:
    """An llm-d EPP's prefix metrics, growing with the wall clock: it predicts 80%."""
    def metrics(h):
        elapsed = max(0.0, time.time() - started)
        tokens, requests = ROUTER_INPUT_TOKENS_PER_SECOND * elapsed, 5.0 * elapsed
        body = ("# TYPE llm_d_epp_prefix_indexer_hit_bytes histogram\n"
                f"llm_d_epp_prefix_indexer_hit_bytes_sum {4 * ROUTER_PREDICTS * tokens}\n"
                f"llm_d_epp_prefix_indexer_hit_bytes_count {requests}\n"
                "# TYPE llm_d_epp_request_input_tokens histogram\n"
                f'llm_d_epp_request_input_tokens_sum{{model_name="{MODEL}",target_model_name="{MODEL}"}} {tokens}\n'
                f'llm_d_epp_request_input_tokens_count{{model_name="{MODEL}",target_model_name="{MODEL}"}} {requests}\n')
        reply(h, 200, body.encode(), [("Content-Type", "text/plain")])
    return FakeServer({"/metrics": metrics}).__enter__()


def start(workdir: Path, history_seconds: float = 125.0, timeout: float = 300.0):
    now = time.time()
    warm = 600.0
    scenarios = {
        "vllm-0": (simulator.incident(warm + INCIDENT_AFTER, external_cache_fraction=0.3), "current", MODEL),
        "vllm-1": (simulator.Scenario(external_cache_fraction=0.3), "current", MODEL),
        "vllm-2": (simulator.Scenario(hits_broken=True), "v0.10", OTHER_MODEL),  # a 0.10 server whose hits never move
        "vllm-3": (simulator.Scenario(), "v0", V0_MODEL),  # a V0 engine: only the since-start hit-rate gauge
    }
    replicas = []
    for i, (name, (scenario, generation, model)) in enumerate(scenarios.items()):
        r = simulator.Replica(name, scenario, start=now - warm, seed=11 + i, generation=generation, model_names=[model])
        r.advance(now)
        replicas.append(r)
    fleet = Fleet(replicas, clock=time.time, kv_events=True).start()  # each replica's KV events too
    router = _epp(now)
    port = free_port()
    config = workdir / "sidecar.yml"
    config.write_text(yaml.safe_dump({
        "global": {"poll_interval": "1s", "connect_timeout": "500ms", "read_timeout": "1s", "jitter": "0s"},
        "targets": [{"name": r.name, "url": fleet.metrics_url(r.name), "labels": {"namespace": "llm", "pod": r.name},
                     "kv_events": {"endpoint": fleet.kv_endpoint(r.name), "topic": "kv"}} for r in replicas]
        + [{"name": "epp", "url": router.base + "/metrics", "labels": {"namespace": "llm", "pod": "epp"}}],
        "deploys": {"api_token": DEPLOY_TOKEN},
    }))
    sidecar = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={config}",
                                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warning"], cwd=ROOT)
    sidecar_url = f"http://127.0.0.1:{port}"
    scrape_configs = [{
        "job_name": f"vllm-{r.name}", "metrics_path": f"/{r.name}/metrics",
        "static_configs": [{"targets": [f"127.0.0.1:{fleet.port}"], "labels": {"namespace": "llm", "pod": r.name}}],
        "relabel_configs": [{"target_label": "job", "replacement": "vllm"}, {"target_label": "instance", "replacement": f"{r.name}:8000"}],
    } for r in replicas]
    scrape_configs.append({"job_name": "vllm-prefix-cache-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]})
    prom = Prometheus(workdir, scrape_configs, rule_files=[ROOT / "alerts" / "prefix-cache.rules.yml"], scrape_interval="1s")
    try:
        prom.start()
        _announce_deploy(sidecar_url)
        prom.wait_for_history('vllm:prefix_cache_queries_total{pod="vllm-0"}', history_seconds, timeout)
    except BaseException:
        prom.stop()
        sidecar.terminate()
        fleet.stop()
        router.__exit__(None, None, None)
        raise
    return FleetSetup(prom, fleet, sidecar_url, now, router), sidecar


DEPLOY_TOKEN = "fleet-fixture-token"  # the deploy API is closed without one


def _announce_deploy(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            r = requests.post(url + "/api/v1/deploys", json={"version": "v1", "description": "fleet fixture"},
                              headers={"Authorization": f"Bearer {DEPLOY_TOKEN}"}, timeout=2)
            if r.status_code == 202:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the sidecar did not accept a deploy event")


def stop(setup: FleetSetup, sidecar) -> None:
    setup.prometheus.stop()
    sidecar.terminate()
    sidecar.wait(timeout=30)
    setup.fleet.stop()
    if setup.router is not None:
        setup.router.__exit__(None, None, None)
