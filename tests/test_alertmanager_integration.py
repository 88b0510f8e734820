"""The demo's alert through a real Alertmanager to a webhook: it arrives with its labels
and annotations, and later resolves; with Alertmanager down for a while, it still arrives."""
import json
import subprocess
import sys
import threading
import time

import pytest

from am import Alertmanager
from conftest import free_port, wait_for
from fakeserver import FakeServer, reply

pytestmark = pytest.mark.slow
ALERT = "PrefixCacheHitRateDropAfterDeploy"


class Webhook:
    def __init__(self):
        self.notifications = []
        self.lock = threading.Lock()

    def __call__(self, h):
        with self.lock:
            self.notifications.append(json.loads(h.body))
        reply(h, 200, b"ok")

    def alerts(self, status):
        with self.lock:
            return [a for n in self.notifications for a in n["alerts"] if a["labels"].get("alertname") == ALERT and a["status"] == status]




def demo(am_url, duration):
    return subprocess.Popen([sys.executable, "-m", "exporter", "demo", f"--duration={duration}",
                             f"--web.listen-address=127.0.0.1:{free_port()}", f"--alertmanager.url={am_url}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_demo_alert_arrives_with_labels_and_annotations_then_resolves(tmp_path):
    hook = Webhook()
    with FakeServer({"/hook": hook}) as server:
        am = Alertmanager(tmp_path, server.base + "/hook").start()
        proc = demo(am.url, 60)
        try:
            assert wait_for(lambda: hook.alerts("firing"), 90), "no firing alert reached the webhook"
            firing = hook.alerts("firing")[0]
            labels, annotations = firing["labels"], firing["annotations"]
            assert labels["cause"] == "prompt_prefix_change" and labels["severity"] == "critical"
            assert labels["target"] in ("vllm-0", "vllm-1") and labels["model_name"] == "demo/llama-3-8b"
            assert "v42" in annotations["summary"] and "runbook_url" in annotations and "description" in annotations
            assert wait_for(lambda: hook.alerts("resolved"), 90), "the alert never resolved"
        finally:
            out = proc.communicate(timeout=120)[0]
            am.stop()
        assert proc.returncode == 0, out


def test_an_alertmanager_outage_still_delivers_the_alert(tmp_path):
    hook = Webhook()
    with FakeServer({"/hook": hook}) as server:
        am = Alertmanager(tmp_path, server.base + "/hook")  # not started: it is "down"
        proc = demo(am.url, 70)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            # the demo's alert fires while nobody listens; Alertmanager comes up later
            assert wait_for(lambda: any("ALERT FIRING " + ALERT in l for l in list(lines)), 90), "".join(lines[-20:])
            time.sleep(3)
            am.start()
            assert wait_for(lambda: hook.alerts("firing") or hook.alerts("resolved"), 60), "the alert was lost in the outage"
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            reader.join(10)
            am.stop()


# --- one identity per pod, inhibitions scoped to it ------------------------------------------------
ROOT = __import__("pathlib").Path(__file__).parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "kubernetes"


def _inhibited(am_url, alerts: dict, want: set, seconds=20) -> dict:
    """Posts `alerts` (name -> labels) to a real Alertmanager and waits until the set of
    inhibited ones is `want` (or the time is up): name -> inhibited."""
    import requests
    alerts = {name: {k: v for k, v in labels.items() if v} for name, labels in alerts.items()}  # as Alertmanager keeps them
    r = requests.post(am_url + "/api/v2/alerts", json=[{"labels": labels} for labels in alerts.values()], timeout=5)
    assert r.status_code == 200, r.text

    def states():
        got = requests.get(am_url + "/api/v2/alerts", timeout=5).json()
        by_labels = {tuple(sorted(a["labels"].items())): bool(a["status"]["inhibitedBy"]) for a in got}
        return {name: by_labels.get(tuple(sorted(labels.items()))) for name, labels in alerts.items()}

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and ({n for n, i in states().items() if i} != want or None in states().values()):
        time.sleep(0.5)
    return states()


def _attached_config(tmp_path, monkeypatch, pod, namespace):
    """The attach components' config as the 5-minute recipe builds it, loaded in a pod
    the downward API named `pod` in `namespace`."""
    import yaml

    from test_manifests import RECIPES, USER_VLLM, build_overlay, load
    tmp_path.mkdir()
    docs = build_overlay(tmp_path, own=(str(USER_VLLM),), namespace=namespace, **RECIPES["five-minutes-attach-sidecar"])
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yml" in d.get("data", {})]
    monkeypatch.setenv("POD_NAME", pod)
    monkeypatch.setenv("POD_NAMESPACE", namespace)
    return load(yaml.safe_load(cm["data"]["config.yml"]))


def _sidecar_alerts(config, scenario, down: bool):
    """The engine of one attached sidecar on a simulated vLLM: its firing alerts' labels,
    as exporter.notify.alertmanager sends them."""
    from exporter.notify.alertmanager import payload
    from exporter.monitor.engine import Engine
    from exporter.sim.simulator import Replica
    from exporter.parse.vllm_metrics import parse
    engine = Engine(config)
    (target,) = config.targets
    start = 10_000.0
    replica = Replica(target.name, scenario, start=start - 900.0, seed=1)
    t = start
    while t <= start + 900:
        replica.advance(t)
        if down and t > start + 300:
            engine.ingest_failure(target.name, t)
        else:
            engine.ingest(target.name, t, parse(replica.render()))
        engine.evaluate(t)
        t += 5.0
    return {a.alertname: payload(a, time.time(), 60.0, "")["labels"] for a in engine.firing()}


def test_one_pods_target_down_never_silences_another_pods_alerts(tmp_path, monkeypatch):
    """Every attached sidecar named its target `vllm`: with the example's `equal: [target]`
    one pod's PrefixCacheTargetDown silenced every other pod's hit-rate alerts, in other
    namespaces too. Now a target is its pod, with its namespace."""
    from exporter.sim.simulator import Event, Scenario
    broken = Scenario(events=(Event(900 + 10, "hits_broken", True),))
    down = _sidecar_alerts(_attached_config(tmp_path / "a", monkeypatch, "vllm-7d9c-a", "llm"), Scenario(), down=True)
    stuck = _sidecar_alerts(_attached_config(tmp_path / "b", monkeypatch, "vllm-7d9c-b", "llm"), broken, down=False)
    elsewhere = _sidecar_alerts(_attached_config(tmp_path / "c", monkeypatch, "vllm-7d9c-a", "staging"), broken, down=False)
    assert "PrefixCacheTargetDown" in down and "PrefixCacheHitsStuckAtZero" in stuck
    assert stuck["PrefixCacheHitsStuckAtZero"]["target"] != down["PrefixCacheTargetDown"]["target"]
    same_pod = dict(stuck["PrefixCacheHitsStuckAtZero"], **{k: down["PrefixCacheTargetDown"][k] for k in ("target", "namespace")})
    alerts = {"down": down["PrefixCacheTargetDown"], "other-pod": stuck["PrefixCacheHitsStuckAtZero"],
              "same-name-other-namespace": elsewhere["PrefixCacheHitsStuckAtZero"], "same-pod": same_pod}
    am = Alertmanager(tmp_path, "http://127.0.0.1:9/unused")
    am.config.write_text((ROOT / "alerts" / "alertmanager.example.yml").read_text())
    am.start()
    try:
        states = _inhibited(am.url, alerts, {"same-pod"})
    finally:
        am.stop()
    assert states == {"down": False, "other-pod": False, "same-name-other-namespace": False, "same-pod": True}


def _relayed(series: dict) -> dict:
    """What the relay PrometheusRule (components/relay) makes of one firing
    prefixcache_alert_state series: the labels of the alert of the rule that selects it
    (Prometheus names an alert after its rule and adds the rule's labels)."""
    import re

    import yaml
    rule_doc = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "components" / "relay" / "prometheusrule-relay.yaml").read_text())
    rules = [r for g in rule_doc["spec"]["groups"] for r in g["rules"]]
    for rule in rules:
        wanted = re.search(r'alertname="([^"]+)"', rule["expr"])
        if wanted is None or wanted.group(1) == series["alertname"]:
            labels = {k: v for k, v in series.items() if k != "__name__"}
            labels.update({k: v.replace("{{ $labels.severity }}", series["severity"]) for k, v in rule.get("labels", {}).items()})
            labels["alertname"] = rule["alert"]
            return labels
    raise AssertionError(f"no relay rule for {series['alertname']}")


