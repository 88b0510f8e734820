"""The central variant as a user applies it, on a Prometheus shaped as prometheus-operator
runs it: the variant is built with kubectl kustomize, its vLLM PodMonitor is turned into the
scrape config the operator generates for it (pkg/prometheus/promcfg.go, v0.93.0: pool
`podMonitor/<ns>/<name>/<i>`, then the pod selector, the port filter, namespace/container/
pod, job `<ns>/<name>`, endpoint, then the PodMonitor's own relabelings), and the sidecar runs
the variant's own config with only the addresses of this machine put in. Every pod is polled
with its version (a Deployment's pods by their pod-template-hash, one with a version label
of its own, an Argo Rollout pod by its rollouts-pod-template-hash), and the gate never
passes a version that no pod runs."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port, require_binary, wait_for
from prom import Prometheus

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def built_central() -> list[dict]:
    out = subprocess.run([require_binary("kubectl"), "kustomize", str(ROOT / "deploy/kubernetes/central")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _label_meta(name: str) -> str:
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in name)


def operator_scrape_config(monitor: dict, sd_file: Path) -> dict:
    """What the operator generates for the first podMetricsEndpoints entry of `monitor`."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    relabel = [{"source_labels": [_label_meta(k)], "regex": v, "action": "keep"}
               for k, v in monitor["spec"]["selector"].get("matchLabels", {}).items()]
    relabel += [
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"], "action": "keep"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{ns}/{name}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    camel = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex",
             "replacement": "replacement", "action": "action", "separator": "separator"}
    for rule in endpoint.get("relabelings", []):
        unknown = set(rule) - set(camel)
        assert not unknown, f"translate {unknown} too"
        relabel.append({camel[k]: v for k, v in rule.items()})
    return {"job_name": f"podMonitor/{ns}/{name}/0", "metrics_path": endpoint.get("path", "/metrics"),
            "file_sd_configs": [{"files": [str(sd_file)]}], "relabel_configs": relabel}



def run_sidecar(tmp_path, config: dict, port: int) -> subprocess.Popen:
    """The exporter as its own process on `config`, its log in tmp_path/sidecar.log."""
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config))
    return subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={tmp_path / 'config.yml'}",
                             f"--web.listen-address=127.0.0.1:{port}"], cwd=ROOT, stderr=open(tmp_path / "sidecar.log", "w"))


def stop_all(sidecar: subprocess.Popen | None, prom, fleet) -> None:
    if sidecar is not None:
        sidecar.terminate()
        sidecar.wait(timeout=20)
    prom.stop()
    fleet.stop()

