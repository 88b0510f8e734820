"""Warm-up after a (re)start: send configured chat requests (max_tokens 1) to the local
vLLM so the common prompt prefixes are cached before traffic arrives, and hold
`/-/ready` at not-ready until that is done, so Kubernetes routes nothing to a cold pod."""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import requests

from ..config.sections import WarmupConfig
from ..serve.state import WarmupStatus

log = logging.getLogger(__name__)




def request_body(body: dict) -> dict:
    """One token is enough to prefill and cache the prompt."""
    out = dict(body)
    out["max_tokens"] = 1
    out.pop("max_completion_tokens", None)
    out["stream"] = False
    return out


class Warmer:
    def __init__(self, cfg: WarmupConfig, clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.clock = clock
        self.status = WarmupStatus()
        self.lock = threading.Lock()
        self.session = requests.Session()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def trigger(self, reason: str) -> bool:
        """Start a warm-up in the background unless one is running. Returns whether it started."""
        if not self.cfg.enabled:
            return False
        with self.lock:
            if self.status.running:
                return False
            self.status.running, self.status.done = True, False
        log.info("warm-up: starting %d request(s) after %s", len(self.cfg.requests), reason)
        self._thread = threading.Thread(target=self._run, name="warmup", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        start = time.monotonic()
        failed = 0
        try:
            with ThreadPoolExecutor(max_workers=max(1, self.cfg.concurrency)) as pool:
                for result in pool.map(self._send, self.cfg.requests):
                    with self.lock:
                        self.status.results[result] = self.status.results.get(result, 0) + 1
                    failed += result != "success"
        finally:
            with self.lock:
                self.status.running, self.status.done = False, True
                self.status.runs += 1
                self.status.last_duration = time.monotonic() - start
                self.status.last_finished = self.clock()
                self.status.last_failed = failed
            log.info("warm-up: finished %d request(s) in %.1fs, %d failed", len(self.cfg.requests), time.monotonic() - start, failed)

    def _send(self, body: dict) -> str:
        if self._stop.is_set():
            return "cancelled"
        try:
            resp = self.session.post(self.cfg.url, json=request_body(body), timeout=(min(5.0, self.cfg.timeout), self.cfg.timeout))
        except requests.Timeout:
            return "timeout"
        except requests.RequestException:
            return "connection_error"
        return "success" if resp.status_code == 200 else "http_error"

    def ready(self) -> tuple[bool, str]:
        if not (self.cfg.enabled and self.cfg.gate_readiness):
            return True, ""
        with self.lock:
            if self.status.done:
                return True, ""
            return False, "warm-up running" if self.status.running else "waiting for vLLM to start before warming up"

    def snapshot(self) -> WarmupStatus:
        with self.lock:
            return WarmupStatus(self.status.runs, self.status.running, self.status.done, dict(self.status.results),
                                self.status.last_duration, self.status.last_finished, self.status.last_failed)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.session.close()