def test_relayed_alerts_keep_their_names_so_kube_prometheus_stacks_inhibitions_keep_models_apart(tmp_path):
    """Relayed as one alertname, model A's critical alert silenced model B's warning
    under kube-prometheus-stack's default `critical inhibits warning, equal namespace and
    alertname`."""
    scraped = {"__name__": "prefixcache_alert_state", "job": "vllm-prefix-cache-exporter", "namespace": "llm", "state": "firing"}
    a = _relayed({**scraped, "pod": "llama-0", "target": "llama-0", "alertname": "PrefixCacheHitRateDropAfterDeploy",
                  "model_name": "llama", "severity": "critical", "cause": "prompt_prefix_change"})
    b = _relayed({**scraped, "pod": "qwen-0", "target": "qwen-0", "alertname": "PrefixCachingDisabled",
                  "model_name": "qwen", "severity": "warning", "cause": "caching_disabled"})
    assert a["alertname"] == "PrefixCacheHitRateDropAfterDeploy" and b["alertname"] == "PrefixCachingDisabled"
    am = Alertmanager(tmp_path, "http://127.0.0.1:9/unused")
    am.config.write_text((FIXTURES / "kube-prometheus-stack-alertmanager.yml").read_text())
    am.start()
    try:
        states = _inhibited(am.url, {"a": a, "b": b, "b-again": dict(b, severity="info")}, {"b-again"})
    finally:
        am.stop()
    # the rule still works where it should: a warning of the same alert silences its info
    assert states == {"a": False, "b": False, "b-again": True}


