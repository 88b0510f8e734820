"""Central mode an SRE can page with (issue 54), with the real binaries: simulated vLLM pods
scraped by a real Prometheus, the exporter reading them back from it (read_prometheus) as
its own process, and a real Alertmanager pair in a cluster delivering to a webhook.

- A restart of the exporter (SIGTERM, a new process on the same config) in the middle of
  an incident: the new process reads back what the rules look at and sends the same page
  (same labels, so the same alert in Alertmanager), which Alertmanager never resolves while
  the ratio is down, and the receiver is notified once for it.
- A pod removed from Prometheus's targets leaves without a TargetDown; one still listed
  whose scrapes fail (up == 0) gets one."""
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from exporter.sim import simulator
from exporter.sim.server import Fleet

from am import cluster_pair
from conftest import free_port, wait_for
from fakeserver import FakeServer, reply
from prom import Prometheus

ROOT = Path(__file__).resolve().parent.parent
MODEL = "demo/llama-3-8b"
DROP = "PrefixCacheHitRateDropAfterDeploy"
pytestmark = pytest.mark.slow


class Webhook:
    """The receiver: every notification, with when it came and which Alertmanager sent it."""

    def __init__(self):
        self.notifications: list[tuple[float, dict]] = []
        self.lock = threading.Lock()

    def __call__(self, h):
        with self.lock:
            self.notifications.append((time.time(), json.loads(h.body)))
        reply(h, 200, b"ok")

    def of(self, alertname: str) -> list[tuple[float, dict]]:
        with self.lock:
            return [(t, n) for t, n in self.notifications if n["groupLabels"].get("alertname") == alertname]


class Pods:
    """Simulated vLLM pods on one server, listed in a file_sd file as kubernetes_sd would
    list them (job vllm, namespace, pod), for a real Prometheus that scrapes them."""

    def __init__(self, path: Path, replicas: list):
        self.path = path
        self.fleet = Fleet(replicas, clock=time.time).start()
        self.listed = [r.name for r in replicas]
        self.write()

    def write(self) -> None:
        groups = [{"targets": [f"127.0.0.1:{self.fleet.port}"],
                   "labels": {"job": "vllm", "namespace": "llm", "pod": pod, "__metrics_path__": f"/{pod}/metrics"}}
                  for pod in self.listed]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.path)  # atomic, as a file_sd writer must be


class Exporter:
    """`python -m exporter run` in central mode, started and stopped as Kubernetes does."""

    def __init__(self, workdir: Path, config: dict):
        self.workdir, self.port = workdir, free_port()
        self.config = workdir / "exporter.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.proc, self.runs = None, 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"exporter-{self.runs}.log"

    def start(self) -> "Exporter":
        self.runs += 1
        self.proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={self.config}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=info"],
                                     cwd=ROOT, stderr=open(self.log, "w"))
        return self

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"the exporter did not stop within {timeout:.0f} s of SIGTERM")

    def alerts(self) -> list[dict]:
        return requests.get(self.url + "/api/v1/status", timeout=5).json().get("alerts", [])

    def targets(self) -> dict:
        return {t["name"]: t for t in requests.get(self.url + "/api/v1/status", timeout=5).json()["targets"]}

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""


def central_config(prom_url: str, am_urls: list[str], **extra) -> dict:
    """The central variant's config reading Prometheus (docs/kubernetes.md), at a
    test's pace: Prometheus scrapes every second and the exporter reads every second."""
    config = {
        "global": {"poll_interval": "1s", "jitter": "0s", "connect_timeout": "500ms", "read_timeout": "2s"},
        "discovery": {"target_limit": 0, "read_prometheus": {"url": prom_url, "match_labels": {"job": "vllm"},
                                                              "target_label": "pod", "timeout": "5s"}},
        "alertmanager": {"urls": am_urls, "resend_interval": "5s"},
    }
    for key, value in extra.items():
        config.setdefault(key, {}).update(value)
    return config


def am_alerts(am, alertname: str) -> list[dict]:
    """The alerts Alertmanager holds as active (not resolved) under `alertname`."""
    got = requests.get(am.url + "/api/v2/alerts", params={"filter": f'alertname="{alertname}"'}, timeout=5).json()
    return [a for a in got if a["status"]["state"] == "active"]


