"""Start the real Alertmanager binary (Debian's `prometheus-alertmanager`) on 127.0.0.1."""
import subprocess
import time
from pathlib import Path

import requests
import yaml

from conftest import free_port, require_binary


class Alertmanager:
    def __init__(self, workdir: Path, webhook_url: str, port: int | None = None):
        self.binary = require_binary("prometheus-alertmanager")
        self.port = port or free_port()
        self.workdir = workdir
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname", "target"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
        }))
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Alertmanager":
        self.log = open(self.workdir / "alertmanager.log", "a")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.config}", f"--storage.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("alertmanager exited: " + (self.workdir / "alertmanager.log").read_text()[-2000:])
            try:
                if requests.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise RuntimeError("alertmanager did not become ready in 30 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if getattr(self, "log", None):
            self.log.close()
