"""Start the real Alertmanager binary (Debian's `prometheus-alertmanager`) on 127.0.0.1."""
from pathlib import Path

import yaml

from service import Service


class Alertmanager(Service):
    name = "prometheus-alertmanager"

    def __init__(self, workdir: Path, webhook_url: str, port: int | None = None, host: str = "127.0.0.1"):
        super().__init__(workdir, port)
        self.host = host
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname", "target"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
        }))

    def args(self) -> list[str]:
        return [f"--config.file={self.config}", f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address={self.host}:{self.port}", "--cluster.listen-address="]
