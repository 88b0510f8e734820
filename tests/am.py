"""Start the real Alertmanager binary (Debian's `prometheus-alertmanager`) on 127.0.0.1,
alone or as a peer of an HA cluster (--cluster.peer), as the operator runs its replicas."""
from pathlib import Path

import yaml

from conftest import free_port
from service import Service


class Alertmanager(Service):
    name = "prometheus-alertmanager"

    def __init__(self, workdir: Path, webhook_url: str, port: int | None = None, host: str = "127.0.0.1",
                 cluster_port: int | None = None, peers: tuple[int, ...] = (), peer_timeout: str = "15s"):
        """`cluster_port`: gossip on 127.0.0.1 there, joining the peers' cluster ports
        `peers`; each peer's place in the cluster waits peer_timeout before it notifies, and
        leaves out what another peer notified already (the notification log they gossip)."""
        super().__init__(workdir, port)
        self.host = host
        self.cluster_port, self.peers, self.peer_timeout = cluster_port, peers, peer_timeout
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname", "target"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
        }))

    def args(self) -> list[str]:
        common = [f"--config.file={self.config}", f"--storage.path={self.workdir / 'data'}",
                  f"--web.listen-address={self.host}:{self.port}"]
        if self.cluster_port is None:
            return common + ["--cluster.listen-address="]
        return common + [f"--cluster.listen-address=127.0.0.1:{self.cluster_port}",
                         f"--cluster.advertise-address=127.0.0.1:{self.cluster_port}",
                         f"--cluster.peer-timeout={self.peer_timeout}",
                         *(f"--cluster.peer=127.0.0.1:{p}" for p in self.peers)]


def cluster_pair(workdir: Path, webhook_url: str, peer_timeout: str = "15s") -> list[Alertmanager]:
    """Two Alertmanagers peered with each other (not started), each with a folder of its own."""
    ports = [free_port(), free_port()]
    pair = []
    for i, own in enumerate(ports):
        (workdir / f"am{i}").mkdir()
        pair.append(Alertmanager(workdir / f"am{i}", webhook_url, cluster_port=own, peers=(ports[1 - i],),
                                 peer_timeout=peer_timeout))
    return pair