def test_two_alertmanagers_behind_one_name_both_receive_every_alert(tmp_path):
    """An HA Alertmanager behind a headless Service (kube-prometheus-stack's
    alertmanager-operated): two real Alertmanagers on one port of two loopback addresses,
    one name that resolves to both (the resolver is the only stand-in: no DNS here). Each
    gets the alert firing, then resolved; neither gossips (no cluster), so each holds only
    what it was sent."""
    import requests

    from exporter.alerting.rules_state import FIRING, RESOLVED, Alert, Transition
    from exporter.config.sections import AlertmanagerConfig
    from exporter.notify.alertmanager import Notifier

    port = free_port()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ams = [Alertmanager(tmp_path / "a", "http://127.0.0.1:9/unused", port=port, host="127.0.0.1"),
           Alertmanager(tmp_path / "b", "http://127.0.0.1:9/unused", port=port, host="127.0.0.2")]
    labels = (("alertname", ALERT), ("cause", "prompt_prefix_change"), ("model_name", "m"), ("namespace", "llm"),
              ("severity", "critical"), ("target", "vllm-0"))
    firing = Alert(ALERT, "vllm-0", "m", state=FIRING, active_at=time.time() - 30, fired_at=time.time() - 15, labels=labels,
                   annotations=(("summary", "dropped"),))
    resolver = lambda host, p: ["127.0.0.1", "127.0.0.2"] if host == "alertmanager-operated.monitoring.svc" else []  # noqa: E731
    cfg = AlertmanagerConfig(urls=(f"http://alertmanager-operated.monitoring.svc:{port}",), resend_interval=60.0, timeout=5.0,
                             refresh_interval=1.0)

    def states():
        out = []
        for am in ams:
            got = requests.get(am.url + "/api/v2/alerts", params={"active": "true", "silenced": "true", "inhibited": "true"}, timeout=5).json()
            out.append({a["status"]["state"] for a in got if a["labels"].get("alertname") == ALERT})
        return out

    notifier = None
    try:
        for am in ams:
            am.start()
        notifier = Notifier(cfg, "http://sidecar:9464/", resolve=resolver).start()
        notifier.transitions([Transition(time.time(), firing, FIRING)])
        assert wait_for(lambda: notifier.discovered() == 2, 10)
        notifier.resend([firing])  # the next evaluation's resend reaches the Alertmanagers found since
        assert wait_for(lambda: states() == [{"active"}, {"active"}], 20), states()
        assert [s.url for s in notifier.stats()] == [f"http://127.0.0.{i}:{port}/api/v2/alerts" for i in (1, 2)]
        gone = Alert(ALERT, "vllm-0", "m", state="inactive", active_at=firing.active_at, fired_at=firing.fired_at,
                     resolved_at=time.time(), labels=labels)
        notifier.transitions([Transition(time.time(), gone, RESOLVED)])
        assert wait_for(lambda: states() == [set(), set()], 20), states()  # resolved in both: no longer active
    finally:
        if notifier is not None:
            notifier.stop(2.0)
        for am in ams:
            am.stop()
