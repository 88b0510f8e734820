"""A real server binary (Prometheus, Alertmanager) on 127.0.0.1: started, waited for on
its /-/ready within a bound, and stopped."""
import subprocess
import time
from pathlib import Path

import requests

from conftest import free_port, require_binary


class Service:
    name = ""  # the binary
    host = "127.0.0.1"  # another loopback address (127.0.0.2) for a second one on the same port

    def __init__(self, workdir: Path, port: int | None = None):
        self.binary = require_binary(self.name)
        self.port = port or free_port()
        self.workdir = workdir
        self.proc = None
        self.log = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def args(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 30.0):
        self.log = open(self.workdir / f"{self.name}.log", "a")
        self.proc = subprocess.Popen([self.binary, *self.args()], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: " + (self.workdir / f"{self.name}.log").read_text()[-2000:])
            try:
                if requests.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} did not become ready in {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.log:
            self.log.close()
            self.log = None
