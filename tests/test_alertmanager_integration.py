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
