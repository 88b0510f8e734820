"""A real Prometheus (Debian's `prometheus`) for the benchmarks that put ours beside it:
started on 127.0.0.1 with a free port and a scratch TSDB, waited for, stopped."""
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import requests
import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def version() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not installed: apt-get install prometheus")
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).splitlines()[0]


class Prometheus:
    def __init__(self, scrape_configs: list, scrape_interval: str, scrape_timeout: str = "4s"):
        self.dir = Path(tempfile.mkdtemp(prefix="bench-prometheus-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = self.dir / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_timeout},
                                          "scrape_configs": scrape_configs}))
        self.log = open(self.dir / "prometheus.log", "w")
        self.proc = subprocess.Popen([shutil.which("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        log = (self.dir / "prometheus.log").read_text()[-2000:]
        self.stop()
        raise RuntimeError("prometheus did not become ready within 120 s: " + log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def up_targets(self) -> int:
        body = requests.get(self.url + "/api/v1/query", params={"query": "sum(up)"}, timeout=30).json()
        result = body["data"]["result"]
        return int(float(result[0]["value"][1])) if result else 0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