def _epoch(rfc3339: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


RESEND = 5.0  # alertmanager.resend_interval: each send's endsAt is 4 of them ahead (20 s)


INCIDENT_AFTER = 40.0  # seconds after the pods are first scraped: vllm-0's prompt gets a timestamp


@contextlib.contextmanager
def incident_with_an_alertmanager_pair(tmp_path: Path):
    """vllm-0 and vllm-1 scraped by a real Prometheus every second, vllm-0's prompt getting a
    timestamp INCIDENT_AFTER seconds in; two Alertmanagers in one cluster (joined before
    this yields) delivering to a webhook. Yields (started, prometheus, the pair, the webhook);
    everything is stopped after."""
    started = time.time()
    replicas = [simulator.Replica("vllm-0", simulator.incident(900.0 + INCIDENT_AFTER), start=started - 900.0, seed=1,
                                  model_names=[MODEL]),
                simulator.Replica("vllm-1", simulator.Scenario(), start=started - 900.0, seed=2, model_names=[MODEL])]
    pods = Pods(tmp_path / "pods.json", replicas)
    prom = Prometheus(tmp_path, [{"job_name": "vllm", "file_sd_configs": [{"files": [str(pods.path)], "refresh_interval": "1s"}]}])
    hook = Webhook()
    server = FakeServer({"/hook": hook}).__enter__()
    ams = cluster_pair(tmp_path, server.base + "/hook", peer_timeout="3s")
    try:
        prom.start()
        for am in ams:
            am.start()
        assert wait_for(lambda: all(len(requests.get(am.url + "/api/v2/status", timeout=5).json()["cluster"]["peers"]) == 2
                                    for am in ams), timeout=30, step=0.5), "the Alertmanagers did not join one cluster"
        yield started, prom, ams, hook
    finally:
        for am in ams:
            am.stop()
        prom.stop()
        server.__exit__(None, None, None)
        pods.fleet.stop()


def paging_config(prom, ams) -> dict:
    """A change point, as nobody announces the prompt's change; its reference window
    shortened to the history a test gives it (the rest as shipped)."""
    return central_config(prom.url, [am.url for am in ams], alertmanager={"resend_interval": f"{RESEND:g}s"},
                          rules={"change_point": {"reference": "30s"}})


def delivered(exporter: "Exporter") -> dict[str, float]:
    """Alertmanager -> the POSTs to it that succeeded, as the exporter counts them on its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    text = requests.get(exporter.url + "/metrics", timeout=5).text
    return {s.labels["alertmanager"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "prefixcache_alertmanager_notifications"
            for s in f.samples if s.name.endswith("_total") and s.labels.get("result") == "success"}


def firing(exporter: "Exporter", alertname: str = DROP) -> list[dict]:
    return [a for a in exporter.alerts() if a["alertname"] == alertname and a["state"] == "firing"]


def test_a_restart_of_the_central_exporter_mid_incident_keeps_the_one_page_firing_in_an_alertmanager_pair(tmp_path):
    """vllm-0's prompt gets a timestamp; the exporter pages (critical, prompt_prefix_change)
    to an Alertmanager pair; 2 s later it gets SIGTERM and a new process starts on the same
    config. The new process finds the page firing at its first evaluation (it reads back
    what its rules look at: no "pending" again) and re-sends it with the same labels, so
    both Alertmanagers hold one alert, active at every look over the restart and past the
    last endsAt the old process could have sent; the receiver got one notification of
    its group, from one of the pair, never a resolved one."""
    exporter = None
    with incident_with_an_alertmanager_pair(tmp_path) as (started, prom, ams, hook):
        try:
            exporter = Exporter(tmp_path, paging_config(prom, ams)).start()
            assert wait_for(lambda: firing(exporter), timeout=INCIDENT_AFTER + 90, step=0.5), exporter.tail()
            fired = time.time()
            (page,) = firing(exporter)
            labels = page["labels"]
            assert (labels["cause"], labels["severity"], labels["target"]) == ("prompt_prefix_change", "critical", "vllm-0"), labels
            assert wait_for(lambda: all(am_alerts(am, DROP) for am in ams), timeout=20, step=0.2), "the pair never held the page"
            assert wait_for(lambda: hook.of(DROP), timeout=30, step=0.2), "no notification reached the receiver"
            notified = time.time()

            # the restart, mid-incident (a rollout of the exporter, a node drain): SIGTERM, then
            # a new process on the same config and address
            time.sleep(2)
            stopped = time.time()
            assert exporter.stop() == 0, exporter.tail()
            exporter.start()
            looks, refired = 0, None
            last_old_ends = stopped + 4 * RESEND  # the latest endsAt the old process can have sent
            while time.time() < last_old_ends + 3 * RESEND:
                held = [am_alerts(am, DROP) for am in ams]
                looks += 1
                assert all(len(h) == 1 and h[0]["labels"] == labels for h in held), (time.time() - stopped, held, exporter.tail())
                if refired is None and wait_for(lambda: firing(exporter), timeout=0.01):
                    refired = time.time()
                time.sleep(0.5)
            assert refired is not None, exporter.tail()
            (again,) = firing(exporter)
            assert again["labels"] == labels
            # sent by the new process: an endsAt the old one cannot have sent
            assert all(_epoch(am_alerts(am, DROP)[0]["endsAt"]) > last_old_ends for am in ams)
            said = [line for line in exporter.log.read_text().splitlines() if f"alert={DROP}" in line]
            assert not [line for line in said if "state=pending" in line], said  # firing at its first evaluation
            notifications = hook.of(DROP)
            assert [n["status"] for _, n in notifications] == ["firing"], notifications  # once, by one of the pair
            print(f"fired {fired - started:.1f}s after the pods' first scrape, the receiver notified {notified - fired:.1f}s "
                  f"later; the new process firing {refired - stopped:.1f}s after SIGTERM; {looks} looks at both Alertmanagers "
                  f"over {time.time() - stopped:.0f}s")
        finally:
            if exporter is not None:
                exporter.stop()


def test_two_replicas_of_the_central_exporter_page_once_through_an_alertmanager_pair(tmp_path):
    """docs/kubernetes.md says two replicas would each send every alert and Alertmanager
    dedups them by their labels, none of which is the exporter's own. Two processes on one
    config read the same Prometheus: each fires the page with the same labels, each
    Alertmanager of the pair holds one alert of it, and the receiver is notified once.
    Then one replica is evicted (SIGTERM): the page stays, the other's sends keep it."""
    replicas = []
    with incident_with_an_alertmanager_pair(tmp_path) as (started, prom, ams, hook):
        try:
            for i in range(2):
                (tmp_path / f"replica-{i}").mkdir()
                replicas.append(Exporter(tmp_path / f"replica-{i}", paging_config(prom, ams)).start())
            assert wait_for(lambda: all(firing(r) for r in replicas), timeout=INCIDENT_AFTER + 90, step=0.5), \
                [r.tail() for r in replicas]
            pages = [firing(r)[0]["labels"] for r in replicas]
            assert pages[0] == pages[1] and pages[0]["cause"] == "prompt_prefix_change", pages
            assert wait_for(lambda: hook.of(DROP), timeout=30, step=0.2), "no notification reached the receiver"
            notified = time.time()
            # both delivered it, to both of the pair: the one notification is Alertmanager's dedup
            assert wait_for(lambda: all(len(d) == 2 and min(d.values()) >= 1 for d in map(delivered, replicas)), timeout=20, step=0.5), \
                [delivered(r) for r in replicas]
            assert replicas[0].stop() == 0, replicas[0].tail()  # evicted
            while time.time() < notified + 6 * RESEND:  # past the endsAt of the evicted one's last send, and the peers' timeout
                held = [am_alerts(am, DROP) for am in ams]
                assert all(len(h) == 1 and h[0]["labels"] == pages[0] for h in held), held
                time.sleep(0.5)
            assert [n["status"] for _, n in hook.of(DROP)] == ["firing"], hook.of(DROP)
            print(f"both replicas fired and delivered; one notification {notified - started:.1f}s after the pods' first scrape")
        finally:
            for r in replicas:
                r.stop()


TARGET_DOWN = "PrefixCacheTargetDown"


def test_a_pod_removed_from_prometheus_leaves_one_it_cannot_scrape_is_down_and_a_prometheus_that_lost_everything_downs_none(tmp_path):
    """Three pods scraped by a real Prometheus from a file_sd file. vllm-a's entry is removed
    (a rollout deleted the pod): it leaves the exporter, and no TargetDown is ever raised
    for it. vllm-b stays listed but answers 503 (up == 0): down, saying Prometheus cannot
    scrape it, and its TargetDown fires. Then Prometheus comes back with no data and no
    targets (a fresh volume, a broken config): its answers are success with no series at
    all, and vllm-c is kept as it was, up, with no TargetDown; the source says why."""
    started = time.time()
    replicas = [simulator.Replica(name, simulator.Scenario(), start=started - 900.0, seed=i, model_names=[MODEL])
                for i, name in enumerate(("vllm-a", "vllm-b", "vllm-c"))]
    pods = Pods(tmp_path / "pods.json", replicas)
    scrape = [{"job_name": "vllm", "file_sd_configs": [{"files": [str(pods.path)], "refresh_interval": "1s"}]}]
    prom = Prometheus(tmp_path, scrape)
    exporter, fresh = None, None
    downs: dict[str, set] = {}  # target -> the states its TargetDown was seen in

    def look() -> dict:
        for a in exporter.alerts():
            if a["alertname"] == TARGET_DOWN:
                downs.setdefault(a["labels"]["target"], set()).add(a["state"])
        return exporter.targets()

    try:
        prom.start()
        exporter = Exporter(tmp_path, central_config(prom.url, [], rules={"target_down": {"for": "5s"}})).start()
        assert wait_for(lambda: {n for n, t in look().items() if t["up"]} == {"vllm-a", "vllm-b", "vllm-c"}, timeout=60, step=0.5), \
            exporter.tail()

        t0 = time.time()
        pods.listed.remove("vllm-a")
        pods.write()  # Prometheus reads file_sd files as they change
        pods.fleet.down.add("vllm-b")  # still listed; its scrapes fail
        assert wait_for(lambda: "vllm-a" not in look(), timeout=60, step=0.5), exporter.tail()
        left = time.time() - t0
        assert wait_for(lambda: "firing" in downs.get("vllm-b", set()) | {a["state"] for a in exporter.alerts()
                                                                            if a["alertname"] == TARGET_DOWN and a["labels"]["target"] == "vllm-b"},
                        timeout=60, step=0.5), exporter.tail()
        b_fired = time.time() - t0
        targets = look()
        assert not targets["vllm-b"]["up"] and "Prometheus cannot scrape it (up == 0)" in targets["vllm-b"]["last_error"], targets["vllm-b"]
        assert targets["vllm-c"]["up"]
        assert "vllm-a" not in downs and "vllm-c" not in downs, downs
        assert "no longer scraped by Prometheus, removed: vllm-a" in exporter.log.read_text()

        # Prometheus comes back empty: a fresh data volume and no targets
        prom.stop()
        (tmp_path / "fresh").mkdir()
        empty = tmp_path / "fresh" / "none.json"
        empty.write_text("[]")
        fresh = Prometheus(tmp_path / "fresh", [{"job_name": "vllm", "file_sd_configs": [{"files": [str(empty)], "refresh_interval": "1s"}]}])
        fresh.port = prom.port  # the same Service
        fresh.start()
        t1 = time.time()

        def said_empty() -> bool:
            metrics = requests.get(exporter.url + "/metrics", timeout=5).text
            return ('prefixcache_discovery_last_refresh_successful{source="read_prometheus"} 0.0' in metrics
                    and "answered success with no series of any pod" in exporter.log.read_text())

        assert wait_for(said_empty, timeout=30, step=0.5), exporter.tail()
        while time.time() < t1 + 20:  # far past stale_after (3 s here) and TargetDown's `for` (5 s)
            targets = look()
            assert targets["vllm-c"]["up"], targets["vllm-c"]
            time.sleep(0.5)
        assert "vllm-c" not in downs and "vllm-a" not in downs, downs
        print(f"vllm-a left {left:.1f}s after its file_sd entry went; vllm-b's TargetDown fired {b_fired:.1f}s after its "
              f"scrapes began to fail; vllm-c kept up through {time.time() - t1:.0f}s of empty answers")
    finally:
        if exporter is not None:
            exporter.stop()
        if fresh is not None:
            fresh.stop()
        prom.stop()
        pods.fleet.stop()
