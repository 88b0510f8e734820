"""Start and query the real Prometheus binary (Debian's `prometheus`) on 127.0.0.1."""
import time
from pathlib import Path

import requests
import yaml

from service import Service


class Prometheus(Service):
    name = "prometheus"

    def __init__(self, workdir: Path, scrape_configs: list, rule_files: list | None = None, scrape_interval: str = "1s"):
        super().__init__(workdir)
        cfg = {"global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
               "scrape_configs": scrape_configs}
        if rule_files:
            cfg["rule_files"] = [str(p) for p in rule_files]
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(cfg))

    def args(self) -> list[str]:
        return [f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"]

    def query(self, expr: str, at: float | None = None) -> list:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = requests.get(self.url + "/api/v1/query", params=params, timeout=10)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {r.status_code} {body.get('error')}")
        return body["data"]["result"]

    def rules(self) -> list:
        r = requests.get(self.url + "/api/v1/rules", timeout=10)
        r.raise_for_status()
        return r.json()["data"]["groups"]

    def range_samples(self, selector: str, window: str, at: float) -> list:
        """The raw samples of a range selector at `at`: [{metric, values: [[t, "v"], ...]}]."""
        return self.query(f"{selector}[{window}]", at)

    def wait_for_history(self, selector: str, seconds: float, timeout: float) -> float:
        """Block until `selector` has samples reaching back `seconds`; returns now."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = time.time()
            result = self.range_samples(selector, "10m", now)
            if result and now - float(result[0]["values"][0][0]) >= seconds:
                return now
            time.sleep(2)
        raise AssertionError(f"prometheus did not collect {seconds} s of {selector} within {timeout} s")