def test_the_central_variant_polls_every_pod_of_an_operator_managed_prometheus_and_never_passes_a_missing_version(tmp_path):
    from exporter.sim import simulator
    from exporter.sim.server import Fleet

    docs = built_central()
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "vllm"]
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yml" in d.get("data", {})]
    config = yaml.safe_load(config_map["data"]["config.yml"])

    fleet = Fleet([], clock=time.time).start()
    # pod -> its labels as Kubernetes has them: a Deployment's pods with their version
    # label, an Argo Rollout's canary pod with its pod-template hash, and a pod of another app
    # (Helm's app.kubernetes.io/version is the chart's appVersion, the same on every pod)
    pods = {"vllm-7f9c8d6b5-abcde": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/version": "v1", "pod-template-hash": "7f9c8d6b5"},
            "vllm-7f9c8d6b5-fghij": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/version": "v1", "pod-template-hash": "7f9c8d6b5"},
            "vllm-5b8d9c7f6-pqrst": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/version": "v1", "pod-template-hash": "5b8d9c7f6",
                                     "vllm-prefix-cache-exporter/version": "prompt-v42"},
            "vllm-68d7c9f4b-klmno": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/version": "v1",
                                     "rollouts-pod-template-hash": "68d7c9f4b"},
            "embedder-0": {"app.kubernetes.io/name": "embedder"}}
    for i, pod in enumerate(pods):
        fleet.add(simulator.Replica(pod, simulator.Scenario(), start=time.time() - 900, seed=i))
    sd = tmp_path / "pods.json"
    # the path of each pod's /metrics on the one fake server stands where kubernetes_sd's
    # pod IP would: the rest are the __meta_ labels kubernetes_sd gives a pod
    sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{fleet.port}"], "labels": {
        "__metrics_path__": f"/{pod}/metrics", "__meta_kubernetes_namespace": monitor["metadata"]["namespace"],
        "__meta_kubernetes_pod_name": pod, "__meta_kubernetes_pod_container_name": "vllm",
        "__meta_kubernetes_pod_container_port_name": "http", **{_label_meta(k): v for k, v in labels.items()}}}
        for pod, labels in pods.items()]))
    scrape = operator_scrape_config(monitor, sd)
    scrape.pop("metrics_path")  # each fake pod's path comes from its __metrics_path__
    prom = Prometheus(tmp_path, [scrape])

    # the variant's own config; only what points at the cluster points at this machine
    config["discovery"]["prometheus"]["url"] = None  # set once Prometheus has its port
    (tmp_path / "token").write_text("s3cret\n")
    config["deploys"]["api_token_file"] = str(tmp_path / "token")
    config["alertmanager"]["urls"] = [f"http://127.0.0.1:{free_port()}"]
    config.setdefault("global", {}).update(poll_interval="2s")  # the shortest its default timeouts allow
    config["discovery"]["refresh_interval"] = "1s"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    sidecar = None
    try:
        prom.start()
        config["discovery"]["prometheus"]["url"] = prom.url
        sidecar = run_sidecar(tmp_path, config, port)
        expected = {"vllm-7f9c8d6b5-abcde": "7f9c8d6b5", "vllm-7f9c8d6b5-fghij": "7f9c8d6b5", "vllm-5b8d9c7f6-pqrst": "prompt-v42",
                    "vllm-68d7c9f4b-klmno": "68d7c9f4b"}

        def polled() -> dict:
            """target -> version of every target up, as our own /metrics labels them."""
            up = {}
            for family in text_string_to_metric_families(requests.get(base + "/metrics", timeout=5).text):
                if family.name == "prefixcache_target_up":
                    up.update({s.labels["target"]: s.labels.get("version") for s in family.samples if s.value == 1.0})
            return up

        assert wait_for(lambda: polled() == expected, timeout=60, step=1), \
            (polled() if sidecar.poll() is None else None, (tmp_path / "sidecar.log").read_text()[-3000:])
        metrics = requests.get(base + "/metrics", timeout=5).text
        assert 'prefixcache_discovery_matched_nothing{source="prometheus"} 0.0' in metrics
        model = simulator.Replica("x", simulator.Scenario(), start=0).model_names[0]
        typo = requests.get(base + "/api/v1/analysis", params={"model": model, "version": "v-typo"}, timeout=5)
        assert typo.status_code == 200 and typo.json()["verdict"] != "pass" and typo.json()["error"], typo.text
        hook = requests.post(base + "/api/v1/analysis/flagger", timeout=5, json={
            "name": "vllm", "namespace": "llm", "phase": "Progressing", "metadata": {"model": model, "version": "v-typo"}})
        assert hook.status_code >= 400, hook.text  # Flagger takes any answer <= 202 as a pass
    finally:
        stop_all(sidecar, prom, fleet)


def test_two_namespaces_serving_one_model_with_their_own_versions_and_ratios_page_nothing(tmp_path):
    """Issue 54: staging's and prod's pod-template hashes of one model were compared as a
    rollout, and staging's own prompt paged critical ("49% on q4pbsphzf against 89% on
    ngq2cd9wf"). The central PodMonitor, applied in both namespaces as prometheus-operator
    applies it, labels each pod with its namespace and owner; a real Prometheus scrapes
    them; the exporter reads them from it and compares nothing across namespaces."""
    from exporter.sim import simulator
    from exporter.sim.server import Fleet

    docs = built_central()
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "vllm"]
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yml" in d.get("data", {})]
    config = yaml.safe_load(config_map["data"]["config.yml"])

    fleet = Fleet([], clock=time.time).start()
    now = time.time()
    # namespace -> pod -> (pod-template hash, scenario, process start): prod's long-running
    # Deployment and staging's, started later with a prompt of its own whose shared prefix is short
    pods = {"prod": {f"vllm-ngq2cd9wf-{s}": ("ngq2cd9wf", simulator.Scenario(), now - 1800) for s in ("abcde", "fghij")},
            "staging": {"vllm-q4pbsphzf-klmno": ("q4pbsphzf", simulator.Scenario(system_tokens=230), now - 900)}}
    scrapes = []
    for i, (namespace, mine) in enumerate(sorted(pods.items())):
        for j, (pod, (_, scenario, start)) in enumerate(mine.items()):
            fleet.add(simulator.Replica(pod, scenario, start=start, seed=10 * i + j))
        sd = tmp_path / f"{namespace}.json"
        sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{fleet.port}"], "labels": {
            "__metrics_path__": f"/{pod}/metrics", "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_pod_name": pod, "__meta_kubernetes_pod_container_name": "vllm",
            "__meta_kubernetes_pod_container_port_name": "http",
            "__meta_kubernetes_pod_controller_kind": "ReplicaSet", "__meta_kubernetes_pod_controller_name": f"vllm-{version}",
            _label_meta("app.kubernetes.io/name"): "vllm", _label_meta("pod-template-hash"): version}}
            for pod, (version, _, _) in mine.items()]))
        scrape = operator_scrape_config({**monitor, "metadata": {**monitor["metadata"], "namespace": namespace}}, sd)
        scrape.pop("metrics_path")  # each fake pod's path comes from its __metrics_path__
        scrapes.append(scrape)
    prom = Prometheus(tmp_path, scrapes)

    config["discovery"]["prometheus"]["url"] = None  # set once Prometheus has its port
    (tmp_path / "token").write_text("s3cret\n")
    config["deploys"]["api_token_file"] = str(tmp_path / "token")
    config["alertmanager"]["urls"] = [f"http://127.0.0.1:{free_port()}"]
    config.setdefault("global", {}).update(poll_interval="2s")
    config["discovery"]["refresh_interval"] = "1s"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    model = simulator.Replica("x", simulator.Scenario(), start=0).model_names[0]
    sidecar = None
    try:
        prom.start()
        config["discovery"]["prometheus"]["url"] = prom.url
        sidecar = run_sidecar(tmp_path, config, port)

        def families() -> dict:
            text = requests.get(base + "/metrics", timeout=5).text
            return {f.name: f.samples for f in text_string_to_metric_families(text)}

        def ratios() -> dict:
            """target -> (namespace, owner, version, its 1m hit ratio) as our /metrics label them."""
            return {s.labels["target"]: (s.labels.get("namespace"), s.labels.get("owner"), s.labels.get("version"), s.value)
                    for s in families().get("prefixcache_hit_ratio", []) if s.labels.get("window") == "1m"}

        expected = {pod: (namespace, "vllm", version) for namespace, mine in pods.items() for pod, (version, _, _) in mine.items()}
        assert wait_for(lambda: {t: r[:3] for t, r in ratios().items()} == expected, timeout=90, step=1), \
            (ratios() if sidecar.poll() is None else None, (tmp_path / "sidecar.log").read_text()[-3000:])
        # both sides measured, further apart than the drop rule's 25 points (staging above the 50% of
        # the absolute rule: the page this is about is the comparison's)
        measured = ratios()
        assert measured["vllm-ngq2cd9wf-abcde"][3] - measured["vllm-q4pbsphzf-klmno"][3] > 0.25, measured
        verdict = {}

        def judged() -> bool:
            verdict.update(requests.get(base + "/api/v1/analysis", params={"model": model, "version": "q4pbsphzf"}, timeout=5).json())
            return verdict["query_tokens"] >= config.get("analysis", {}).get("min_query_tokens", 20000)
        assert wait_for(judged, timeout=60, step=1), verdict
        assert verdict["verdict"] == "inconclusive" and "no baseline" in verdict["reason"], verdict
        assert verdict["scope"] == {"namespace": "staging", "owner": "vllm"} and verdict["error"] is None
        across = requests.get(base + "/api/v1/analysis", timeout=5,
                              params={"model": model, "version": "q4pbsphzf", "baseline": "ngq2cd9wf"}).json()
        assert across["verdict"] == "inconclusive" and "runs the baseline ngq2cd9wf" in across["reason"], across
        # the drop rule's `for` is 15 s: through four times that, no alert of any state (nor inconclusive), no rollout
        # on the status page
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            alerts = [s.labels for s in families().get("prefixcache_alert_state", [])]
            assert not alerts, alerts
            time.sleep(2)
        assert "Rollouts: versions side by side" not in requests.get(base + "/", timeout=5).text
    finally:
        stop_all(sidecar, prom, fleet)
